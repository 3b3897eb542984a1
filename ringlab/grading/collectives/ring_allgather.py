"""Grader for exercise ``ring_allgather``.

Signature: ``program(comm, x) -> array``. ``x`` is this rank's float64 vector;
all ranks' have the same length L. Every rank returns the concatenation of
every rank's ``x`` in rank order (length N * L): block s is rank s's ``x``.

Checks, on world sizes 1 to 8 and several lengths, with fresh random data:

1. it runs: no exception, deadlock, endless loop or unreceived message (a
   run that fails after too few steps says so);
2. every rank returns exactly the concatenation (a wrong result is
   diagnosed: too few steps, which block holds which rank's data, and the
   first message that went wrong);
3. it is a ring: messages only between ring neighbours;
4. one block per message (L elements), never several;
5. exactly N-1 steps, and every rank sends one and receives one message
   in every step;
6. total bytes N(N-1) L * 8: every block crosses N-1 links, once each;
7. every message carries exactly one rank's x, unchanged: one the sender has
   (its own, or one it received before) and the receiver has not (read from
   the recorded payloads, in the simulator).

The data are random floats: a block cannot travel in fewer bytes than its
own, and every message says whose x it is.

Any correct ring AllGather passes: to the right, to the left, or alternating
sides; send/recv, isend/irecv or sendrecv; labelled or not. Checks 4-7 apply
when L >= 1.
"""

import numpy as np

from ..kit import checks
from ..kit.report import Case, Failure, numbers
from ..kit.running import check_outputs_shape, run_case

NAME = "ring_allgather"
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
HUB = "a gather to one rank and a broadcast from it (its link carries N-1 whole results)"
LOOP = ("Count your loop first: it must run world_size - 1 times, one block per step; with fewer "
        "steps some blocks never arrive.")


def cases(rng):
    # N=4 first: small enough to read; the edge cases N=2 and N=1 last.
    for n in (4, 3, 5, 6, 7, 8, 2, 1):
        lengths = [3, 1] if n > 1 else [5]
        if n == 4:
            lengths.append(0)
        for length in lengths:
            # Random floats, all different: every block can be told apart from every other,
            # and none fits in fewer bytes.
            values = rng.uniform(1, 2, n * length) * rng.choice([-1.0, 1.0], n * length)
            yield Case(n, list(values.reshape(n, length)), f"world_size={n}, length={length}")


def check(program, case, backend="sim"):
    n, length = case.world_size, len(case.inputs[0])
    result, failure = run_case(program, case, backend)
    if failure:
        return checks.steps_before_failure(failure, n - 1, f"a ring AllGather takes N-1 = {n - 1}", LOOP)
    failure = check_outputs_shape(result, case, (n * length,))
    if failure:
        return failure
    want = np.concatenate(case.inputs)
    for r, out in enumerate(result.outputs):
        if not np.array_equal(out, want):
            return (checks.off_ring(result.trace, case, "ring AllGather", HUB, r)
                    or _wrong_result(case, result, r, out))
    return check_allgather_trace(result.trace, case, length) or (length and carries_blocks(result, case)) or None


def check_allgather_trace(trace, case, length):
    """Checks 3-6 on the trace of a ring AllGather of blocks of ``length`` float64 elements."""
    n = case.world_size
    failure = checks.ring_neighbours(trace, case, "ring AllGather", HUB)
    if failure or length == 0:
        return failure
    block = length * 8
    return (checks.message_bytes(
                trace, case, block, check="one block per message", whole=n * block,
                expected=f"at most one block: L = {length} elements, {block} bytes",
                hint="Pass on one block per step: the one you received in the step before. Sending "
                     "everything you have so far costs up to N/2 times the bandwidth.")
            or checks.exact_steps(
                trace, case, n - 1, check="exactly N-1 steps",
                expected=f"{n} - 1 = {n - 1} steps: after them every block has visited every rank",
                hint="Loop world_size - 1 times, one block per step.")
            or checks.one_send_one_recv_per_step(
                trace, case, n - 1, hint="In every step every rank passes one block to a neighbour; "
                                         "no rank may sit out or send twice.")
            or checks.total_bytes(
                trace, case, n * (n - 1) * block,
                expected=f"N(N-1) * L * 8 = {n * (n - 1) * block} bytes (every block crosses N-1 links)",
                hint="Send each block exactly as it is."))


