"""Where the player draws each rank, chosen from who talks to whom.

- ``"line"``: every message goes between ranks r and r+1 (a pipeline, a chain);
- ``"ring"``: every message goes between ring neighbours, wrap-around included;
- ``"tree"``: the pairs that talk form a tree over all ranks (broadcast, reduce);
- ``"circle"``: anything else (all-to-all, recursive doubling): ranks on a circle.

    >>> from ringlab import Event, Trace
    >>> infer_layout(Trace([Event(1, 0, 1), Event(2, 1, 2)], 3))
    'line'
    >>> infer_layout(Trace([Event(1, 0, 1), Event(1, 0, 2), Event(2, 1, 3)], 4))
    'tree'
"""

from __future__ import annotations

import math

LAYOUTS = ("ring", "tree", "line", "circle")


def _pairs(trace):
    return {tuple(sorted((e.src, e.dst))) for e in trace if e.src != e.dst}


def infer_layout(trace):
    """The layout that fits the traffic of ``trace`` (see the module docstring)."""
    n, pairs = trace.world_size, _pairs(trace)
    if n <= 2 or not pairs:
        return "ring"
    if all(b - a == 1 for a, b in pairs):
        return "line"
    if all((b - a) % n in (1, n - 1) for a, b in pairs):
        return "ring"
    if _tree_root(trace, pairs) is not None:
        return "tree"
    return "circle"


def _tree_root(trace, pairs):
    """The root if ``pairs`` is a spanning tree of the ranks, else None."""
    n = trace.world_size
    if len(pairs) != n - 1:
        return None
    parent = list(range(n))              # union-find: a cycle means "not a tree"

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a
    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra == rb:
            return None
        parent[ra] = rb
    # n - 1 edges and no cycle: connected. The root of a broadcast is the only
    # rank that never receives; of a reduce, the only one that never sends.
    senders, receivers = {e.src for e in trace}, {e.dst for e in trace}
    for only in (senders - receivers, receivers - senders):
        if len(only) == 1:
            return only.pop()
    return 0


def layout(trace, kind=None):
    """``{"kind", "positions", "links"}``: the kind of layout, one (x, y) per rank
    (y grows downwards, as on a screen; units of one node spacing for trees and
    lines, of the radius for rings and circles) and the faint background links."""
    kind = infer_layout(trace) if kind is None else kind
    if kind not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {kind!r}")
    n = trace.world_size
    if kind == "line":
        return {"kind": kind, "positions": [(r, 0) for r in range(n)],
                "links": [(r, r + 1) for r in range(n - 1)]}
    if kind == "tree":
        pairs = _pairs(trace)
        root = _tree_root(trace, pairs)
        if root is None:
            raise ValueError("layout='tree' needs the ranks that talk to form a tree; "
                             f"this trace has {len(pairs)} distinct pairs for {n} ranks")
        return {"kind": kind, "positions": _tree_positions(n, pairs, root), "links": sorted(pairs)}
    # Rank 0 at the top, increasing clockwise (like ringlab.show.figures.ring_positions).
    angles = [-math.pi / 2 + 2 * math.pi * r / n for r in range(n)]
    positions = [(round(math.cos(a), 6), round(math.sin(a), 6)) for a in angles]
    links = [(r, (r + 1) % n) for r in range(n)] if kind == "ring" and n > 1 else []
    return {"kind": kind, "positions": positions, "links": links}


def _tree_positions(n, pairs, root):
    """A tidy tree: leaves side by side in order, each parent centred over its children."""
    nbrs = {r: [] for r in range(n)}
    for a, b in pairs:
        nbrs[a].append(b)
        nbrs[b].append(a)
    pos, next_leaf = {}, [0]

    def place(node, parent, depth):
        kids = sorted(k for k in nbrs[node] if k != parent)
        if not kids:
            pos[node] = (next_leaf[0], depth)
            next_leaf[0] += 1
        else:
            for k in kids:
                place(k, node, depth + 1)
            pos[node] = ((pos[kids[0]][0] + pos[kids[-1]][0]) / 2, depth)
    place(root, None, 0)
    return [pos[r] for r in range(n)]
