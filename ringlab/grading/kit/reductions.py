"""What the graders of reductions share (``ring_allreduce``, ``ring_reduce_scatter``,
``hierarchical_allreduce``): the ring graders' cases, ``np.array_split``'s chunks of a
vector, and the reports of a wrong sum: the numbers, and "every message was right"."""

import numpy as np

from . import contributions as contrib
from ... import sums
from .checks import _ranks
from .frames import changed_in_place
from .report import Case, Failure, numbers


def ring_cases(rng):
    """The worlds and vectors of ring AllReduce and ReduceScatter. N=4 first: small
    enough to read, big enough that neighbours, phases and wrong slots are
    distinguishable. The edge cases N=2 and N=1 come last."""
    for n in (4, 3, 5, 6, 7, 8, 2, 1):
        lengths = [3 * n, 3 * n + 1] if n > 1 else [5]
        if n in (3, 5):
            lengths.append(n - 1)     # shorter than the world: some chunks are empty
        if n == 4:
            lengths.append(0)
        for length in lengths:
            # Random floats: every partial sum tells whose contributions it holds (ringlab.sums).
            inputs = sums.random_vectors(rng, n, length)
            yield Case(n, inputs, f"world_size={n}, length={length}")


def chunk_sizes(length, n):
    """The lengths of the N chunks np.array_split cuts a vector of ``length`` into."""
    return [len(c) for c in np.array_split(np.zeros(length), n)]


def chunk_slices(length, n):
    """The slices of the N chunks np.array_split cuts a vector of ``length`` into."""
    bounds = np.cumsum([0] + chunk_sizes(length, n))
    return [slice(int(bounds[c]), int(bounds[c + 1])) for c in range(n)]


def any_chunk(holds, length, size):
    """The slice ``[o, o + size)`` of a vector of ``length`` for which ``holds(slice)``
    is true, or None: a ring may cut its chunks otherwise than np.array_split (e.g.
    ceil(L/N) elements each, the last shorter), and is right if it cuts consistently
    (``tiles`` checks that). With random float data at most one offset matches."""
    return next((slice(o, o + size) for o in range(length - size + 1)
                 if holds(slice(o, o + size))), None)


def tiles(slices, length):
    """None if the non-empty ``slices`` cut range(length) into pieces, each element in
    exactly one; else what is wrong, in words."""
    covered = np.zeros(length, dtype=int)
    for sl in slices:
        covered[sl] += 1
    if np.all(covered == 1):
        return None
    twice, never = np.flatnonzero(covered > 1), np.flatnonzero(covered == 0)
    return (f"element {twice[0]} is in {covered[twice[0]]} of them" if twice.size else
            f"element {never[0]} is in none of them")


def ring_members(e, n, count):
    """The ``count`` ranks whose contributions ring message ``e`` has collected: its
    sender and the ranks before it on the side the message comes from."""
    side = 1 if e.dst == (e.src + 1) % n else -1
    return [(e.src - k * side) % n for k in range(count)]


def decoded_messages(res, n):
    """[(event, its payload decoded by the contribution probe)] of the messages of a
    probe run that carry something, in trace order."""
    return [(e, contrib.decode(res.payload(e), n)) for e in res.trace if res.payload(e).size]


def wrong_values(case, rank, out, ok, want, check):
    """The Failure for a result with wrong elements (``ok``: which are right),
    showing numbers."""
    bad = np.flatnonzero(~ok)
    where = f"elements {bad[0]}..{bad[-1]}" if len(bad) > 1 else f"element {bad[0]}"
    return Failure(case.label, check,
                   f"rank {rank} has wrong values at {len(bad)} of {len(out)} elements ({where})",
                   expected=numbers(want[bad]), got=numbers(out[bad]))


RETURN = ("Return the array your chunks are in after the last step (if chunks are views of one "
          "array, that array; if they are separate arrays, np.concatenate(chunks)).")


