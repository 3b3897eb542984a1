"""What the data-parallel AllReduces carry: the gradients, not a stand-in.

A trace with the right shape (steps, bytes, neighbours) can still carry zeros
while the real gradients travel through Python memory that all ranks share in
the simulator. So the graders read every recorded message: in a ring
AllReduce, rank r's i-th message is one chunk of the reduced vector summed
over the i+1 ranks before it on the ring (itself included) in the
reduce-scatter phase, and over all P in the all-gather phase. The grader
knows each rank's vector (its weighted gradient), so it can check that.
"""

import numpy as np

from ..kit.reductions import any_chunk, ring_members
from ..kit.report import Failure, numbers


def messages_by_rank(trace, world_size, stream):
    """Each rank's messages on ``stream`` in the order it sent them."""
    out = [[] for _ in range(world_size)]
    for e in sorted(trace, key=lambda e: (e.step, e.seq)):
        if e.stream == stream:
            out[e.src].append(e)
    return out


def _partial_sum(payload, vectors, members, scales):
    """The slice ``chunk`` for which ``payload`` equals ``s * sum(vectors[m][chunk])``
    for a scale s: a chunk of np.array_split first, else any contiguous one (a ring
    of the program's own may cut otherwise); None if there is none."""
    if not (isinstance(payload, np.ndarray) and type(payload) is np.ndarray
            and payload.dtype == np.float64 and payload.ndim == 1):
        return None

    def holds(chunk):
        parts = np.array([vectors[m][chunk] for m in members])
        total = parts.sum(axis=0)
        # The learner computes its gradient in its own order: allow rounding,
        # relative to the size of the numbers added (cancellation included).
        tol = 1e-7 * np.abs(parts).sum(axis=0) + 1e-12 * (np.abs(parts).max(initial=0) + 1e-300)
        return any(np.all(np.abs(payload - s * total) <= s * tol) for s in scales)
    length = len(vectors[0])
    bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(length), len(vectors))])
    split = (slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))
    return (next((c for c in split if c.stop - c.start == payload.size and holds(c)), None)
            or any_chunk(holds, length, payload.size))


def check_allreduces(result, case, per_rank, operands, scales, what, hint):
    """``per_rank[r]``: rank r's messages, 2(P-1) per AllReduce call, in order;
    ``operands[c]``: for call c, a list of alternatives, each a list of the P
    ranks' vectors. A Failure for the first message that is not a partial sum
    of any alternative (the check "every message carries ``what``")."""
    n = case.world_size
    per_call = 2 * (n - 1)
    if n == 1 or result.payloads is None:
        return None
    for r in range(n):
        for j, e in enumerate(per_rank[r]):
            call, i = divmod(j, per_call)
            if call >= len(operands):
                break
            members = ring_members(e, n, i + 1) if i < n - 1 else list(range(n))
            p = result.payload(e)
            # (Gradients here are whole numbers, so chunks can repeat each other's values:
            # a message is read as some chunk, not as a particular one.)
            if any(_partial_sum(p, alt, members, scales) is not None for alt in operands[call]):
                continue
            phase = "reduce-scatter" if i < n - 1 else "all-gather"
            return Failure(
                case.label, f"every message carries {what}",
                f"AllReduce {call}, {phase}: rank {e.src}'s message {i + 1} to rank {e.dst} "
                f"(step {e.step}) does not hold a chunk of {what} summed over the right ranks",
                expected=f"one chunk of np.array_split(vector, {n}) summed over "
                         f"{len(members)} rank(s)' vectors",
                got=f"{p.size if isinstance(p, np.ndarray) else '?'} values: {numbers(p)}",
                hint=hint)
    return None
