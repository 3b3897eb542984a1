"""Grader for exercise ``ring_reduce_scatter``.

Signature: ``program(comm, x) -> array``. ``x`` is this rank's float64 vector
(every rank's has the same length L, which need not divide by N). Rank r
returns chunk r of the element-wise sum of all ranks' ``x``, the chunks cut as
``numpy.array_split(sum, N)`` cuts them (the first L % N chunks one longer).

Checks, on world sizes 1 to 8 and several lengths, with fresh random data:

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. rank r returns chunk r of the sum, a plain float64 array, exact up to
   rounding (wrong sums are diagnosed:
   which ranks' contributions are missing or counted twice, or which chunk
   a rank holds instead, and the first message that went wrong);
3. it is a ring: messages only between ring neighbours;
4. one chunk per message (at most ceil(L/N) elements), never the whole vector;
5. exactly N-1 steps, and every rank sends one and receives one message
   in every step;
6. total bytes (N-1) L * 8: every chunk crosses N-1 links;
7. every message at step s carries one chunk summed over exactly the
   sender's and the s-1 previous ranks' contributions (read from the recorded
   payloads, in the simulator; random float data, see ``ringlab.sums``).

Any correct ring ReduceScatter passes: either direction, send/recv or
isend/irecv or sendrecv, in place or not, labelled or not. Checks 4-7 apply
when L >= N (shorter vectors have empty chunks, which a program may skip).
"""

import numpy as np

from ... import sums
from ..kit import checks, contributions as contrib, reductions
from ..kit.reductions import (chunk_sizes, chunk_slices, decoded_messages, right_messages_wrong_result,
                              wrong_values)
from ..kit.reductions import ring_cases
from ..kit.report import Failure
from ..kit.running import plain_array, run_case

NAME = "ring_reduce_scatter"
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
# The same worlds and vectors as ring_allreduce's grader (a reduce-scatter is its first half).
cases = ring_cases
CENTRAL = "a central reduction through one rank (its link carries N-1 whole vectors)"


def check(program, case, backend="sim"):
    n, length = case.world_size, len(case.inputs[0])
    result, failure = run_case(program, case, backend)
    if failure:
        return checks.steps_before_failure(
            failure, n - 1, f"a ring ReduceScatter takes N-1 = {n - 1}",
            "Count your loop first: it must run world_size - 1 times, one chunk per step.")
    want = np.array_split(np.sum(case.inputs, axis=0), n)
    for r, out in enumerate(result.outputs):
        failure = _check_shape(case, r, out, want[r], length)
        if failure:
            return failure
    mine = chunk_slices(length, n)
    for r, out in enumerate(result.outputs):
        if not sums.holds(out, case.inputs, range(n), mine[r]):
            return (checks.off_ring(result.trace, case, "ring ReduceScatter", CENTRAL, r)
                    or _wrong_sum(program, case, r, out, want[r], result))
    return _check_trace(result, case, length)


def _check_trace(result, case, length):
    """Checks 3-7."""
    n = case.world_size
    failure = checks.ring_neighbours(result.trace, case, "ring ReduceScatter", CENTRAL)
    if failure or length < n:
        return failure
    trace = result.trace
    return (checks.one_chunk_per_message(trace, case, length)
            or checks.exact_steps(
                trace, case, n - 1, check="exactly N-1 steps",
                expected=f"{n} - 1 = {n - 1} steps: a chunk collects one contribution per link",
                hint="Loop world_size - 1 times. (A ReduceScatter is the first half of a ring "
                     "AllReduce: no all-gather phase.)")
            or checks.one_send_one_recv_per_step(trace, case, n - 1)
            or checks.total_bytes(
                trace, case, (n - 1) * length * 8,
                expected=f"(N-1) * L * 8 = {(n - 1) * length * 8} bytes (every chunk crosses N-1 links)",
                hint="Send each chunk exactly as np.array_split makes it.")
            or reductions.ring_partial_sums(result, case, length, "ring ReduceScatter"))


