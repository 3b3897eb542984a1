"""A pipeline run as the papers draw it (GPipe fig. 2, Megatron-LM fig. 4,
zero bubble fig. 3): one row per rank, time to the right, one box per action,
numbered and coloured by microbatch; F a light shade of the microbatch's
colour, B the colour, W a dark shade. With several stages per rank
(interleaved), the boxes of its odd model chunks (1, 3, ...) are hatched.

    >>> import numpy as np
    >>> from ringlab.nn import mlp_model
    >>> from ringlab.pipeline import parse, run_pipeline
    >>> res = run_pipeline(mlp_model([2, 4, 2], np.random.default_rng(0)),
    ...                    (np.ones((2, 2)), np.zeros((2, 2))),
    ...                    [parse("0F0 0F1 0B0 0B1"), parse("1F0 1B0 1F1 1B1")])
    >>> [(b["rank"], b["text"], b["shade"]) for b in pipeline_boxes(res.trace)][:3]
    [(0, '0', 'F'), (0, '1', 'F'), (1, '0', 'F')]
"""

from __future__ import annotations

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]
# How much of the colour each kind keeps (the rest white, or black for W).
SHADES = {"F": ("white", 0.45), "B": (None, 0.0), "W": ("black", 0.35)}


def _shade(colour, kind):
    from matplotlib.colors import to_rgb
    towards, amount = SHADES[kind]
    rgb = to_rgb(colour)
    if towards is None:
        return rgb
    target = to_rgb(towards)
    return tuple(c + (t - c) * amount for c, t in zip(rgb, target))


def pipeline_boxes(trace):
    """One dict per action of a ``run_pipeline`` trace, in time order: ``rank``,
    ``start``, ``end``, ``mb``, ``stage``, ``shade`` ("F", "B" or "W") and ``text``."""
    boxes = [dict(rank=c.rank, start=c.start, end=c.end, mb=c.get("mb"), stage=c.get("stage"),
                  shade=c.get("kind"), text=str(c.get("mb")))
             for c in trace.computes if c.get("kind") is not None]
    return sorted(boxes, key=lambda b: (b["start"], b["rank"]))


def plot_pipeline(trace, ax=None, *, title=None):
    """Draw ``pipeline_boxes(trace)``: rank 0 on top, the makespan dashed. Returns the Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ..show.style import PT
    from ..show.timeline import WIDTH, _bar_label_class
    boxes = pipeline_boxes(trace)
    p = trace.world_size
    end = max(b["end"] for b in boxes)
    if ax is None:      # margins in inches, for 12-point text (ringlab.show.style)
        height = 1.1 + 0.45 * p
        fig, ax = plt.subplots(figsize=(WIDTH, height))
        fig.subplots_adjust(left=0.8 / WIDTH, right=1 - 2.3 / WIDTH, bottom=0.65 / height,
                            top=1 - 0.4 / height)
    # A character's share of the axis width (a character about 0.62 em wide).
    char = 0.62 * PT / max(ax.get_position().width * ax.figure.get_figwidth() * 72, 1.0)
    for b in boxes:
        colour = _shade(PALETTE[b["mb"] % len(PALETTE)], b["shade"])
        chunk = b["stage"] // p
        ax.barh(b["rank"], b["end"] - b["start"], left=b["start"], height=0.8, color=colour,
                edgecolor="white", linewidth=1.0, hatch="///" if chunk % 2 else None)
        if b["end"] - b["start"] >= char * (len(b["text"]) + 1) * end:   # drawn if it fits
            ax._add_text(_bar_label_class()(                                # as laid out
                b["start"], b["end"], b["rank"], b["text"], 0.8, ha="center", va="center",
                fontsize=PT, color="black" if b["shade"] == "F" else "white"))
    ax.axvline(end, color="0.35", ls="--", lw=0.9)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.4, -0.6)
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel("simulated time (s)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    kinds = sorted({b["shade"] for b in boxes}, key="FBW".index)
    names = {"F": "F forward", "B": "B backward" if "W" not in kinds else "B input grad",
             "W": "W weight grad"}
    handles = [Patch(color=_shade("0.45", k), label=names[k]) for k in kinds]
    if any(b["stage"] >= p for b in boxes):
        handles.append(Patch(facecolor="0.75", hatch="///", edgecolor="white",
                             label="model chunk 1, 3, ..."))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=PT,
              frameon=False, title="colour: microbatch", title_fontsize=PT, handlelength=1.2,
              handletextpad=0.4, borderaxespad=0, alignment="left")
    ax.set_title(title or f"{p} ranks, {end:g} s", fontsize=PT)
    return ax
