"""Grader for exercise ``ring_alltoall``.

Signature: ``program(comm, blocks) -> list``, as for ``alltoall``: ``blocks[c]``
(float64 arrays, all of one shape) is what this rank sends to rank c; every
rank returns ``out`` with ``out[c]`` = the block rank c sent to it.

Messages go only between ring neighbours, so a block for a rank d hops away
is forwarded by the ranks in between. Checks, on world sizes 1 to 8 and block
lengths 1 and 2, with fresh random data (every element of every block a
different value, so the grader follows each block through the trace without
relying on labels):

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. every rank ends with the block each rank sent it, in the right slot (a
   block in a wrong slot is traced back to the first rank that kept a block
   meant for another rank, or passed on its own);
3. messages only between ring neighbours;
4. every message carries whole blocks;
5. every block travels one path, once: it leaves its sender once and is
   passed on only by the rank that just received it; a rank's own block
   never travels;
6. no block travels further than it must: it keeps one direction and stops
   at its destination (to the right, a block for rank d crosses
   (d - src) % N links);
7. every block reached its destination in messages (the values of out[c]
   alone could come from elsewhere);
8. at most N-1 steps: each step, a rank sends one message holding every
   block it passes on.

Any correct ring AlltoAll passes: to the right, to the left, or each block
the shorter way round; blocks stacked or concatenated; labelled or not.
Checks 4-7 follow payloads, which only the simulator records.
"""

from ..kit import blocks as B
from ..kit import checks
from ..kit.report import Failure

NAME = "ring_alltoall"
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
cases = B.cases


def check(program, case, backend="sim"):
    n = case.world_size
    result, failure = B.run_and_check_result(
        program, case, backend,
        missing_hint="Only your left neighbour's block reaches you directly; the others arrive only if the "
                     "ranks in between forward them. Keep the block that is for you and pass the rest on.")
    if failure:
        # A block in a wrong slot (not an empty one: missing_hint says that): what went wrong on the way?
        if (result is not None and result.payloads is not None and failure.got != "None"
                and failure.check == "every rank ends with the block each rank sent it"):
            _explain_wrong_block(case, result, failure)
        return failure
    trace = result.trace
    failure = checks.ring_neighbours(
        trace, case, "ring AlltoAll", "an AlltoAll through one rank (every block makes two hops through it)",
        hint="Blocks may only go to the left or right neighbour, which keeps the block meant for it "
             "and passes the others on. Sending straight to the destination is the direct AlltoAll.")
    if failure:
        return failure
    if result.payloads is not None:
        failure, carried = B.hops(case, result)
        if failure:
            return failure
        for block in sorted(carried, key=lambda b: min(e.step for e in carried[b])):
            failure = _check_path(case, block, sorted(carried[block], key=lambda e: (e.step, e.src)))
            if failure:
                return failure
        failure = B.undelivered(case, carried)
        if failure:
            return failure
    if trace.steps > n - 1:
        return Failure(case.label, "at most N-1 steps", f"the program took {trace.steps} steps",
                       expected=f"at most {n} - 1 = {n - 1} steps: in every step each rank sends one "
                                f"message with all the blocks it passes on",
                       got=f"{trace.steps} steps",
                       hint="Put all the blocks you pass on in one step into one message (np.stack), "
                            "instead of one message per block.")
    return None


def _check_path(case, block, events):
    """Checks 5-6 for one block, given the messages that carried it in step order."""
    n, (src, dst) = case.world_size, block
    if src == dst:
        return B.own_block_travels(case, events[0], block)
    path = ", ".join(f"rank {e.src} -> rank {e.dst} at step {e.step}" for e in events)
    at, direction, arrived = src, None, None
    for e in events:
        if e.src != at:
            return Failure(case.label, "every block travels one path, once",
                           f"at step {e.step} rank {e.src} sent {B.name(block)}, which had already "
                           f"moved on to rank {at}",
                           expected="each block leaves each rank at most once", got=path,
                           hint="Send each block one way only, once per hop: the rank that receives "
                                "it is the one that passes it on.")
        if arrived is not None:
            return Failure(case.label, "no block travels further than it must",
                           f"{B.name(block)} reached rank {dst} at step {arrived}, and rank {dst} "
                           f"passed it on at step {e.step}",
                           expected=f"{B.name(block)} stops at rank {dst}", got=path,
                           hint="Keep the block that is meant for you and pass on only the others. "
                                "(If every rank forwards everything for N-1 steps, blocks go round "
                                "the whole ring.)")
        step_dir = 1 if e.dst == (e.src + 1) % n else -1
        if direction is not None and step_dir != direction:
            return Failure(case.label, "no block travels further than it must",
                           f"{B.name(block)} changed direction at rank {e.src} (step {e.step})",
                           expected=f"one direction all the way from rank {src} to rank {dst}", got=path,
                           hint="Pass blocks on in the direction they came: a block that turns back "
                                "travels further than it must.")
        direction, at = step_dir, e.dst
        if at == dst:
            arrived = e.step
    if at != dst:
        return Failure(case.label, "no block travels further than it must",
                       f"{B.name(block)} ended at rank {at}, not at rank {dst}",
                       expected=f"{B.name(block)} delivered to rank {dst}", got=path)
    return None


