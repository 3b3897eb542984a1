"""Which algorithm wins where: maps over message size and world size.

``plot_algorithm_regions`` colours every (size, N) cell by the fastest of
some algorithms under the alpha-beta closed forms (``ringlab.cost.timing``)
and draws the exact crossovers (``ringlab.cost.crossover``) on top, so the
boundary between the latency-bound and the bandwidth-bound regime is a
computed line, not an eyeballed one. ``plot_nccl_choice`` does the same for
NCCL's own model (``ringlab.cost.nccl``) over sizes and node counts.

    >>> import matplotlib; matplotlib.use("Agg")
    >>> ax = plot_algorithm_regions(["ring_allreduce", "tree_allreduce"], range(2, 33),
    ...                             alpha=1e-5, beta=1e-9)
    >>> ax.get_xlabel(), len(ax.lines) >= 1
    ('message size (bytes)', True)
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from ..show.style import PT
from . import nccl, timing

PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"]


def _regions(ax, grid, labels, xs, ys):
    cmap = ListedColormap(PALETTE[:len(labels)])
    ax.pcolormesh(xs, ys, grid, cmap=cmap, vmin=-0.5, vmax=len(labels) - 0.5, shading="nearest")
    ax.set_xscale("log", base=2)
    # Below the axes (past the tick labels and the axis label): inside, at 12 pt, it
    # covered a region of its own.
    ax.legend(handles=[Patch(color=PALETTE[i], label=l) for i, l in enumerate(labels)],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=min(3, len(labels)),
              fontsize=PT, frameon=False)


def plot_algorithm_regions(algs, world_sizes, alpha, beta, gamma=0.0, sizes=None, ax=None,
                           **params):
    """Colour each (message size, N) by the fastest of ``algs`` and draw every
    pair's crossover size against N (black lines). ``params`` go to the closed
    forms (``segments=``, ``ports=``, ``gpus_per_node=``)."""
    names = [timing._name(a) for a in algs]
    ns = list(world_sizes)
    sizes = np.logspace(6, 32, 105, base=2) if sizes is None else np.asarray(sizes, float)
    grid = np.array([[names.index(timing.fastest(names, n, s, alpha, beta, gamma, **params))
                      for s in sizes] for n in ns])
    ax = ax or plt.subplots(figsize=(8, 4.5))[1]
    _regions(ax, grid, names, sizes, ns)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pts = [(float(x), n) for n in ns
                   if (x := timing.crossover(a, b, n, alpha, beta, gamma, **params)) is not None]
            if pts:
                ax.plot(*zip(*pts), color="black", lw=1)
    ax.set_xlim(sizes[0], sizes[-1])
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("ranks N")
    ax.set_title(f"fastest under alpha = {alpha:g} s, beta = {beta:g} s/B (lines: crossovers)")
    return ax


def plot_nccl_choice(node_counts, gpus_per_node=8, sizes=None, ax=None, **system):
    """Colour each (message size, nodes) by NCCL's (algorithm, protocol) choice
    for AllReduce (``ringlab.cost.nccl.choose``)."""
    sizes = [1 << k for k in range(3, 35)] if sizes is None else list(sizes)
    nodes = list(node_counts)
    picks = [[nccl.choose(s, m, gpus_per_node, **system)[:2] for s in sizes] for m in nodes]
    labels = sorted({p for row in picks for p in row})
    grid = np.array([[labels.index(p) for p in row] for row in picks])
    ax = ax or plt.subplots(figsize=(8, 4.5))[1]
    _regions(ax, grid, [f"{a}/{p}" for a, p in labels], sizes, nodes)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(f"nodes (x {gpus_per_node} GPUs)")
    ax.set_title(f"NCCL {nccl.VERSION}'s AllReduce choice (its tuning model)")
    return ax
