"""A panel for the pipeline chapter: ranks p, microbatches m, stages per rank v,
a schedule and the times t_f, t_b, t_w -> the timeline, the bubble and the
activations each rank holds at most.

``simulate(...)`` does the work (it runs the schedule on a small model, on the
simulator) and ``figure(...)`` draws it, so the static book draws the figure
for one setting; ``pipeline_panel()`` puts controls on it in a live notebook
(needs ipywidgets, imported only there).
"""

import numpy as np

from ..nn import mlp_model
from . import run_pipeline
from .bubble import BUBBLES, measure, of_total

SCHEDULES = ("gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1")
WIDTH = 4          # the small model: Linear(4, 4) per stage, GeLU between


def make_schedule(schedule, p, m, v=2):
    """``ringlab.pipeline.schedules``' generator by name (v only for interleaved)."""
    from . import schedules
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    make = getattr(schedules, schedule)
    return make(p, m, v) if schedule == "interleaved_1f1b" else make(p, m)


def simulate(p=4, m=8, v=2, schedule="one_f_one_b", t_f=1.0, t_b=1.0, t_w=1.0):
    """Run ``schedule`` on p ranks with m microbatches; returns a dict: ``result``
    (the ``PipelineResult``), ``stats`` (``bubble.measure`` of its trace), ``v``
    (1 unless interleaved) and ``closed_form`` (the bubble's, or None where the
    times make it not apply: ZB-H1 needs t_f = t_b = t_w)."""
    v = v if schedule == "interleaved_1f1b" else 1
    sched = make_schedule(schedule, p, m, v)
    model = mlp_model([WIDTH] * (v * p + 1), np.random.default_rng(0))
    rng = np.random.default_rng(1)
    batch = rng.normal(size=(m, WIDTH)), rng.normal(size=(m, WIDTH))
    res = run_pipeline(model, batch, sched, t_f=t_f, t_b=t_b, t_w=t_w)
    closed = BUBBLES[schedule](p, m, v)
    if schedule == "zb_h1" and not t_f == t_b == t_w:
        closed = None
    return dict(result=res, stats=measure(res.trace), v=v, closed_form=closed)


def _pct(x):
    return f"{100 * float(x):.1f}%"


def figure(p=4, m=8, v=2, schedule="one_f_one_b", t_f=1.0, t_b=1.0, t_w=1.0, ax=None):
    """Draw ``simulate``'s run; the title gives the bubble (idle / compute and
    idle / total, measured on the rank that idles most, and the closed form) and
    each rank's peak of activations held. Returns ``simulate``'s dict."""
    import matplotlib.pyplot as plt
    from .drawing import plot_pipeline

    out = simulate(p, m, v, schedule, t_f, t_b, t_w)
    s = out["stats"]
    worst = max(range(p), key=lambda r: s.bubble[r])
    closed = out["closed_form"]
    formula = "" if closed is None else f" (formula {_pct(closed)} / {_pct(of_total(closed))})"
    if ax is None:
        _, ax = plt.subplots(figsize=(8.0, 1.2 + 0.45 * p))
    vv = f", v={out['v']}" if out["v"] > 1 else ""
    plot_pipeline(out["result"].trace, ax, title=(
        f"{schedule}, p={p}, m={m}{vv}; {s.messages} messages\n"
        f"bubble {_pct(s.bubble[worst])} of compute, "
        f"{_pct(s.bubble_of_total[worst])} of time{formula}\n"
        f"peak activations held per rank {s.peak_held}"))
    return out


def pipeline_panel():
    """Controls for p, m, v, the schedule and t_f/t_b/t_w over ``figure`` (live notebooks)."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    def draw(p, m, v, schedule, t_f, t_b, t_w):
        try:
            figure(p, m, v, schedule, t_f, t_b, t_w)
            plt.show()
        except ValueError as exc:        # e.g. interleaving needs m a multiple of p
            print(exc)

    times = dict(min=0.0, max=3.0, step=0.25)
    return W.interactive(draw, p=W.IntSlider(4, 1, 8, description="p"),
                         m=W.IntSlider(8, 1, 24, description="m"),
                         v=W.IntSlider(2, 1, 4, description="v (interleaved)"),
                         schedule=W.Dropdown(options=SCHEDULES, value="one_f_one_b"),
                         t_f=W.FloatSlider(1.0, **times, description="t_f"),
                         t_b=W.FloatSlider(1.0, **times, description="t_b"),
                         t_w=W.FloatSlider(1.0, **times, description="t_w"))
