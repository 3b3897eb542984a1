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

from .style import PT

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
                ax.text(lx, ly, arrow_labels[r], ha="center", va="center", fontsize=PT,
                        color="tab:blue", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"))
    for r, (x, y) in enumerate(pos):
        colour = "tab:orange" if r in highlight else "#dbe9f6"
        ax.add_patch(plt.Circle((x, y), node_r, fc=colour, ec="0.2", zorder=3))
        ax.text(x, y, str(r), ha="center", va="center", fontsize=PT, zorder=4)
        if node_labels and r in node_labels:
            # Outside the node, aligned away from the circle so text never covers it.
            ha = "left" if x > 0.3 else ("right" if x < -0.3 else "center")
            va = "bottom" if y > 0.3 else ("top" if y < -0.3 else "center")
            d = 1 + node_r + 0.06
            ax.text(x * d, y * d, node_labels[r], ha=ha, va=va, fontsize=PT)
    lim = 2.1 if node_labels else 1.5
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=PT)
    return ax


def draw_holdings(h, *, steps=None, ncols=4, axes=None):
    """Small multiples of ``ringlab.show.views.holdings``: for each step a grid of
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
                ax.text(j, r, str(v), ha="center", va="center", fontsize=PT,
                        color="white" if v == n else "black")
        ax.set_xticks(range(len(chunks)), [f"c{c}" for c in chunks], fontsize=PT)
        first = ax.get_subplotspec() is None or ax.get_subplotspec().is_first_col()
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)] if first else [], fontsize=PT)
        ax.set_title("start" if s == 0 else f"after step {s}", fontsize=PT)
    for ax in axes[len(steps):]:
        ax.axis("off")
    return axes


# -- Whole-trace figures for print and PDF. Each returns the matplotlib Figure;
# -- the data each one draws comes from a function of its own, tested by hand.

WIDTH = 7.9     # inches: the widest figure shown at (about) full size in the book's column
ROW = 0.24      # inches: the least room a line of 12-point text needs


def _every(count, room, need=ROW):
    """Label every k-th of ``count`` things sharing ``room`` inches, k the least
    that leaves each label ``need`` inches: fewer labels, never smaller ones."""
    return max(1, math.ceil(need * count / max(room, 1e-9)))


def _figure(width, height, left=0.9, right=0.3, bottom=0.55, top=0.4):
    """A figure whose margins are fixed in inches. (Constrained layout measures
    every label several times over: too slow for ringlab.show.widgets' live redraws.)"""
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)
    return fig, ax


def holdings_grid(trace):
    """``(counts, chunks)``: ``counts[r, s, k]`` is how many ranks' contributions
    rank ``r`` holds in chunk ``chunks[k]`` after step ``s`` (``s = 0``: the start).
    Needs a labelled trace (see ``ringlab.show.views.holdings``)."""
    from .views import holdings
    h = holdings(trace)
    chunks = list(h[0][0]) if trace.world_size else []
    counts = np.array([[[len(state[r][c]) for c in chunks] for state in h]
                       for r in range(trace.world_size)], dtype=int).reshape(trace.world_size, len(h), len(chunks))
    return counts, chunks


