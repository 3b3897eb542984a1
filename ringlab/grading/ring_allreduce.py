"""Grader for exercise ``ring_allreduce``.

Signature: ``program(comm, x) -> array``. ``x`` is this rank's float64 vector
(every rank's has the same length, which need not divide by world_size);
every rank returns the element-wise sum of all ranks' ``x``.

Checks, on world sizes 1 to 8 and several lengths, with fresh random data:

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. every rank returns the exact sum (wrong sums are diagnosed: which ranks'
   contributions are missing or counted twice, where, and from which step);
3. it is a ring: messages only between ring neighbours;
4. one chunk per message (at most ceil(L/N) elements), never the whole vector;
5. exactly 2(N-1) steps, and every rank sends one and receives one message
   in every step;
6. total bytes equal those of the bandwidth-optimal algorithm: 2(N-1) L * 8.

Any correct ring AllReduce passes: either direction, any chunk numbering,
send/recv or isend/irecv or sendrecv, in place or not, labelled or not.
Checks 4-6 apply when the length is at least N (shorter vectors have empty
chunks, which a program may skip).
"""

import numpy as np

from . import contributions as contrib
from .report import Case, Failure, check_outputs_shape, run_case
from ..world import run

NAME = "ring_allreduce"


def cases(rng):
    # N=4 first: small enough to read, big enough that neighbours, phases and
    # wrong slots are distinguishable. The edge cases N=2 and N=1 come last.
    for n in (4, 3, 5, 6, 7, 8, 2, 1):
        lengths = [3 * n, 3 * n + 1] if n > 1 else [5]
        if n in (3, 5):
            lengths.append(n - 1)     # shorter than the world: some chunks are empty
        if n == 4:
            lengths.append(0)
        for length in lengths:
            # Whole numbers in float64: every summation order gives the exact sum.
            inputs = [rng.integers(-1000, 1000, length).astype(np.float64) for _ in range(n)]
            yield Case(n, inputs, f"world_size={n}, length={length}")


def check(program, case, backend="sim"):
    n, length = case.world_size, len(case.inputs[0])
    result, failure = run_case(program, case, backend)
    if failure:
        return failure
    failure = check_outputs_shape(result, case, (length,))
    if failure:
        return failure
    total = np.sum(case.inputs, axis=0)
    for r, out in enumerate(result.outputs):
        if not np.array_equal(out, total):
            return _wrong_sum(program, case, r, out, total)
    return check_ring_trace(result.trace, case, length, itemsize=8)


