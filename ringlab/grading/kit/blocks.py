"""Follow AlltoAll blocks through a trace, whatever the program calls them.

The AlltoAll graders give every element of every block a different value, so
the payload of any message reads back as the set of blocks it carries, and
whether it carries them whole, even when the program stacks, concatenates or
reorders them and labels nothing. A message must hold whole blocks and
nothing else: a value that belongs to no block (a header, or data packed or
transformed on the way) fails, and the values are random floats, so no block
fits in fewer bytes than its own.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .report import Case, Failure, numbers

from .running import plain_array, run_case


def cases(rng):
    """Shared by ``alltoall`` and ``ring_alltoall``: blocks of one length per case."""
    for n in (4, 3, 5, 6, 7, 8, 2, 1):
        for length in ([2, 1] if n > 1 else [3]):
            # Random floats: all different (with overwhelming probability; checked), none a
            # whole number, and none can be packed into fewer bytes.
            values = rng.uniform(1, 2, (n, n, length)) * rng.choice([-1.0, 1.0], (n, n, length))
            assert len(np.unique(values)) == values.size
            inputs = [[values[r, c].copy() for c in range(n)] for r in range(n)]
            yield Case(n, inputs, f"world_size={n}, block length={length}")


def index(case):
    """value -> (src, dst, element) for every element of every block of the case."""
    return {float(v): (s, d, j) for s, row in enumerate(case.inputs)
            for d, block in enumerate(row) for j, v in enumerate(block)}


def contents(payload, idx):
    """{(src, dst): number of that block's elements} in one message, in the
    order the blocks first appear in it."""
    found = defaultdict(set)
    for v in np.asarray(payload).ravel().tolist():
        hit = idx.get(v) if isinstance(v, float) else None
        if hit is not None:
            found[hit[:2]].add(hit[2])
    return {b: len(js) for b, js in found.items()}


def name(block):
    return f"block {block[0]}->{block[1]}"


def run_and_check_result(program, case, backend, missing_hint):
    """Checks 1-2 of both AlltoAll graders: (result, None), or (result, Failure)
    for a wrong result (so the caller can explain it from the trace), or
    (None, Failure) when the run failed. ``missing_hint`` is the hint for a
    slot that holds None (nothing arrived)."""
    result, failure = run_case(program, case, backend)
    if failure:
        return None, failure
    n, idx = case.world_size, index(case)
    for r, out in enumerate(result.outputs):
        if type(out) not in (list, tuple) or len(out) != n:
            return result, Failure(
                case.label, "every rank returns its received blocks",
                f"rank {r} returned {type(out).__name__}" + (f" of length {len(out)}" if hasattr(out, "__len__") else ""),
                expected=f"a list of {n} arrays: out[c] = the block rank c sent to rank {r}",
                got=repr(out)[:200])
        for c, got in enumerate(out):
            want = case.inputs[c][r]
            if isinstance(got, np.ndarray) and type(got) is not np.ndarray:   # may redefine ==
                return result, plain_array(case, f"rank {r}'s out[{c}]", got, f"{name((c, r))}")
            if (isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == want.shape
                    and np.array_equal(got, want)):
                continue
            held = idx.get(_first_value(got)) if isinstance(got, np.ndarray) and got.size else None
            hint = "out[c] must be what rank c sent to you: rank c's blocks[your rank]."
            if got is None:
                holds, hint = "None: nothing was stored there", missing_hint
                if c == r:
                    hint = ("Your own block never travels, so no message fills out[rank]: keep it "
                            "yourself, out[rank] = blocks[rank].")
            elif held is None:
                holds = "something that is not a block" + (f" (shape {got.shape})" if isinstance(got, np.ndarray) else "")
            else:
                holds = f"{name(held[:2])}"
                if held[:2] == (r, c):
                    hint = ("That is your own block for rank c, blocks[c]: you kept what you send instead "
                            "of what you received.")
                elif held[1] == r:
                    hint = (f"The block is for you, but it came from rank {held[0]}: put the block "
                            f"received from rank c at out[c].")
            return result, Failure(case.label, "every rank ends with the block each rank sent it",
                                 f"rank {r}'s out[{c}] holds {holds}",
                                 expected=f"{name((c, r))}: {want}", got=repr(got)[:120], hint=hint)
    return result, None


def _first_value(array):
    """An array's first element as a float, to look its block up by; None if it
    has none (an array of strings or objects, say)."""
    try:
        return float(np.ravel(array)[0])
    except (TypeError, ValueError):
        return None


def hops(case, result):
    """(failure, {block: [events that carried it]}): messages must carry whole
    blocks, and at least one block each."""
    idx = index(case)
    carried = defaultdict(list)
    length = len(case.inputs[0][0])
    for e in result.trace:
        payload = result.payload(e)
        found = contents(payload, idx) if payload.dtype == np.float64 else {}
        if not found:
            return Failure(case.label, "every message carries blocks",
                           f"at step {e.step} rank {e.src} sent rank {e.dst} a message with no block in it",
                           expected="every message: one or more whole blocks", got=e.describe(),
                           hint="Send only blocks; there is nothing else to send."), None
        for block, count in found.items():
            if count != length:
                return Failure(case.label, "blocks travel whole",
                               f"at step {e.step} rank {e.src} sent rank {e.dst} {count} of the {length} "
                               f"elements of {name(block)}",
                               expected=f"whole blocks of {length} elements", got=f"{count} elements",
                               hint="Send each block whole, in one message."), None
            carried[block].append(e)
        if payload.size != length * len(found):
            return Failure(case.label, "every message carries only whole blocks",
                           f"at step {e.step} rank {e.src} sent rank {e.dst} {payload.size} values: "
                           f"{len(found)} block(s) of {length} and {payload.size - length * len(found)} "
                           f"value(s) that belong to no block, or repeat one",
                           expected=f"whole blocks and nothing else: {length * len(found)} values",
                           got=f"{payload.size} values: {numbers(payload, 8)}",
                           hint="Send the blocks exactly as they are, each once: no headers, no data "
                                "packed or transformed on the way."), None
    return None, carried


def undelivered(case, carried):
    """A Failure for a block no message brought to its destination (a rank
    cannot have another rank's block without a message), or None."""
    for c in range(case.world_size):
        for d in range(case.world_size):
            if c != d and not any(e.dst == d for e in carried.get((c, d), ())):
                return Failure(case.label, "every block is delivered by a message",
                               f"rank {d}'s out[{c}] holds {name((c, d))}, but no message brought it to rank {d}",
                               expected=f"{name((c, d))} in a message to rank {d}", got="no such message",
                               hint="Every block must travel to its destination in a message; a rank has "
                                    "no other way to get another rank's data.")
    return None


def own_block_travels(case, e, block, hint=None):
    """The Failure for a rank sending its block for itself (``block`` = (r, r))."""
    return Failure(case.label, "a rank's own block never travels",
                   f"at step {e.step} rank {e.src} sent rank {e.dst} {name(block)}, "
                   f"rank {block[0]}'s block for itself",
                   expected=f"{name(block)} stays on rank {block[0]}: out[rank] = blocks[rank]",
                   got=e.describe(),
                   hint=hint or "Keep blocks[rank] for yourself and send only the other blocks.")