def plot_holdings_grid(trace, *, per_chunk=None, numbers=None, title=None):
    """Ranks x steps: each cell says how many contributions a rank holds after
    that step. ``per_chunk=True``: one row per chunk inside each rank's band
    (default when that is at most 64 rows); ``False``: summed over chunks.
    ``numbers``: write the count in each cell (default: if at most 200 cells)."""
    counts, chunks = holdings_grid(trace)
    n, steps, c = counts.shape
    if counts.size == 0:
        raise ValueError("no messages, so nothing to draw: the trace is empty")
    per_chunk = n * c <= 64 if per_chunk is None else per_chunk
    rows = c if per_chunk else 1
    image = counts.transpose(0, 2, 1).reshape(n * c, steps) if per_chunk else counts.sum(axis=2)
    top = n if per_chunk else n * c                       # the value of a complete cell
    minor = per_chunk and n * c <= 32                       # chunk names beside the rows
    left = 1.6 if minor else 1.0
    # At least 3.2 in across, for the title; the colour bar's label in two lines, at most
    # 2.5 in each, beside at least 2.6 in of axes.
    width, height = min(WIDTH, left + 1.5 + max(3.2, 0.45 * steps)), min(11, max(3.7, 1.3 + 0.3 * n * rows))
    fig, ax = _figure(width, height, left=left, right=1.5, bottom=0.65)
    room_x, room_y = width - left - 1.5, height - 1.05        # the axes, in inches
    im = ax.imshow(image, cmap="Blues", vmin=0, vmax=top, aspect="auto", interpolation="nearest")
    # The counts in the cells: only where a 12-point number fits (and not thousands of texts).
    fits = room_x / steps >= 0.1 * (len(str(top)) + 1) and room_y / (n * rows) >= ROW
    if (image.size <= 200 and fits) if numbers is None else numbers:
        for (i, s), v in np.ndenumerate(image):
            ax.text(s, i, str(v), ha="center", va="center", fontsize=PT,
                    color="white" if v > 0.6 * top else "black")
    for r in range(1, n):                                 # a rule between ranks' bands
        ax.axhline(r * rows - 0.5, color="0.2", lw=1.2 if per_chunk else 0.4)
    k = _every(n, room_y)
    ax.set_yticks([r * rows + (rows - 1) / 2 for r in range(0, n, k)],
                  [f"rank {r}" for r in range(0, n, k)], fontsize=PT)
    if minor:
        ax.set_yticks(range(n * c), [f"c{k}" for _ in range(n) for k in chunks], minor=True, fontsize=PT)
        ax.tick_params(axis="y", which="major", pad=30)
        ax.yaxis.remove_overlapping_locs = False      # odd c: a chunk's row is its rank's middle
    ax.set_xticks(range(0, steps, _every(steps, room_x, 0.3)))
    ax.set_xlabel("after step (0 = start)")
    what = "contributions held per chunk" if per_chunk else "contributions held, all chunks"
    cbar = fig.colorbar(im, ax=ax, shrink=0.8, fraction=0.05, pad=0.02, label=f"{what}\n(complete = {top})")
    cbar.ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set_title(title or f"Who holds what: {n} ranks, {steps - 1} steps", fontsize=PT)
    return fig


def spacetime_arrows(trace, time_model=None):
    """One dict per message: ``src``, ``dst``, ``t0`` (leaves), ``t1`` (arrives),
    ``step``, ``chunk``, ``op``. Times from ``ringlab.show.timeline.event_times``; the
    default puts the message of step ``s`` on ``[s - 1, s]``, in steps."""
    from .timeline import StepTime, event_times
    times = event_times(trace, StepTime(unit=1.0) if time_model is None else time_model)
    return [dict(src=e.src, dst=e.dst, t0=t, t1=t + d, step=e.step, chunk=e.chunk, op=e.op)
            for e, (t, d) in zip(trace, times)]


