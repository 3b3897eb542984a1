"""Grader for exercise ``tree_broadcast``.

Signature: ``program(comm, x, root) -> array``. ``x`` is the data (a float64
vector) on rank ``root`` and ``None`` on every other rank; every rank returns
the data. The tree is the binary heap laid out from the root: the rank at
position i = (rank - root) % N has children at positions 2i+1 and 2i+2 (those
below N) and its parent at position (i - 1) // 2; position p is rank
(p + root) % N.

Checks, on world sizes 1 to 8 and 12, roots 0 and a random other rank, with
fresh random data:

1. it runs: no exception, deadlock, endless loop or unreceived message;
2. every rank returns exactly the root's data;
3. every message goes from a rank to one of its children in the tree;
4. the root receives nothing, every other rank receives exactly one message;
5. every message carries the root's data, all of it, unchanged: L float64
   values, L * 8 bytes (read from the recorded payloads, in the simulator).

The data are random floats, so nothing smaller than them can carry them.

Any correct binary-tree broadcast passes: left child first or right child
first, send or isend, labelled or not. (Its step count needs no check: with
one message per tree edge it is fixed by the tree, about 2 log2 N; see
``ringlab.cost.binary_tree_steps``.)
"""

from ..kit import broadcast
from ...deadlock import waits_for
from ..kit.report import Failure
from ...errors import DeadlockError

NAME = "tree_broadcast"

HINTS = {
    "flat": "The root sends to every rank itself: that is a flat broadcast (N-1 steps for the root "
            "alone). In the tree the root sends only to positions 1 and 2, and every rank forwards "
            "to its own children.",
    "chain": "Each rank passes the data to the next one: that is a chain (N-1 steps). In the tree "
             "position i forwards to positions 2i+1 and 2i+2.",
    "binomial tree": "That is a binomial tree (a fine broadcast, and the next exercise), but this "
                     "exercise asks for the binary heap: children at positions 2i+1 and 2i+2.",
    "binary tree around rank 0": "Your tree has rank 0 at the top. Lay it out from the root: "
                                 "position i = (rank - root) % N, rank = (position + root) % N.",
}
GENERIC = ("Position i = (rank - root) % N receives from position (i - 1) // 2 and sends only to "
           "positions 2i+1 and 2i+2 (those below N).")


cases = broadcast.cases


def check(program, case, backend="sim"):
    return broadcast.check(program, case, backend, _explain_run_failure, _tree)


def _tree(result, case):
    """Checks 3-5."""
    n, root, trace = case.world_size, case.info["root"], result.trace
    for e in trace:
        p, c = (e.src - root) % n, (e.dst - root) % n
        if c not in (2 * p + 1, 2 * p + 2):
            kids = [(k + root) % n for k in (2 * p + 1, 2 * p + 2) if k < n]
            return Failure(
                case.label, "messages go from parent to child in the tree",
                f"at step {e.step} rank {e.src} (position {p}) sent to rank {e.dst} (position {c}), "
                f"which is not one of its children",
                expected=(f"position {p} sends only to positions {2 * p + 1} and {2 * p + 2}: "
                          + (f"rank(s) {', '.join(map(str, kids))}" if kids else "none here, it is a leaf")),
                got=f"rank {e.src} -> rank {e.dst}",
                hint=("Messages only go down the tree: send nothing back to the parent."
                      if p and c == (p - 1) // 2
                      else HINTS.get(broadcast.shape(trace, n, root), GENERIC)))
    return (broadcast.receives(
                trace, case, root,
                shape_hint="Send the whole vector to each child once, in one message: then every rank "
                           "receives exactly once.")
            or broadcast.payloads(result, case))


HEAP = ("In the heap laid out from the root, position i = (rank - root) % N has its children at "
        "positions 2i+1 and 2i+2 (those below N) and its parent at position (i - 1) // 2; "
        "position p is rank (p + root) % N.")


def _explain_run_failure(failure, case):
    """A deadlock or a bad peer, in terms of heap positions."""
    n, root, err = case.world_size, case.info["root"], failure.error
    pos = lambda r: (r - root) % n  # noqa: E731
    if isinstance(err, DeadlockError):
        failure.hint = f"{failure.hint} {HEAP}"
        for w, what in sorted(err.waiting.items()):
            kind, peer = waits_for(what) or (None, None)
            i = pos(w)
            if kind == "recv" and i and pos(peer) != (i - 1) // 2:
                failure.hint = (
                    f"Rank {w} (position {i}) waits for rank {peer} (position {pos(peer)}), but the parent "
                    f"of position {i} is position ({i} - 1) // 2 = {(i - 1) // 2}, rank {((i - 1) // 2 + root) % n}"
                    + (f" ({i} // 2 would be its parent if positions counted from 1)" if pos(peer) == i // 2 else "")
                    + ". " + HEAP)
                return
    elif broadcast.bad_peer(err):
        i = pos(err.rank)
        past = [c for c in (2 * i + 1, 2 * i + 2) if c >= n]
        if past:
            wraps = ", ".join(f"{c} -> rank {(c + root) % n}" for c in past)
            failure.hint = (f"Rank {err.rank} is position {i}, whose child positions 2i+1 = {2 * i + 1} and "
                            f"2i+2 = {2 * i + 2} exist only below N = {n}. Positions past N - 1 = {n - 1} "
                            f"are not in the tree; wrapping them around with % N makes them real ranks "
                            f"({wraps}). Skip a child position c >= N (send only if c < N).")

