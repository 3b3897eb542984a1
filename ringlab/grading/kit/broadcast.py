"""What the two broadcast graders (``tree_broadcast``, ``binomial_broadcast``) share:
their cases, running one and checking every rank's result (checks 1-2), and the checks
of what the messages are: the root receives nothing, every other rank one message, the
root's data unchanged; ``broadcast_shape`` names a pattern of messages for a hint."""

import numpy as np

from .report import Case, Failure, numbers
from .running import check_outputs_shape, run_case
from ...errors import CommError, DeadlockError, RankError


def cases(rng):
    """N=4 first, then bigger, the edge cases last; every world with root 0 and with a
    random other root."""
    for n in (4, 3, 5, 6, 7, 8, 12, 2, 1):
        roots = [0, int(rng.integers(1, n))] if n > 1 else [0]
        for root in roots:
            length = int(rng.integers(1, 7))
            x = rng.uniform(1, 2, length) * rng.choice([-1.0, 1.0], length)   # random floats
            inputs = [x if r == root else None for r in range(n)]
            yield Case(n, inputs, f"world_size={n}, root={root}, length={length}", args=(root,),
                       info={"root": root, "x": x})


def check(program, case, backend, explain, trace_checks):
    """Checks 1-2 (``run_broadcast``), then the grader's own ``trace_checks(result, case)``."""
    result, failure = run_broadcast(program, case, backend, explain)
    return failure or trace_checks(result, case)


def run_broadcast(program, case, backend, explain=None):
    """Checks 1-2: (result, None) or (None, Failure). ``explain(failure, case)`` may
    sharpen the hint of a run that failed."""
    root, x = case.info["root"], case.info["x"]
    result, failure = run_case(program, case, backend)
    if failure:
        if explain is not None:
            explain(failure, case)
        # A program that raised or deadlocked may lay the tree out from rank 0, not from the root.
        if root != 0 and isinstance(failure.error, (RankError, DeadlockError)):
            failure.hint = (f"{failure.hint} This case's root is rank {root}: if your program works "
                            f"with root 0, count positions from the root, i = (rank - root) % N, "
                            f"and turn positions back into ranks with (i + root) % N.")
        return None, failure
    failure = check_outputs_shape(result, case, x.shape, receives=lambda r: r != root)
    if failure:
        return None, failure
    for r, out in enumerate(result.outputs):
        if not np.array_equal(out, x):
            bad = np.flatnonzero(out != x)
            return None, Failure(case.label, "every rank ends with the root's data",
                                 f"rank {r} has wrong values at {len(bad)} of {len(x)} elements",
                                 expected=numbers(x, 6), got=numbers(out, 6),
                                 hint="Return the array you received (the root returns its own x).")
    return result, None


def bad_peer(err):
    """Whether ``err`` is a rank's send/recv naming a rank that does not exist, or itself."""
    return (isinstance(err, RankError) and isinstance(err.exc, CommError)
            and any(s in str(err.exc) for s in ("there is no rank", "cannot send to or from itself",
                                                 "cannot recv to or from itself")))


def receives(trace, case, root, shape_hint=None):
    """The root receives nothing, and every other rank receives exactly one message."""
    n = case.world_size
    counts = [0] * n
    for e in trace:
        if e.dst == root:
            return Failure(case.label, "the root receives nothing",
                           f"at step {e.step} rank {e.src} sent a message to the root, rank {root}",
                           expected=f"no message to rank {root}: it has the data from the start",
                           got=e.describe(),
                           hint="Count positions from the root, i = (rank - root) % N, so that the root "
                                "is position 0 and has no parent; and send nothing back up the tree.")
        counts[e.dst] += 1
    for r in range(n):
        if r != root and counts[r] != 1:
            got = [e for e in trace if e.dst == r]
            return Failure(case.label, "every rank except the root receives exactly once",
                           f"rank {r} received {counts[r]} messages",
                           expected="one message per rank: the whole vector, from its parent",
                           got="; ".join(e.describe() for e in got) or "nothing",
                           hint=shape_hint or "Send the whole vector in one message to each child, once.")
    return None


def payloads(result, case):
    """Every message of a broadcast carries the root's data exactly: its size
    (x.nbytes) and its values, read from the recorded payloads."""
    x = case.info["x"]
    for e in result.trace:
        p = result.payload(e) if result.payloads is not None else None
        if e.nbytes != x.nbytes or (p is not None and not (
                p.dtype == x.dtype and p.shape == x.shape and np.array_equal(p, x))):
            empty = " (an empty message)" if e.nbytes == 0 else ""
            return Failure(case.label, "every message carries the root's data",
                           f"at step {e.step} rank {e.src} sent rank {e.dst} {e.nbytes} bytes{empty}, "
                           f"shape {e.shape} {e.dtype}" + ("" if e.nbytes != x.nbytes else ", other values"),
                           expected=f"the root's x: {x.size} float64 values, {x.nbytes} bytes, unchanged: "
                                    f"{numbers(x)}",
                           got=numbers(p) if p is not None else f"{e.nbytes} bytes",
                           hint="Send each child the data exactly as you received it (the root: its x). "
                                "The grader reads every message: the data must travel down the tree.")
    return None


def shape(trace, n, root):
    """A name for the pattern of a broadcast's messages, to explain a failure:
    'flat', 'chain', 'binary tree', 'binary tree around rank 0', 'binomial tree'
    or None. Positions are counted from the root."""
    if not len(trace):
        return None
    pos = [((e.src - root) % n, (e.dst - root) % n) for e in trace]
    if all(p == 0 for p, _ in pos):
        return "flat"
    if all(c == p + 1 for p, c in pos):
        return "chain"
    if all(c in (2 * p + 1, 2 * p + 2) for p, c in pos):
        return "binary tree"
    if root and all(e.dst in (2 * e.src + 1, 2 * e.src + 2) for e in trace):
        return "binary tree around rank 0"
    # binomial: the parent of position c is c minus one of its set bits (either labelling)
    if all(p < c and (c - p) & (c - p - 1) == 0 and c & (c - p) for p, c in pos):
        return "binomial tree"
    return None