def plot_spacetime(trace, time_model=None, *, labels=None, title=None, ax=None):
    """A space-time diagram: one line per rank (rank 0 on top), time to the
    right, one arrow per message from sender (when it leaves) to receiver (when
    it arrives). Colour = op. ``time_model``: see ``ringlab.show.timeline``; by
    default the message of step s travels from s - 1 to s. Pass ``ax`` to draw
    into a subplot."""
    arrows = spacetime_arrows(trace, time_model)
    n = trace.world_size
    end = max([a["t1"] for a in arrows], default=1.0) or 1.0
    standalone = ax is None
    if standalone:
        labelled = len(arrows) <= 64 if labels is None else labels
        fig, ax = _figure(min(WIDTH, 2.8 + 0.7 * max(trace.steps, 1)),   # labels: room between them
                          min(9, 1.3 + (0.6 if labelled else 0.45) * n),
                          left=0.85 if n <= 10 else 1.0, right=1.05, bottom=0.65)
    else:
        fig = ax.figure
    for r in range(n):
        ax.axhline(r, color="0.85", lw=1, zorder=1)
    labels = len(arrows) <= 64 if labels is None else labels
    ops = sorted({a["op"] for a in arrows}, key=lambda o: (o is None, str(o)))   # unlabelled last
    for op in ops:      # one quiver per colour: thousands of arrows still draw fast
        mine = [a for a in arrows if a["op"] == op]
        ax.quiver([a["t0"] for a in mine], [a["src"] for a in mine],
                  [a["t1"] - a["t0"] for a in mine], [a["dst"] - a["src"] for a in mine],
                  angles="xy", scale_units="xy", scale=1, color=OP_COLOURS.get(op, "tab:purple"),
                  width=0.0025, headwidth=5, headlength=7, headaxislength=6, zorder=2)
    for a in arrows:
        colour = OP_COLOURS.get(a["op"], "tab:purple")
        if labels and a["chunk"] is not None:
            # A third of the way along: arrows that cross at their middles do not
            # put their labels on top of each other.
            name = str(a["chunk"]) if len(str(a["chunk"])) <= 10 else str(a["chunk"])[:9] + "…"
            ax.text(a["t0"] + (a["t1"] - a["t0"]) / 3, a["src"] + (a["dst"] - a["src"]) / 3, f"c{name}",
                    fontsize=PT, ha="center", va="center", color=colour,
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
    box = ax.get_position()
    room_x, room_y = box.width * fig.get_figwidth(), box.height * fig.get_figheight()
    k = _every(n, room_y)
    ax.set_yticks(range(0, n, k), [f"rank {r}" for r in range(0, n, k)], fontsize=PT)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel("step" if time_model is None else "time (s)")
    if time_model is None and trace.steps <= 30:
        ax.set_xticks(range(0, trace.steps + 1, _every(trace.steps + 1, room_x, 0.3)))
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    # The legend explains the colours of ops. Messages sent without op= are grey:
    # named "no op=" beside labelled ones, and no legend at all when every message is
    # unlabelled (one grey entry would only say "None").
    named = [o for o in ops if o is not None]
    if standalone and named:   # (in a grid of subplots the legend would cover the next one)
        ax.legend(handles=[plt.Line2D([], [], color=OP_COLOURS.get(o, "tab:purple"),
                                      label="no op=" if o is None else str(o)) for o in ops],
                  loc="upper left", bbox_to_anchor=(1, 1), fontsize=PT, frameon=False)
    ax.set_title(title or f"Messages over time: {n} ranks, {len(arrows)} messages", fontsize=PT)
    return fig


def bytes_by_rank(trace):
    """``{span: [bytes sent by rank 0, rank 1, ...]}``: what each rank sends,
    split by the collective call that sent it (``""`` outside any call)."""
    out = {}
    for e in trace:
        out.setdefault(e.span, [0] * trace.world_size)[e.src] += e.nbytes
    return dict(sorted(out.items()))


def plot_bytes_sent(trace, *, title=None):
    """Bytes each rank sends (stacked by collective call) next to what it receives."""
    parts, received = bytes_by_rank(trace), trace.bytes_received()
    n = trace.world_size
    x = np.arange(n)
    width = min(WIDTH, 3.4 + 0.45 * n)
    fig, ax = _figure(width, 3.4, left=1.0, right=2.4, bottom=0.65)
    bottom = np.zeros(n)
    for span, sent in parts.items():
        ax.bar(x - 0.2, sent, width=0.4, bottom=bottom, label=f"sent: {span or '(no span)'}")
        bottom += sent
    ax.bar(x + 0.2, received, width=0.4, fc="0.85", ec="0.4", label="received")
    k = _every(n, width - 3.4, 0.1 * (len(str(n - 1)) + 1))
    ax.set_xticks(x[::k], [str(r) for r in x[::k]], fontsize=PT)
    ax.set_xlabel("rank")
    ax.set_ylabel("bytes")
    ax.legend(fontsize=PT, frameon=False, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set_title(title or f"Bytes per rank: {trace.total_bytes} in total", fontsize=PT)
    return fig
