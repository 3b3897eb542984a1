"""Matplotlib figures for the book: the ring, the timeline of a trace, holdings.

Each function draws on ``ax`` (a new figure if None) and returns the axes, so
figures can be combined::

    >>> import matplotlib; matplotlib.use("Agg")
    >>> ax = draw_ring(4, arrow_labels={r: f"c{r}" for r in range(4)})
    >>> len(ax.patches) >= 4         # 4 ranks (and 4 arrows)
    True
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np

OP_COLOURS = {"reduce": "tab:blue", "copy": "tab:green", None: "tab:gray"}


def _axes(ax, size):
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def ring_positions(world_size, radius=1.0):
    """(x, y) of each rank: rank 0 at the top, ranks increase clockwise."""
    angles = [math.pi / 2 - 2 * math.pi * r / world_size for r in range(world_size)]
    return [(radius * math.cos(a), radius * math.sin(a)) for a in angles]


def draw_ring(world_size, *, node_labels=None, arrow_labels=None, direction=1,
              highlight=(), title=None, ax=None):
    """Ranks on a circle with an arrow from each rank to its right neighbour
    (``direction=1``: rank r -> r + 1, clockwise).

    ``node_labels``: {rank: text} written outside each rank (e.g. its chunks);
    ``arrow_labels``: {rank: text} written on the arrow leaving that rank
    (e.g. the chunk it sends); ``highlight``: ranks drawn in orange.
    """
    ax = _axes(ax, (4, 4))
    n = world_size
    pos = ring_positions(n)
    node_r = 0.17 if n <= 8 else 0.5 / math.sqrt(n)
    if n > 1:
        for r in range(n):
            dst = (r + direction) % n
            (x0, y0), (x1, y1) = pos[r], pos[dst]
            bend = -0.25 if n > 2 else -0.35      # two ranks: the two arrows must not overlap
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                        arrowprops=dict(arrowstyle="-|>", color="0.3", lw=1.4,
                                        shrinkA=node_r * 95, shrinkB=node_r * 95,
                                        connectionstyle=f"arc3,rad={bend * direction}"))
            if arrow_labels and r in arrow_labels:
                mx, my = (x0 + x1) / 2, (y0 + y1) / 2
                if n > 2:      # just outside the arc's midpoint, radially
                    norm = math.hypot(mx, my) or 1.0
                    lx, ly = mx / norm * 1.28, my / norm * 1.28
                else:          # two ranks: beside the arc, on the side it bulges to
                    f = bend * direction
                    lx, ly = mx + 1.3 * f * (y1 - y0), my - 1.3 * f * (x1 - x0)
                ax.text(lx, ly, arrow_labels[r], ha="center", va="center", fontsize=9,
                        color="tab:blue", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"))
    for r, (x, y) in enumerate(pos):
        colour = "tab:orange" if r in highlight else "#dbe9f6"
        ax.add_patch(plt.Circle((x, y), node_r, fc=colour, ec="0.2", zorder=3))
        ax.text(x, y, str(r), ha="center", va="center", fontsize=11, zorder=4)
        if node_labels and r in node_labels:
            # Outside the node, aligned away from the circle so text never covers it.
            ha = "left" if x > 0.3 else ("right" if x < -0.3 else "center")
            va = "bottom" if y > 0.3 else ("top" if y < -0.3 else "center")
            d = 1 + node_r + 0.06
            ax.text(x * d, y * d, node_labels[r], ha=ha, va=va, fontsize=8)
    lim = 2.1 if node_labels else 1.5
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def draw_timeline(trace, *, labels=True, ax=None, title=None):
    """A space-time diagram of ``trace``: one horizontal line per rank, one arrow
    per message, drawn over the step in which it travels (from ``step - 1`` to
    ``step``). Colour = op (blue reduce, green copy, grey unlabelled)."""
    n, steps = trace.world_size, max(trace.steps, 1)
    ax = _axes(ax, (1.2 + 0.9 * steps, 0.8 + 0.7 * n))
    for r in range(n):
        ax.plot([0, steps], [r, r], color="0.8", lw=1, zorder=1)
    for e in trace:
        colour = OP_COLOURS.get(e.op, "tab:purple")
        ax.annotate("", xy=(e.step, e.dst), xytext=(e.step - 1, e.src),
                    arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.3, shrinkA=3, shrinkB=3))
        if labels and e.chunk is not None:
            # Short arrows: label at the middle (half-way between two rank lines).
            # Longer ones (the ring's wrap-around): where they cross a rank line,
            # so the labels of crossing arrows never sit on top of each other.
            d = abs(e.dst - e.src)
            t = 0.5 if d <= 1 else (d // 2) / d
            ax.text(e.step - 1 + t, e.src + t * (e.dst - e.src), f"c{e.chunk}", fontsize=8, ha="center",
                    va="center", color=colour, bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.set_xticks(range(steps + 1))
    ax.set_xlabel("step")
    ax.set_ylim(n - 0.5, -0.5)      # rank 0 at the top, like a table
    ax.set_xlim(-0.2, steps + 0.2)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def draw_holdings(h, *, steps=None, ncols=4, axes=None):
    """Small multiples of ``ringlab.views.holdings``: for each step a grid of
    ranks (rows) x chunks (columns), each cell showing how many contributions
    it holds; full cells are dark. Returns the array of axes."""
    steps = list(range(len(h))) if steps is None else list(steps)
    n = len(h[0])
    chunks = list(h[0][0])
    if axes is None:
        nrows = -(-len(steps) // ncols)
        _, axes = plt.subplots(nrows, ncols, figsize=(2.2 * ncols, 0.9 + 0.45 * n * nrows),
                               squeeze=False, layout="constrained")
    axes = np.asarray(axes).ravel()
    for ax, s in zip(axes, steps):
        counts = np.array([[len(h[s][r][c]) for c in chunks] for r in range(n)])
        ax.imshow(counts, cmap="Blues", vmin=0, vmax=n)
        for r in range(n):
            for j, v in enumerate(counts[r]):
                ax.text(j, r, str(v), ha="center", va="center", fontsize=9,
                        color="white" if v == n else "black")
        ax.set_xticks(range(len(chunks)), [f"c{c}" for c in chunks], fontsize=8)
        first = ax.get_subplotspec() is None or ax.get_subplotspec().is_first_col()
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)] if first else [], fontsize=8)
        ax.set_title("start" if s == 0 else f"after step {s}", fontsize=9)
    for ax in axes[len(steps):]:
        ax.axis("off")
    return axes
