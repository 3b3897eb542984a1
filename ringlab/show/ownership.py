"""Who holds what: the picture a parallel strategy starts from.

Each strategy is first a rule for where the model's tensors and the batch live:
data parallelism copies the parameters and splits the batch, tensor parallelism
cuts each weight matrix by columns or rows, a pipeline gives each rank some
layers, ZeRO cuts the flat parameter, gradient and optimizer vectors into N
shards. ``plot_who_holds_what`` draws such a rule as a grid: one row per rank,
one column per tensor, and in each cell a bar along the tensor (0 to 1) with
the parts this rank holds filled in, coloured by what they are.

The holdings come from the caller, read off a real run or the library's own
sharding code (the book's chapters do that), so the picture cannot disagree
with the code it illustrates::

    >>> import matplotlib; matplotlib.use("Agg")
    >>> h = {r: [Piece("W1", r / 2, (r + 1) / 2, "parameters", f"cols {4 * r}-{4 * r + 3}")]
    ...      for r in range(2)}
    >>> fig = plot_who_holds_what(h)
    >>> [t.get_text() for t in fig.axes[0].texts]
    ['W1', 'cols 0-3', 'cols 4-7']
    >>> held_fraction(h, 1, "W1")
    0.5
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from .memory import KNOWN

# What a piece is, and its colour; the Part 5 colours are the memory figures' own.
KINDS = {"parameters": KNOWN["params"], "gathered": KNOWN["params.full"],
         "gradients": KNOWN["grads"], "full gradients": KNOWN["grads.full"],
         "optimizer": KNOWN["adam.m"],
         "activations": KNOWN["activations"], "data": "#17becf", "master": KNOWN["master"]}
LIGHT = {"gathered", "full gradients"}     # kinds whose texts are written in black
FONT = 12            # points: 16.7 px at 100 dpi, above the body text (ringlab.show.style)


@dataclass(frozen=True)
class Piece:
    """The part ``[start, stop)`` (fractions of its length) of ``tensor`` a rank
    holds, of kind ``kind`` (a key of ``KINDS``), with an optional ``text``
    written on it ("heads 0-3", "layers 4-7")."""
    tensor: str
    start: float
    stop: float
    kind: str = "parameters"
    text: str = ""

    def __post_init__(self):
        if not 0 <= self.start < self.stop <= 1:
            raise ValueError(f"{self.tensor}: a piece is [start, stop) with "
                             f"0 <= start < stop <= 1, got [{self.start}, {self.stop})")
        if self.kind not in KINDS:
            raise ValueError(f"{self.tensor}: kind {self.kind!r} is not one of {sorted(KINDS)}")


def _tensors(holdings):
    seen = {}
    for pieces in holdings.values():
        for p in pieces:
            seen.setdefault(p.tensor, None)
    return list(seen)


def held_fraction(holdings, rank, tensor):
    """How much of ``tensor`` (0 to 1) ``rank`` holds, overlaps counted once."""
    spans = sorted((p.start, p.stop) for p in holdings[rank] if p.tensor == tensor)
    total, end = 0.0, 0.0
    for a, b in spans:
        a = max(a, end)
        if b > a:
            total, end = total + b - a, b
    return total


def _write(ax, x0, i, p, unit):
    """Write a piece's text on it, or beside it (on the wider empty side) when it
    does not fit: a text is never shrunk below FONT or cut."""
    need = 0.6 * FONT / 72 * len(p.text) + 0.1        # inches, about (DejaVu Sans)
    if need <= (p.stop - p.start) * unit:
        x, ha, colour = x0 + (p.start + p.stop) / 2, "center", \
            "black" if p.kind in LIGHT else "white"
    elif p.start >= 1 - p.stop:
        x, ha, colour = x0 + p.start - 0.02, "right", "black"
    else:
        x, ha, colour = x0 + p.stop + 0.02, "left", "black"
    ax.text(x, i + 0.52, p.text, ha=ha, va="center", fontsize=FONT, color=colour,
            clip_on=False)


def plot_who_holds_what(holdings, *, tensors=None, title=None, width=7.7, row=0.42,
                        dividers=None, legend=None):
    """Draw ``holdings`` (``{rank: [Piece, ...]}``): ranks as rows, ``tensors``
    (default: in order of first appearance) as columns. Returns the Figure,
    ``width`` inches wide, ``row`` inches per rank; texts at ``FONT`` points.
    ``dividers``: ``{tensor: [fraction, ...]}``, thin lines across that column
    where one part of it ends and the next begins (a column of several states).
    ``legend``: draw the kinds' legend (default: when there is more than one
    kind); ``False`` where the columns' names already say what each kind is."""
    ranks = sorted(holdings)
    tensors = list(tensors) if tensors is not None else _tensors(holdings)
    if not ranks or not tensors:
        raise ValueError("nothing to draw: no rank holds any piece")
    dividers = dividers or {}
    unknown = ({p.tensor for r in ranks for p in holdings[r]} | set(dividers)) - set(tensors)
    if unknown:
        raise ValueError(f"pieces of tensors not among the columns: {sorted(unknown)}")
    label_w, head = 0.9, 0.45 + (0.3 if title else 0)
    kinds = [k for k in KINDS if any(p.kind == k for r in ranks for p in holdings[r])]
    legend = len(kinds) > 1 if legend is None else legend
    # One row of kinds if it fits the width at FONT points (about 0.6 em a letter,
    # plus the swatch and the gaps), else two.
    one_row = sum(0.6 * FONT / 72 * len(k) + 0.75 for k in kinds) <= width - 0.2
    ncols = len(kinds) if one_row else -(-len(kinds) // 2)
    legend_h = (0.45 if one_row else 0.75) if legend else 0.1
    height = head + row * len(ranks) + legend_h
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes([label_w / width, legend_h / height, 1 - (label_w + 0.1) / width,
                       row * len(ranks) / height])
    gap = 0.12                                   # between columns, in tensor lengths
    span = len(tensors) * (1 + gap) - gap + 0.04
    unit = (width - label_w - 0.1) / span        # inches per tensor length
    for j, name in enumerate(tensors):
        x0 = j * (1 + gap)
        ax.text(x0 + 0.5, -0.15, name, ha="center", va="bottom", fontsize=FONT, weight="bold")
        for i, r in enumerate(ranks):
            ax.add_patch(Rectangle((x0, i + 0.12), 1, 0.76, fill=False, ec="0.55", lw=0.8))
            for p in holdings[r]:
                if p.tensor != name:
                    continue
                colour = KINDS[p.kind]
                ax.add_patch(Rectangle((x0 + p.start, i + 0.12), p.stop - p.start, 0.76,
                                       fc=colour, ec="white", lw=0.8))
                if p.text:
                    _write(ax, x0, i, p, unit)
            for f in dividers.get(name, ()):
                ax.plot([x0 + f] * 2, [i + 0.12, i + 0.88], color="0.55", lw=0.8)
    ax.set_xlim(-0.02, len(tensors) * (1 + gap) - gap + 0.02)
    ax.set_ylim(len(ranks), -0.15)
    ax.set_yticks([i + 0.5 for i in range(len(ranks))], [f"rank {r}" for r in ranks],
                  fontsize=FONT)
    ax.set_xticks([])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=FONT + 1, y=1 - 0.12 / height, va="top")
    if legend:
        fig.legend(handles=[Patch(fc=KINDS[k], label=k) for k in kinds], loc="lower center",
                   ncols=ncols, fontsize=FONT, frameon=False, bbox_to_anchor=(0.5, 0))
    return fig
