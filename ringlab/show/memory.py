"""Memory over a training step: what each rank holds, label by label.

A program says what it holds with ``comm.alloc(label, array)`` and
``comm.free(label)``; the trace keeps those notes (``trace.memory``) at the
rank's simulated time. ``plot_memory`` stacks the labels ("params", "grads",
"adam.m", ...) as step areas over time, so the peak, and what makes it, can
be read off; ``plot_memory_side_by_side`` puts several runs (DP, ZeRO-1, -2,
-3) next to each other on one byte scale.

    >>> import matplotlib; matplotlib.use("Agg")
    >>> import numpy as np, ringlab
    >>> def step(comm, w):
    ...     comm.alloc("params", w)
    ...     comm.compute(1.0, "backward")
    ...     comm.alloc("grads", w)
    ...     comm.compute(1.0, "update")
    ...     comm.free("grads")
    >>> trace = ringlab.run(step, [np.ones(1000)] * 2).trace
    >>> x, layers = memory_layers(trace, 0)
    >>> x, layers
    ([0.0, 0.0, 1.0, 2.0], {'params': [0, 8000, 8000, 8000], 'grads': [0, 0, 8000, 0]})
    >>> ax = plot_memory(trace, 0)
    >>> ax.get_title()
    'rank 0: peak 16 kB'

The x axis is simulated seconds; a run with no simulated time (no
``comm.compute``, no ``network=``) is drawn against the step clock instead.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from .style import PT
from .timeline import COMPUTE_COLOURS, _time_unit
from ..trace import _group

COLOURS = COMPUTE_COLOURS
# The labels of Part 5's programs keep one colour each in every figure (tab10):
# a model's copy and its gathered full form must not look alike.
KNOWN = {"params": "#1f77b4", "params.full": "#aec7e8", "grads": "#ff7f0e",
         "grads.full": "#ffbb78", "bucket": "#d62728", "master": "#2ca02c",
         "adam.m": "#9467bd", "adam.v": "#8c564b", "activations": "#7f7f7f"}


def _uses_time(trace):
    """Draw against simulated seconds, unless the run has none. (A run whose
    memory is all taken at time 0, as DP's, is still drawn to its end in seconds.)"""
    return any(m.time > 0 for m in trace.memory) or trace.time > 0


def memory_layers(trace, rank, *, group_labels=False):
    """What ``plot_memory`` draws for ``rank``: ``(x, {label: bytes})``, the
    bytes held under each label just after each memory event, with a first
    point where nothing is held yet. ``x`` is the simulated time (or the step
    clock, see the module doc); labels come in order of first ``alloc``, the
    bottom layer first. ``group_labels=True`` adds "params.layer3" to "params"."""
    mine = [m for m in trace.memory if m.rank == rank]
    timed = _uses_time(trace)
    x = [0.0 if timed else 0]
    held = {}
    layers = {}
    for m in mine:
        label = _group(m.label) if group_labels else m.label
        if label not in layers:
            layers[label] = [0] * len(x)       # held nothing until now
        held[label] = held.get(label, 0) + m.nbytes
        x.append(m.time if timed else m.step)
        for name, values in layers.items():
            values.append(held.get(name, 0))
    return x, layers


def _until_the_end(trace, x, layers):
    """The layers held on to the end of the run, so the last level shows."""
    end = trace.time if _uses_time(trace) else trace.steps
    if end <= x[-1]:
        return x, layers
    return x + [end], {label: values + values[-1:] for label, values in layers.items()}


def _bytes_unit(nbytes):
    """A readable decimal unit for ``nbytes`` (as the ZeRO paper counts GB)."""
    for factor, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if nbytes >= factor:
            return factor, name
    return 1.0, "B"


def format_bytes(nbytes):
    """``16000`` -> ``'16 kB'``."""
    factor, name = _bytes_unit(nbytes)
    return f"{nbytes / factor:.4g} {name}"


def _colours(labels):
    others = [c for c in COLOURS if c not in KNOWN.values()]
    unknown = [label for label in labels if label not in KNOWN]
    return {label: KNOWN.get(label) or others[unknown.index(label) % len(others)]
            for label in labels}


def plot_memory(trace, ranks=None, ax=None, by_label=True, *, group_labels=False, title=None,
                colours=None):
    """The bytes a rank holds over simulated time, as a step chart.

    ``by_label=True`` (default): one rank (``ranks``: an int, or None for
    rank 0), its labels stacked as areas, the first allocated at the bottom;
    the top edge is its total, the dashed line its peak. ``by_label=False``:
    one line per rank of ``ranks`` (default all) with its total.
    Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7.0, 3.2), layout="constrained")
    if isinstance(ranks, (int, np.integer)):
        ranks = [int(ranks)]
    if by_label:
        ranks = [0] if ranks is None else list(ranks)
        if len(ranks) != 1:
            raise ValueError(f"plot_memory(by_label=True) draws one rank, got ranks={ranks}; "
                             f"pass one rank, or by_label=False for one line per rank")
        rank = ranks[0]
        x, layers = _until_the_end(trace, *memory_layers(trace, rank, group_labels=group_labels))
        colours = colours or _colours(layers)
        bottom = np.zeros(len(x))
        for label, values in layers.items():
            top = bottom + values
            ax.fill_between(x, bottom, top, step="post", color=colours[label], alpha=0.85,
                            linewidth=0, label=label)
            # The layer's top edge: a line, so that even a buffer held for no time shows.
            line, = ax.step(x, top, where="post", color=colours[label], lw=1.0)
            line.set_gid(f"memory:{label}")
            bottom = top
        peak = trace.peak_memory(rank)
        name = f"rank {rank}"
    else:
        ranks = range(trace.world_size) if ranks is None else ranks
        for r in ranks:
            x, layers = _until_the_end(trace, *memory_layers(trace, r))
            total = np.sum(list(layers.values()), axis=0) if layers else np.zeros(len(x))
            line, = ax.step(x, total, where="post", lw=1.4, label=f"rank {r}")
            line.set_gid(f"memory:rank {r}")
        peak = max((trace.peak_memory(r) for r in ranks), default=0)
        name = f"{len(ranks)} ranks"
    if peak:
        ax.axhline(peak, color="0.35", ls="--", lw=0.9, zorder=1)
    factor, unit = _bytes_unit(peak)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y / factor:g}"))
    ax.set_ylabel(f"memory held ({unit})")
    if _uses_time(trace):
        scale, tunit = _time_unit(max([m.time for m in trace.memory] + [trace.time]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda t, _: f"{t * scale:g}"))
        ax.set_xlabel(f"simulated time ({tunit})")
    else:
        ax.set_xlabel("step")
    ax.set_ylim(0, max(peak, 1) * 1.08)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles, names = ax.get_legend_handles_labels()
    if names:       # top to bottom, as the layers are stacked
        ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.01, 1),
                  fontsize=PT, frameon=False)
    ax.set_title(title or f"{name}: peak {format_bytes(peak)}", fontsize=PT)
    return ax


def plot_memory_side_by_side(runs, rank=0, *, group_labels=False, axes=None):
    """One ``plot_memory`` panel per run, on one byte scale, with the same
    colour for a label everywhere: ``runs`` is ``{"DP": trace, "ZeRO-1": ...}``.
    Returns the array of Axes.

        >>> import matplotlib; matplotlib.use("Agg")
        >>> from ringlab.trace import Trace, MemoryEvent as M
        >>> dp = Trace([], 1, memory=[M(0, "params", 400, 0.0), M(0, "adam.m", 400, 1.0)])
        >>> zero = Trace([], 1, memory=[M(0, "params", 400, 0.0), M(0, "adam.m", 100, 1.0)])
        >>> [ax.get_title() for ax in plot_memory_side_by_side({"DP": dp, "ZeRO-1": zero})]
        ['DP: peak 800 B', 'ZeRO-1: peak 500 B']
    """
    labels = {}
    for trace in runs.values():
        labels.update(dict.fromkeys(memory_layers(trace, rank, group_labels=group_labels)[1]))
    colours = _colours(labels)
    if axes is None:
        # At most two panels a row, so that the figure is shown at its own size in a
        # page (784 px wide in the book): a row of four was shrunk to 0.56.
        cols = min(2, len(runs))
        rows = -(-len(runs) // cols)
        _, axes = plt.subplots(rows, cols, figsize=(3.7 * cols + 0.2, 1.9 * rows + 0.5),
                               sharey=True, squeeze=False, layout="constrained")
        for ax in axes.ravel()[len(runs):]:
            ax.set_visible(False)
    grid = np.asarray(axes)
    cols = grid.shape[-1] if grid.ndim > 1 else len(runs)
    axes = grid.ravel()[:len(runs)]
    peak = max(trace.peak_memory(rank) for trace in runs.values())
    for i, (ax, (name, trace)) in enumerate(zip(axes, runs.items())):
        plot_memory(trace, rank, ax, group_labels=group_labels, colours=colours,
                    title=f"{name}: peak {format_bytes(trace.peak_memory(rank))}")
        ax.set_ylim(0, max(peak, 1) * 1.08)
        factor, unit = _bytes_unit(peak)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _, f=factor: f"{y / f:g}"))
        ax.set_ylabel(f"rank {rank}: held ({unit})" if i % cols == 0 else "")
        if ax.get_legend():
            ax.get_legend().remove()
    # One legend for the figure, below the panels, naming every label of every run.
    handles = [Patch(color=colours[label], alpha=0.85, label=label) for label in labels]
    if handles:
        axes[0].figure.legend(handles=handles, loc="outside lower center",
                              ncol=min(4, len(handles)), frameon=False)
    return axes
