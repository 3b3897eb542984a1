"""Grader for exercise ``alltoall``.

Signature: ``program(comm, blocks) -> list``. ``blocks`` is a list of N float64
arrays of one shape: ``blocks[c]`` is what this rank sends to rank c. Every
rank returns a list ``out`` of N arrays with ``out[c]`` = the block rank c sent
to this rank; ``out[rank]`` is its own ``blocks[rank]``, which never travels.

Checks, on world sizes 1 to 8 and block lengths 1 and 2, with fresh random
data (every element of every block a different value, so the grader can
follow each block through the trace without relying on labels):

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. every rank ends with the block each rank sent it, in the right slot;
3. every message carries whole blocks;
4. every block goes straight to its destination, in a message from its
   sender to its receiver that carries nothing else;
5. every block is sent exactly once, and a rank's own block not at all;
6. every block reached its destination in a message (the values of out[c]
   alone could come from elsewhere).

Any AlltoAll that sends each block once, straight to its destination, passes:
direct (post all sends and receives), pairwise exchange (XOR or shift
partners), any order, send/recv or isend/irecv or sendrecv, labelled or not.
Checks 3-6 follow payloads, which only the simulator records.
"""

from ..kit import blocks as B, checks
from ..kit.report import Failure

NAME = "alltoall"
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
cases = B.cases


def check(program, case, backend="sim"):
    result, failure = B.run_and_check_result(
        program, case, backend, missing_hint="Receive one block from every other rank c and store it at out[c].")
    if failure and failure.error is not None:
        _xor_hint(failure, case.world_size)
    if failure or result.payloads is None:
        return failure
    failure, carried = B.hops(case, result)
    if failure:
        return failure
    trace = result.trace
    # With one or two ranks every message touches every rank: no hub to speak of.
    hub = checks.hub(trace, case.world_size) if case.world_size > 2 else None
    # Other ranks' blocks first: a misrouted block says more than an own block sent along.
    for block, events in sorted(carried.items(), key=lambda kv: (kv[0][0] == kv[0][1], kv[1][0].step)):
        for e in events:
            if (e.src, e.dst) == block:
                continue
            hint = _misroute_hint(e, block, hub)
            if block[0] == block[1]:
                return B.own_block_travels(case, e, block, hint)
            return Failure(case.label, "every block goes straight to its destination",
                           f"at step {e.step} rank {e.src} sent rank {e.dst} {B.name(block)}",
                           expected=f"{B.name(block)} only in a message from rank {block[0]} to rank {block[1]}",
                           got=f"rank {e.src} -> rank {e.dst} carrying {B.name(block)}", hint=hint)
        if len(events) > 1:
            return Failure(case.label, "every block is sent exactly once",
                           f"{B.name(block)} was sent {len(events)} times, at steps "
                           + ", ".join(str(e.step) for e in events),
                           expected="once", got=f"{len(events)} times",
                           hint="Send each block once; the receiver keeps it.")
    return B.undelivered(case, carried)


def _misroute_hint(e, block, hub):
    """Why message ``e`` should not have carried ``block``, in the learner's terms."""
    if hub is not None:
        return (f"Every message goes to or from rank {hub}: blocks make two hops through it. "
                f"Send blocks[c] straight to rank c.")
    if block[0] == block[1]:
        return None                              # own_block_travels says it
    if e.src != block[0]:
        return (f"Rank {e.src} passed on a block it had received: that is how a ring AlltoAll works, "
                f"but here every block goes straight from its sender to its destination, in one message.")
    return (f"A message to rank {e.dst} carries only blocks[{e.dst}]: a block sent to another rank must "
            f"then be forwarded (a ring AlltoAll does that), or it is sent twice. Send blocks[c] to "
            f"rank c, and nothing else with it.")


def _xor_hint(failure, n):
    """A run that failed on a world size that is not a power of two: XOR partners?
    Confident when every message so far went to partner rank ^ step."""
    if n & (n - 1) == 0:
        return
    err = failure.error
    trace = getattr(err, "trace", None)
    xor = trace is not None and len(trace) > 1 and all(e.dst == e.src ^ e.step for e in trace)
    rank = getattr(err, "rank", None)
    if rank is None:
        rank = min(getattr(err, "waiting", None) or [0])
    step = getattr(err, "step", None) or 0
    k = next((k for k in [step + 1, *range(1, n)] if 0 < k < n and rank ^ k >= n), None)
    example = (f" With N = {n}, rank {rank}'s partner in round {k} would be {rank} ^ {k} = {rank ^ k}, "
               f"and there is no rank {rank ^ k}." if k is not None else "")
    lead = ("Every message so far went to partner rank ^ step: XOR pairing. It" if xor else
            "If you pair ranks with XOR (partner = rank ^ k): that")
    failure.hint = (f"{lead} only pairs the ranks up when N is a power of two, and N = {n} is not."
                    f"{example} Use the shift instead: in round k send to (rank + k) % N and receive "
                    f"from (rank - k) % N. " + (failure.hint or ""))
