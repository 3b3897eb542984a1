"""Grader for exercise ``ring_allreduce``.

Signature: ``program(comm, x) -> array``. ``x`` is this rank's float64 vector
(every rank's has the same length, which need not divide by world_size);
every rank returns the element-wise sum of all ranks' ``x``.

Checks, on world sizes 1 to 8 and several lengths, with fresh random data:

1. it runs: no exception, deadlock, endless loop or unreceived message, and
   it leaves numpy, the builtins and ringlab as they were (in the self-check
   the grader shares their process); a check that trips over what the run
   produced is a failure too, never a crash of the grader;
2. every rank returns the sum, a plain float64 array, exact up to rounding
   (wrong sums are diagnosed: which ranks' contributions are missing or
   counted twice, where, and from which step; or, when every message was
   right, that only the value returned is wrong);
3. it is a ring: messages only between ring neighbours;
4. one chunk per message (at most ceil(L/N) elements), never the whole vector;
5. exactly 2(N-1) steps, and every rank sends one and receives one message
   in every step;
6. total bytes equal those of the bandwidth-optimal algorithm: 2(N-1) L * 8;
7. every message carries what the ring has at that step: one chunk, summed
   over exactly the sender's and the s-1 previous ranks' contributions at
   step s of the reduce-scatter, over all N in the all-gather (read from the
   recorded payloads, in the simulator).

The data are random floats (see ``ringlab.sums``): nothing can travel in fewer
bytes than the algorithm sends, and every partial sum says whose
contributions it holds; sums are compared up to their rounding.

Any correct ring AllReduce passes: either direction, any chunk numbering,
send/recv or isend/irecv or sendrecv, in place or not, labelled or not.
Checks 4-7 apply when the length is at least N (shorter vectors have empty
chunks, which a program may skip).
"""

import numpy as np

from ... import sums
from ..kit import checks, contributions as contrib, reductions
from ..kit.reductions import right_messages_wrong_result, wrong_values
from ..kit.report import numbers
from ..kit.running import check_outputs_shape, run_case

NAME = "ring_allreduce"
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True


cases = reductions.ring_cases
CENTRAL = "a central reduction through one rank (its link carries 2(N-1) whole vectors)"


def check(program, case, backend="sim"):
    state = checks.module_state()
    result, failure = run_case(program, case, backend)
    # A program that replaced numpy's (or ringlab's) functions in this process would
    # have the checks below computed with them: name that, and put them back.
    patched = checks.patched_modules(state, case)
    if patched:
        return patched
    try:
        return _check(program, case, result, failure)
    except Exception as exc:   # noqa: BLE001 - a learner's run is graded, it never crashes the grader
        return checks.check_crashed(case, exc)


def _check(program, case, result, failure):
    n, length = case.world_size, len(case.inputs[0])
    if failure:
        return checks.steps_before_failure(
            failure, 2 * (n - 1), f"a ring AllReduce takes 2(N-1) = {2 * (n - 1)}",
            "Count your loops first: each phase runs world_size - 1 times.")
    failure = check_outputs_shape(result, case, (length,))
    if failure:
        return failure
    everyone = range(n)
    for r, out in enumerate(result.outputs):
        if not sums.holds(out, case.inputs, everyone):
            return (checks.off_ring(result.trace, case, "ring AllReduce", CENTRAL, r)
                    or _wrong_sum(program, case, r, out, result))
    return (check_ring_trace(result.trace, case, length)
            or (length >= n and reductions.ring_partial_sums(result, case, length, "ring AllReduce")) or None)


def check_ring_trace(trace, case, length):
    """Checks 3-6 on the trace of a ring AllReduce of ``length`` float64 elements."""
    n = case.world_size
    failure = checks.ring_neighbours(trace, case, "ring AllReduce", CENTRAL)
    if failure or length < n:
        return failure
    want = 2 * (n - 1)
    optimal = 2 * (n - 1) * length * 8
    return (checks.one_chunk_per_message(trace, case, length)
            or checks.exact_steps(
                trace, case, want, check="exactly 2(N-1) steps",
                expected=f"2 * ({n} - 1) = {want} steps: N-1 of reduce-scatter, N-1 of all-gather",
                hint="Each phase loops world_size - 1 times.")
            or checks.one_send_one_recv_per_step(trace, case, want)
            or checks.total_bytes(
                trace, case, optimal,
                expected=f"2(N-1) * L * 8 = {optimal} bytes (every chunk passes N-1 links in each phase)",
                hint="Send each chunk exactly as np.array_split makes it."))