def _check_shape(case, r, out, want, length):
    failure = plain_array(case, f"rank {r}", out, f"chunk {r} of the sum, shape {want.shape}")
    if failure:
        return failure
    if not isinstance(out, np.ndarray):
        return Failure(case.label, "every rank returns its result", f"rank {r} returned {type(out).__name__}",
                       expected=f"a numpy array: chunk {r} of the sum, shape {want.shape}",
                       got=repr(out)[:200], hint="End your program with `return` of your chunk.")
    if out.shape != want.shape:
        n = case.world_size
        whole = out.shape == (length,) and length != len(want)
        sizes = chunk_sizes(length, n)
        if whole:
            hint = "Return only your own chunk: np.array_split(vector, world_size)[rank]."
        else:
            hint = (f"Cut the chunks as np.array_split(x, world_size) does: with L = {length} and N = {n} "
                    f"they have {_listing(sizes)} elements, so chunk {r} has {len(want)}.")
            if length % n and out.shape == (length // n,):
                hint += (f" Chunks of len(x) // N = {length // n} elements assume the length divides by N; "
                         f"np.array_split makes the first L % N = {length % n} chunk{'s' if length % n > 1 else ''} "
                         f"one element longer.")
        return Failure(case.label, "every rank returns its result",
                       f"rank {r} returned an array of shape {out.shape}"
                       + (" (the whole vector)" if whole else ""),
                       expected=f"shape {want.shape}: chunk {r} of np.array_split(sum, {case.world_size})",
                       got=f"shape {out.shape}", hint=hint)
    return None


def _chunk_of(starts, pos):
    """The chunk that element ``pos`` of the vector is in; ``starts``: where each chunk starts."""
    return int(np.searchsorted(starts, pos, side="right") - 1)


def _listing(items):
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _wrong_sum(program, case, rank, out, want, result):
    """Explain a wrong chunk exactly, using the contribution probe."""
    n, length = case.world_size, len(case.inputs[0])
    fail = wrong_values(case, rank, out, sums.close(out, case.inputs, range(n), chunk_slices(length, n)[rank]),
                        want, "rank r ends with chunk r of the sum of all inputs")
    fail.what += " of its chunk"
    shown = fail.expected, fail.got
    right = length >= n and result.payloads is not None and not _check_trace(result, case, length)
    res = contrib.probe_run(program, n, length)
    if res is None:
        return _right_messages(fail, result, shown) if right else fail
    starts = np.cumsum([0] + chunk_sizes(length, n))
    ones = (1,) * n
    decoded = [contrib.decode(o, n) if isinstance(o, np.ndarray) else [] for o in res.outputs]
    # 1. The first element that is not "every rank's contribution, once".
    for r, dec in enumerate(decoded):
        j = next((j for j, d in enumerate(dec) if d is None or d[0] != ones), None)
        if j is not None:
            if dec[j] is None:
                fail.what = f"world_size {n}: rank {r}, element {j} of its chunk is not a sum of inputs"
            else:
                fail.what = f"world_size {n}: rank {r}, element {j} of its chunk: {contrib.describe(dec[j][0], ones)}"
                fail.expected = "every element: each rank's contribution exactly once"
                fail.got = f"contributions of {contrib.holders(dec[j][0])}"
            break
    # 2. Complete sums, but of the wrong chunk? (the position part of the probe says which)
    held = [_chunk_of(starts, dec[0][1])
            if dec and all(d is not None and d[0] == ones for d in dec) and dec[0][1] is not None else None
            for dec in decoded]
    if all(h is not None for h in held) and held != list(range(n)):
        r = next(r for r in range(n) if held[r] != r)
        fail.what = f"world_size {n}: rank {r} ends with the sum of chunk {held[r]}, not of chunk {r}"
        fail.expected, fail.got = f"rank r holds chunk r: {list(range(n))}", f"chunks held: {held}"
        fail.hint = ("Each rank ends with the chunk it adds into in the last step. Ring AllReduce's "
                     "first phase leaves chunk (r + 1) % N on rank r; here rank r must end with chunk r: "
                     "start one chunk earlier, sending chunk (rank - 1 - k) % N at step k."
                     if held == [(r + 1) % n for r in range(n)] else
                     "Each rank ends with the chunk it adds into in the last step: work backwards "
                     "from 'rank r adds into chunk r at step N-1'.")
        return fail
    note, hint = _first_bad_message(res, n, decoded)
    if note:
        fail.what += "\nFirst went wrong: " + note
    elif n > 1:
        hint = _completes_other_chunk(res, n, starts)
    if right and hint is None:
        return _right_messages(fail, result, shown)
    fail.hint = hint or ("Write down, for N=3, which chunk each rank sends and receives at each step, "
                         "and compare with your index formulas.")
    return fail


def _right_messages(fail, result, shown):
    """Every message was right: only the value returned is wrong."""
    return right_messages_wrong_result(fail, result, "Return your chunk r after the last step.", shown)


def _completes_other_chunk(res, n, starts):
    """A hint when the messages are right but rank r completes a chunk other than r:
    the last message rank r receives holds every contribution but its own, for
    the chunk it then completes."""
    completes = {}
    for e in res.trace:
        payload = res.payload(e)
        dec = contrib.decode(payload, n) if e.step == n - 1 and payload.size else None
        if dec and dec[0] is not None and dec[0][1] is not None and not dec[0][0][e.dst]:
            completes[e.dst] = (_chunk_of(starts, dec[0][1]), e, dec)
    if len(completes) != n or all(completes[r][0] == r for r in range(n)):
        return None
    c, e, dec = completes[0]
    what = (f"Here the last message rank 0 received, at step {e.step}, carried chunk {c} with the "
            f"contributions of {contrib.holders(dec[0][0])}, "
            f"so rank 0 completes chunk {c}, not chunk 0.")
    if all(completes[r][0] == (r + 1) % n for r in range(n)):
        return ("Rank r must end with chunk r. With ring AllReduce's indices (send chunk (rank - k) % N, "
                "add into (rank - k - 1) % N) the chunk that ends complete on rank r is chunk (r + 1) % N. "
                + what + " Start one chunk earlier: at step k send chunk (rank - 1 - k) % N and add the "
                "received one into chunk (rank - 2 - k) % N.")
    return ("Rank r must end with chunk r, the chunk it adds into in the last step; " + what
            + " Work backwards from 'rank r adds into chunk r at step N-1'.")


SLOT_HINT = ("The chunk you receive at step k is the one your left neighbour sent at step k: "
             "compute its index from the neighbour's rank, not from your own.")


def _first_bad_message(res, n, outputs):
    """In a ring ReduceScatter the message of step s carries s contributions, each
    once, for one contiguous range of positions. Find the first that doesn't.
    ``outputs``: the decoded outputs, to tell a lost addition from a lost forward."""
    for e, dec in decoded_messages(res, n):
        problem = contrib.garbled(e, dec, SLOT_HINT)
        if problem:
            return problem
        for coeffs, _ in dec:
            if max(coeffs) > 1:
                return (f"step {e.step}: rank {e.src} sent rank {e.dst} a chunk in which "
                        f"{contrib.describe(coeffs, tuple(int(c > 0) for c in coeffs))}",
                        "A contribution is added twice: check which chunk index you send and which "
                        "you add into.")
            if sum(coeffs) != e.step:
                note = ""
                if coeffs[e.src]:
                    hint = "The chunk a rank sends at step k+1 must be the one it added into at step k."
                elif _adds_own(outputs, e.src):
                    # It adds (its result holds its own part), but passed on what it had received.
                    came = _received_as_is(res, n, e, dec)
                    note = (f", exactly what it had received from rank {came.src} at step {came.step}"
                            if came else "")
                    hint = (f"Rank {e.src} adds correctly (its result holds its own contribution), but it "
                            f"passed on a chunk without it: forward the chunk after adding your "
                            f"contribution, the slot you just added into, not the array you received.")
                else:
                    hint = (f"Rank {e.src}'s own contribution is gone: add the received chunk into yours "
                            f"(chunk += received); replacing it drops yours.")
                return (f"step {e.step}: rank {e.src} sent rank {e.dst} a chunk holding {sum(coeffs)} "
                        f"contribution(s) ({contrib.holders(coeffs)}){note}; at step {e.step} a ring "
                        f"ReduceScatter message holds {e.step}", hint)
    return None, None


def _adds_own(outputs, r):
    """Whether rank r's decoded result holds rank r's own contribution."""
    return r < len(outputs) and any(d is not None and d[0][r] for d in outputs[r])


def _received_as_is(res, n, e, dec):
    """An earlier message into ``e.src`` with the same content as ``e``'s, or None."""
    for g in res.trace:
        if g.dst == e.src and g.step < e.step and contrib.decode(res.payload(g), n) == dec:
            return g
    return None