def check_ring_trace(trace, case, length, itemsize):
    """Checks 3-6 on the trace of a ring AllReduce of ``length`` elements."""
    n = case.world_size
    for e in trace:
        if n > 2 and e.dst not in ((e.src + 1) % n, (e.src - 1) % n):
            # A hub that is an end of every message: a central (parameter-server) reduction.
            hub = next((r for r in range(n) if all(r in (x.src, x.dst) for x in trace)), None)
            central = hub is not None
            return Failure(
                case.label, "messages go only between ring neighbours",
                f"at step {e.step} rank {e.src} sent to rank {e.dst}, which is not its neighbour "
                f"(the neighbours of rank {e.src} are ranks {(e.src - 1) % n} and {(e.src + 1) % n})",
                expected="every message to (rank + 1) % N or (rank - 1) % N",
                got=f"rank {e.src} -> rank {e.dst}",
                hint=(f"Every message goes to or from rank {hub}: that is a central reduction through one "
                      f"rank (its link carries 2(N-1) whole vectors), not a ring AllReduce."
                      if central else "In a ring each rank only talks to the rank on its left and on its right."))
    if length < n:
        return None
    max_chunk = -(-length // n) * itemsize
    for e in trace:
        if e.nbytes > max_chunk:
            whole = e.nbytes >= length * itemsize
            return Failure(
                case.label, "one chunk per message",
                f"at step {e.step} rank {e.src} sent rank {e.dst} {e.nbytes} bytes"
                + (" (the whole vector)" if whole else ""),
                expected=f"at most one chunk: ceil({length}/{n}) = {max_chunk // itemsize} elements, {max_chunk} bytes",
                got=f"{e.nbytes // itemsize} elements",
                hint="Split the vector into world_size chunks (np.array_split) and send one chunk "
                     "per step; sending whole vectors costs N times the bandwidth.")
    want = 2 * (n - 1)
    if trace.steps != want:
        return Failure(case.label, "exactly 2(N-1) steps",
                       f"the program took {trace.steps} steps",
                       expected=f"2 * ({n} - 1) = {want} steps: N-1 of reduce-scatter, N-1 of all-gather",
                       got=f"{trace.steps} steps",
                       hint="Each phase loops world_size - 1 times." if trace.steps != 0 else None)
    for step in range(1, want + 1):
        evs = trace.at_step(step)
        senders = [e.src for e in evs]
        receivers = [e.dst for e in evs]
        for r in range(n):
            s, g = senders.count(r), receivers.count(r)
            if s != 1 or g != 1:
                return Failure(case.label, "every rank sends one and receives one message per step",
                               f"at step {step} rank {r} sent {s} and received {g} message(s)",
                               expected="1 sent and 1 received, at every step, on every rank",
                               got=f"step {step}: " + ", ".join(f"{e.src}->{e.dst}" for e in evs),
                               hint="In every step all ranks pass one chunk to the same side at once; "
                                    "no rank may sit out or send twice.")
    optimal = 2 * (n - 1) * length * itemsize
    if trace.total_bytes != optimal:
        return Failure(case.label, "bandwidth-optimal bytes",
                       f"the program moved {trace.total_bytes} bytes in total",
                       expected=f"2(N-1) * L * 8 = {optimal} bytes (every chunk passes N-1 links in each phase)",
                       got=f"{trace.total_bytes} bytes",
                       hint="Send each chunk exactly as np.array_split makes it.")
    return None


def _wrong_sum(program, case, rank, out, total):
    """Explain a wrong result exactly, using the contribution probe."""
    n, length = case.world_size, len(case.inputs[0])
    bad = np.flatnonzero(out != total)
    where = f"elements {bad[0]}..{bad[-1]}" if len(bad) > 1 else f"element {bad[0]}"
    fail = Failure(case.label, "every rank ends with the sum of all inputs",
                   f"rank {rank} has wrong values at {len(bad)} of {length} elements ({where})",
                   expected=f"{total[bad[:4]]}...", got=f"{out[bad[:4]]}...")
    if n > contrib.MAX_WORLD:
        return fail
    probe = Case(n, contrib.probe_inputs(n, length), case.label)
    try:
        res = run(program, probe.inputs, record_payloads=True, timeout=10.0)
    except Exception:   # noqa: BLE001 - it passed on random data, so a probe failure just means no detail
        return fail
    expected = (1,) * n
    # 1. what the output holds, element by element
    first = None
    for r, o in enumerate(res.outputs):
        dec = contrib.decode(o, n)
        for i, d in enumerate(dec):
            if d is None or d[0] != expected or d[1] != i:
                first = (r, i, dec)
                break
        if first:
            break
    if first is None:
        return fail
    r, i, dec = first
    # the run of elements on that rank with the same wrong content
    j = i
    while j + 1 < len(dec) and dec[j + 1] is not None and dec[i] is not None and dec[j + 1][0] == dec[i][0]:
        j += 1
    span = f"element {i}" if i == j else f"elements {i}..{j}"
    if dec[i] is None:
        what = f"rank {r}, {span}: the value is not a sum of inputs at all"
    elif dec[i][0] != expected:
        what = f"rank {r}, {span}: {contrib.describe(dec[i][0], expected)}"
    else:
        what = f"rank {r}, element {i} holds the sum meant for element {dec[i][1]}: a chunk landed in the wrong slot"
    fail.what = f"world_size {n}: {what}"
    fail.expected = "every element: each rank's contribution exactly once"
    fail.got = (f"{span} on rank {r} holds contributions of {contrib.holders(dec[i][0])}"
                if dec[i] is not None else f"{o[i]!r}")
    # 2. the first message that was already wrong
    step_note, hint = _first_bad_message(res, n, length)
    if step_note:
        fail.what += "\nFirst went wrong: " + step_note
    tail = length % n
    if hint is None and tail and i >= length - tail:
        hint = (f"Only the last {tail} elements are wrong: does your code assume the length divides by "
                f"world_size? np.array_split(x, world_size) makes chunks of unequal size.")
    fail.hint = hint or ("Write down, for N=3, which chunk each rank sends and receives at each step, "
                         "and compare with your index formulas.")
    return fail


def _first_bad_message(res, n, length):
    """In a ring AllReduce the message of step s carries min(s, N) contributions,
    each once, for one contiguous range of positions. Find the first that doesn't.

    A message mixing positions is reported first even if a count went wrong
    earlier: a chunk added into the wrong slot is the root cause of both."""
    decoded = []
    for e in res.trace:
        payload = res.payloads[(e.src, e.dst, e.tag, e.seq)]
        if payload.size:
            decoded.append((e, contrib.decode(payload, n)))
    for e, dec in decoded:
        if any(d is None for d in dec):
            return f"step {e.step}: rank {e.src} sent rank {e.dst} values that are not sums of inputs", None
    for e, dec in decoded:
        positions = [d[1] for d in dec]
        if None in positions or positions != list(range(positions[0], positions[0] + len(positions))):
            return (f"step {e.step}: rank {e.src} sent rank {e.dst} a chunk that mixes elements from "
                    f"different places of the vector: a received chunk was added into the wrong slot",
                    "The chunk you receive at step k is the one your left neighbour sent, so compute its "
                    "index from the sender's rank, (rank - 1 - k) % N, not from your own.")
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