def _wrong_sum(program, case, rank, out, result):
    """Explain a wrong result exactly, using the contribution probe."""
    n, length, trace = case.world_size, len(case.inputs[0]), result.trace
    fail = wrong_values(case, rank, out, sums.close(out, case.inputs, range(n)),
                        np.sum(case.inputs, axis=0), "every rank ends with the sum of all inputs")
    steps = _steps_note(trace, case)
    if steps:
        fail.what += "\n" + steps
        fail.hint = "Each phase loops world_size - 1 times: N-1 steps of reduce-scatter, then N-1 of all-gather."
    shown = fail.expected, fail.got
    # Only the simulator records payloads: without them nothing says the messages were right.
    right = (length >= n and result.payloads is not None and not check_ring_trace(trace, case, length)
             and not reductions.ring_partial_sums(result, case, length, "ring AllReduce"))
    res = contrib.probe_run(program, n, length)
    # 1. what the output holds, element by element
    first = _first_wrong_element(res, n) if res is not None else None
    if first is None:
        return right_messages_wrong_result(fail, result, shown=shown) if right else fail
    r, i, j, dec, o = first
    expected = (1,) * n
    span = f"element {i}" if i == j else f"elements {i}..{j}"
    if dec[i] is None:
        what = f"rank {r}, {span}: the value is not a sum of inputs at all"
    elif dec[i][0] != expected:
        what = f"rank {r}, {span}: {contrib.describe(dec[i][0], expected)}"
    else:
        what = f"rank {r}, element {i} holds the sum meant for element {dec[i][1]}: a chunk landed in the wrong slot"
    fail.what = f"world_size {n}: {what}"
    fail.expected = "every element: each rank's contribution exactly once"
    fail.got = (f"{span} on rank {r} {'hold' if i != j else 'holds'} the contributions of "
                f"{contrib.holders(dec[i][0])}"
                if dec[i] is not None else numbers(o[i:i + 1]))
    # 2. the first message that was already wrong
    step_note, hint = _first_bad_message(res, n)
    if step_note:
        fail.what += "\nFirst went wrong: " + step_note
    if steps:
        fail.what += "\n" + steps
    tail = length % n
    if hint is None and tail and i >= length - tail:
        hint = (f"Only the last {tail} element{'s are' if tail > 1 else ' is'} wrong: does your code assume the length divides by "
                f"world_size? np.array_split(x, world_size) makes chunks of unequal size.")
    fail.hint = hint or fail.hint or ("Write down, for N=3, which chunk each rank sends and receives at each step, "
                         "and compare with your index formulas.")
    return right_messages_wrong_result(fail, result, shown=shown) if right else fail


def _first_wrong_element(res, n):
    """(rank r, i, j, r's decoded output, r's output) for the first element of a probe
    run's outputs that is not every contribution once, at its own position, and the
    run i..j of elements with the same wrong content; or None."""
    expected = (1,) * n
    for r, o in enumerate(res.outputs):
        dec = contrib.decode(o, n)
        i = next((i for i, d in enumerate(dec) if d is None or d[0] != expected or d[1] != i), None)
        if i is not None:
            j = i
            while (j + 1 < len(dec) and dec[j + 1] is not None and dec[i] is not None
                   and dec[j + 1][0] == dec[i][0]):
                j += 1
            return r, i, j, dec, o
    return None


def _steps_note(trace, case):
    """'Also: it took 5 steps ...' when the step count is off too, else ''."""
    want = 2 * (case.world_size - 1)
    if len(case.inputs[0]) < case.world_size or trace.steps == want:
        return ""
    return f"Also: the program took {checks.steps(trace.steps)}; a ring AllReduce takes 2(N-1) = {want}."


SLOT_HINT = ("The chunk you receive at step k is the one your left neighbour sent, so compute "
             "its index from the sender's rank, (rank - 1 - k) % N, not from your own.")


def _first_bad_message(res, n):
    """In a ring AllReduce the message of step s carries min(s, N) contributions,
    each once, for one contiguous range of positions. Find the first that doesn't.

    A message mixing positions is reported first even if a count went wrong
    earlier: a chunk added into the wrong slot is the root cause of both."""
    decoded = reductions.decoded_messages(res, n)
    for e, dec in decoded:       # values that are no sums come first: nothing else can be read
        if any(d is None for d in dec):
            return contrib.garbled(e, dec, None)
    problem = next(filter(None, (contrib.garbled(e, dec, SLOT_HINT) for e, dec in decoded)), None)
    if problem:
        return problem
    for e, dec in decoded:
        want = min(e.step, n)
        phase = "reduce-scatter" if e.step < n else "all-gather"
        for coeffs, _ in dec:
            if max(coeffs) > 1:
                hint = ("In the all-gather phase the received chunk is already complete: replace your copy "
                        "(chunk[...] = received), do not add it." if e.step >= n else
                        "A contribution is added twice: check which chunk index you send and which you add into.")
                return (f"step {e.step} ({phase} phase): rank {e.src} sent rank {e.dst} a chunk in which "
                        f"{contrib.describe(coeffs, tuple(int(c > 0) for c in coeffs))}", hint)
            if sum(coeffs) != want:
                if e.step >= n:
                    hint = ("The first all-gather message must carry a fully reduced chunk: after reduce-"
                            "scatter, rank r's complete chunk is the last one it added into, not the one "
                            "reduce-scatter started from. Check also that reduce-scatter runs N-1 steps.")
                elif not coeffs[e.src]:
                    hint = (f"Rank {e.src}'s own contribution is gone: in the reduce-scatter phase add the "
                            "received chunk into yours (chunk += received); replacing it drops yours.")
                else:
                    hint = ("The chunk a rank forwards at step k+1 must be the one it received into at step k. "
                            "Add the received chunk into the slot the sender sent from, index "
                            "(rank - 1 - k) % N, not into (rank - k) % N; and run reduce-scatter for "
                            "N-1 steps before the all-gather starts.")
                return (f"step {e.step} ({phase} phase): rank {e.src} sent rank {e.dst} a chunk holding "
                        f"{sum(coeffs)} contribution(s) ({contrib.holders(coeffs)}); at step {e.step} a ring "
                        f"AllReduce message holds {want}", hint)
    return None, None