def right_messages_wrong_result(fail, result, returns=RETURN, shown=None):
    """Every message was right, so only what a rank returned is wrong: say so,
    with the numbers ``shown`` = (expected, got), and name an array a receiver
    changed in place (its sum went there). ``returns``: the hint that says what
    to return."""
    fail.what += ("\nEvery message was right: the ranks computed the sum, but what this rank "
                  "returned is not it.")
    if shown and shown != (fail.expected, fail.got):
        fail.what += f"\nIt returned {shown[1]} where the sum is {shown[0]}."
    fail.hint = returns
    changed = changed_in_place(result, getattr(result, "handed", []))
    if changed:
        e = changed[0]
        fail.what += (f"\nRank {e.dst} changed the array it received from rank {e.src} at step {e.step} "
                      f"in place (got += ...): the sum went into that array, not into its result.")
        fail.hint = ("Add what you receive into your own chunk (chunk += got), or store the sum back "
                     "(chunk[...] = got + chunk): adding into the received array leaves your result "
                     "without it. " + fail.hint)
    return fail


def ring_partial_sums(result, case, length, name):
    """Every message of a ring reduction carries one chunk of np.array_split(x, N),
    summed over exactly the contributions the ring has collected by its step:
    at step s <= N-1 the sender's and those of the s-1 ranks before it on the
    ring (the side the message comes from), at a later step (AllReduce's
    all-gather) all N. Read from the recorded payloads, on random float data,
    so nothing but the real partial sums can pass (see ``ringlab.sums``). ``name``:
    "ring AllReduce" or "ring ReduceScatter"."""
    if result.payloads is None:
        return None
    n, inputs = case.world_size, case.inputs
    chunks = chunk_slices(length, n)
    cut = {}        # step -> the slices its messages carry
    for e in result.trace:
        p = result.payload(e)
        if e.step < n:
            members = ring_members(e, n, e.step)
            want = (f"at step {e.step} a {name} message holds {e.step} contribution(s): rank {e.src}'s own "
                    + (f"and those of the {e.step - 1} rank(s) before it on the ring, "
                       f"{_ranks([m for m in members[1:]])}" if e.step > 1 else "only"))
        else:
            members = list(range(n))
            want = f"at step {e.step} (all-gather) a {name} message holds a complete chunk: all {n} contributions"
        where = next((ch for ch in chunks if sums.holds(p, inputs, members, ch)), None)
        if where is None and isinstance(p, np.ndarray) and p.ndim == 1:
            where = any_chunk(lambda sl: sums.holds(p, inputs, members, sl), length, p.size)
        if where is not None:
            cut.setdefault(e.step, []).append((e, where))
            continue
        if not isinstance(p, np.ndarray) or p.dtype != np.float64 or p.ndim != 1:
            held = f"an array of shape {p.shape} and dtype {p.dtype}"
        else:
            found = [(c, sums.which(p, inputs, ch)) for c, ch in enumerate(chunks) if ch.stop - ch.start == p.size]
            found = [(c, m) for c, m in found if m is not None]
            held = (f"chunk {found[0][0]} with the contributions of {_ranks(found[0][1])}" if found else
                    f"{p.size} values that are not a sum of the ranks' parts of any one chunk")
        return Failure(case.label, "every message carries the right partial sum",
                       f"at step {e.step} rank {e.src} sent rank {e.dst} {held}",
                       expected=f"one chunk of np.array_split(x, {n}), summed over exactly the right ranks: {want}",
                       got=f"{held}: {numbers(p)}",
                       hint="Send your chunk as it is after adding what you received: the real partial sum, "
                            "unchanged, as float64. The grader reads every message; data packed, transformed "
                            "or left out on the way do not pass.")
    for step, sent in sorted(cut.items()):
        wrong = tiles([sl for _, sl in sent], length)
        if wrong:
            return Failure(case.label, "every message carries the right partial sum",
                           f"at step {step} the {name}'s messages carry chunks that do not cut the "
                           f"vector into pieces: {wrong}",
                           expected="at every step, one chunk from every rank, together each "
                                    "element of the vector exactly once",
                           got="; ".join(f"rank {e.src}: elements {sl.start}..{sl.stop - 1}"
                                         for e, sl in sent if sl.stop > sl.start),
                           hint=CUT_HINT)
    return None


CUT_HINT = ("Cut the vector into N chunks once (np.array_split(x, world_size)) and, at every "
            "step, have each rank send a different one.")
