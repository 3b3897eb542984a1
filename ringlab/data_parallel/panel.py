"""A panel for the synchronous SGD chapter: world size, batch size, learning
rate -> loss curves (P ranks vs one process) and the bytes each rank sends.

``curves(P, batch_size, lr)`` does the work and ``figure(...)`` draws it, so
the static book draws the figure for one setting; ``sync_sgd_panel()`` puts
sliders on it in a live notebook (needs ipywidgets, imported only there).
"""

import numpy as np

from ..runner import run
from .sync_sgd import data_parallel_sgd, global_loss, single_process_sgd
from ..nn.data import TeacherRegression

SIZES, SEED, STEPS = [8, 32, 32, 2], 0, 40
DATA = TeacherRegression(n_samples=1024, dim=8, out=2)


def curves(world_size, batch_size, lr, steps=STEPS):
    """Losses of ``steps`` steps on ``world_size`` ranks and on one process, the
    largest parameter difference, and the bytes each rank sends per step."""
    batches = [b for _, b in zip(range(steps), DATA.batches(batch_size, seed=1))]
    kw = dict(sizes=SIZES, seed=SEED, lr=lr)
    res = run(data_parallel_sgd, [batches] * world_size, kwargs=kw)
    ref_losses, ref = single_process_sgd(batches, **kw)
    dp = global_loss([out[0] for out in res.outputs], batches)
    return dict(dp=dp, single=ref_losses, diff=float(np.abs(res.outputs[0][1] - ref).max()),
                bytes_per_step=max(res.trace.bytes_sent()) / steps)


def figure(world_size=4, batch_size=16, lr=0.1, ax=None):
    """Draw ``curves``: the P-rank run on top of the one-process run."""
    import matplotlib.pyplot as plt

    from ..show.style import PT
    c = curves(world_size, batch_size, lr)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3))
    ax.plot(c["single"], lw=4, alpha=0.35, label="one process, whole batch")
    ax.plot(c["dp"], "--", label=f"{world_size} ranks, synchronous SGD")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("mse loss")
    ax.set_title(f"P={world_size}, batch {batch_size}, lr {lr}: "
                 f"{c['bytes_per_step']:.0f} bytes per rank per step,\n"
                 f"max |diff| {c['diff']:.0e}", fontsize=PT)
    ax.legend()
    return c


def sync_sgd_panel():
    """Sliders for P, batch size and learning rate over ``figure`` (live notebooks)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    def draw(world_size, batch_size, lr):
        figure(world_size, batch_size, lr)
        plt.show()

    return W.interactive(draw, world_size=W.IntSlider(4, 1, 8, description="P"),
                         batch_size=W.IntSlider(16, 8, 64, description="batch"),
                         lr=W.FloatLogSlider(0.1, base=10, min=-3, max=0, description="lr"))