def _explain_wrong_block(case, result, failure):
    """A block in the wrong slot: find, from the payloads, the first message after
    which a rank passed on the block meant for itself or kept one meant for
    another rank, and add that as "First went wrong" with a hint that fits."""
    n, idx = case.world_size, B.index(case)
    if checks.ring_neighbours(result.trace, case, "", "") or B.hops(case, result)[0]:
        return                                 # not a ring of whole blocks: the later checks say so
    blocks = {e: list(B.contents(result.payload(e), idx)) for e in result.trace}
    for g in result.trace:                     # canonical order: by step
        x = g.dst
        later = {b for e in result.trace if e.src == x and e.step > g.step for b in blocks[e]}
        own = [b for b in blocks[g] if b[1] == x and b in later]
        kept = [b for b in blocks[g] if b[1] != x and b not in later]
        if own or kept:
            break
    else:
        return
    names = ", ".join(B.name(b) for b in blocks[g])
    got = f"at step {g.step} rank {x} received {names} from rank {g.src}"
    if own and not kept:
        sent = next(e for e in result.trace if e.src == x and e.step > g.step and own[0] in blocks[e])
        failure.what += (f"\nFirst went wrong: {got}, and passed on {B.name(own[0])}, its own, "
                         f"at step {sent.step}")
        failure.hint = (f"Keep the block meant for you and pass on only the others: the message a rank "
                        f"passes on is one block shorter than the one it received. Rank {x} received "
                        f"{len(blocks[g])} block(s) and passed on {len(blocks[sent])}.")
        return
    right = x == (g.src + 1) % n
    dist = [((b[1] - x) if right else (x - b[1])) % n for b in blocks[g]]
    pos = blocks[g].index(kept[0])
    failure.what += "\nFirst went wrong: " + (
        f"{got} and kept it, though it is for rank {kept[0][1]}" if len(blocks[g]) == 1 else
        f"{got}, and kept {B.name(kept[0])}, which is for rank {kept[0][1]}") + (
        f", passing on {B.name(own[0])}, its own" if own else ": nobody passes it on")
    failure.hint = _kept_hint(n, g, x, blocks, own, right, dist, pos)


def _kept_hint(n, g, x, blocks, own, right, dist, pos):
    """The hint for rank x, which kept a block of message g meant for another rank."""
    step = "(rank + 1) % N, (rank + 2) % N" if right else "(rank - 1) % N, (rank - 2) % N"
    if own and pos == 0 and dist == sorted(dist, reverse=True):
        return (f"Rank {g.src}'s message lists its blocks farthest destination first, and rank {x} "
                f"kept the first one. Queue the blocks nearest destination first, those for ranks "
                f"{step}, ..., so that the first block of every message is the receiver's: "
                f"it keeps that one and passes on the rest.")
    if own and pos == len(dist) - 1 and dist == sorted(dist):
        return (f"Rank {x} kept the last block of the message. The blocks come nearest destination "
                f"first, so the one for the receiver is the first: keep that one and pass on the rest.")
    if own:
        return "Of the blocks that arrive, keep the one addressed to you and pass on the others."
    if all(len(bs) == 1 and bs[0][0] == e.src for e, bs in blocks.items()):
        sign = "(rank + k) % N" if right else "(rank - k) % N"
        shift = all(bs[0][1] == (e.src + (e.step if e.dst == (e.src + 1) % n else -e.step)) % n
                    for e, bs in blocks.items())
        return ("No rank ever passes a block on: every message carries one of the sender's own "
                "blocks. " + (f"At step k each rank sends its block for rank {sign}, the pairwise "
                f"exchange's choice: there that message goes straight to that rank, but here it "
                f"goes to the neighbour, which keeps it. " if shift else "")
                + "On a ring a block for a rank k places away must be passed on by the ranks in "
                "between: each step, send all the blocks still travelling; the receiver keeps the "
                "one for it and passes on the rest.")
    return ("Pass on every block that is not meant for you: a block for a rank k places away "
            "crosses k links.")