def carries_blocks(result, case):
    """Check 7: every message is one rank's x, exactly, that the sender has and
    the receiver lacks. With N-1 steps of one message per rank (checks 5-6)
    every rank then receives every other rank's x."""
    if result.payloads is None:
        return None
    n = case.world_size
    has = [{r} for r in range(n)]             # whose x each rank holds so far
    for step in sorted({e.step for e in result.trace}):
        arrived = []
        for e in result.trace.at_step(step):
            p = result.payload(e)
            q = _whose(p, case.inputs) if p.dtype == np.float64 and p.ndim == 1 else None
            if q is None:
                return Failure(case.label, "every message carries one rank's x",
                               f"at step {e.step} rank {e.src} sent rank {e.dst} {p.size} values of dtype "
                               f"{p.dtype} that are not one rank's x",
                               expected=f"one rank's x, unchanged: {len(case.inputs[0])} float64 values",
                               got=numbers(p),
                               hint="Pass each block on exactly as it arrived: the grader reads every "
                                    "message, so data packed, transformed or mixed on the way do not pass.")
            if q not in has[e.src]:
                return Failure(case.label, "every message carries one rank's x",
                               f"at step {e.step} rank {e.src} sent rank {q}'s x, which it had not received",
                               expected=f"a block rank {e.src} holds: its own or one it received earlier",
                               got=f"rank {q}'s x", hint="A rank can only pass on what it has received.")
            if q in has[e.dst]:
                whose = "its own x" if q == e.dst else f"rank {q}'s x, which it already had"
                return Failure(case.label, "every message carries one rank's x",
                               f"at step {e.step} rank {e.src} sent rank {e.dst} {whose}",
                               expected=f"a block rank {e.dst} does not have yet", got=f"rank {q}'s x",
                               hint="At every step pass on the block you received in the step before: "
                                    "your neighbour does not have that one yet.")
            arrived.append((e.dst, q))
        for r, q in arrived:
            has[r].add(q)
    return None


def _whose(block, inputs):
    """The rank whose x equals ``block``, or None."""
    return next((q for q, x in enumerate(inputs) if len(block) == len(x) and np.array_equal(block, x)), None)


def _wrong_result(case, result, rank, out):
    """Say which block of ``rank``'s result is wrong and what it holds instead."""
    n, length = case.world_size, len(case.inputs[0])
    s = next(s for s in range(n)
             if not np.array_equal(out[s * length:(s + 1) * length], case.inputs[s]))
    got = out[s * length:(s + 1) * length]
    q = _whose(got, case.inputs)
    if q is not None:
        holds = f"rank {q}'s x"
    elif not np.any(got):
        holds = "zeros (never filled?)"
    else:
        holds = "values that are not any rank's x"
    fail = Failure(case.label, "every rank ends with every rank's x, in rank order",
                   f"rank {rank}'s block {s} (elements {s * length}..{(s + 1) * length - 1}) "
                   f"holds {holds}",
                   expected=f"rank {s}'s x: {numbers(case.inputs[s])}", got=numbers(got))
    note, hint = _first_bad_message(case, result)
    alias = _overwritten(case, result, rank, s, q)
    if alias:
        note, hint = alias
    if note:
        fail.what += "\nFirst went wrong: " + note
    fail.hint = hint or ("The block that arrives from your left neighbour at step k came from rank "
                         "(rank - 1 - k) % N: store it at that index of your result.")
    steps = result.trace.steps
    if length and steps < n - 1:     # too few steps explain missing blocks before any index does
        fail.what = f"the program took only {checks.steps(steps)}; a ring AllGather takes N-1 = {n - 1}\n" + fail.what
        fail.hint = LOOP
    elif length and steps != n - 1:
        fail.what += f"\nAlso: the program took {checks.steps(steps)}; a ring AllGather takes N-1 = {n - 1}."
    return fail


def _overwritten(case, result, rank, s, q):
    """(note, hint) when ``rank`` received rank s's x but its result holds rank
    q's, which arrived later: the array it kept was filled again by a later
    receive (recv(out=buf) into the same buffer, kept by reference)."""
    if result.payloads is None or q is None:
        return None
    got = {}
    for e in result.trace:
        if e.dst == rank:
            got.setdefault(_whose(result.payload(e).ravel(), case.inputs), e)
    if s not in got or q not in got or got[q].step <= got[s].step:
        return None
    return (f"rank {rank} received rank {s}'s x at step {got[s].step}, but that array was overwritten: it "
            f"holds rank {q}'s x, which arrived at step {got[q].step}",
            "Aliasing: you kept a reference to the receive buffer, and a later recv(out=buf) filled the "
            "same array again. Copy what arrives before the next receive (blocks[i] = buf.copy()), or "
            "receive straight into its slot (recv(..., out=result[i * L:(i + 1) * L])).")


def _first_bad_message(case, result):
    """The first message that is not one rank's x, or that repeats a block on a link."""
    if result.payloads is None:
        return None, None
    seen = {}   # (src, dst, block) -> step it first crossed that link
    for e in result.trace:
        payload = result.payload(e)
        q = _whose(payload.ravel(), case.inputs)
        if q is None:
            return (f"step {e.step}: rank {e.src} sent rank {e.dst} {payload.size} values that are "
                    f"not one rank's x", "Send one block per message, exactly as you received it.")
        first = seen.setdefault((e.src, e.dst, q), e.step)
        if first != e.step:
            whose = "its own x" if q == e.src else f"rank {q}'s x"
            return (f"step {e.step}: rank {e.src} sent rank {e.dst} {whose} again (it sent it at step {first})",
                    "At every step pass on the block you received in the step before, not the same "
                    "one again: a ring AllGather forwards.")
    return None, None
