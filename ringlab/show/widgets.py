"""A control panel for live notebooks: pick an algorithm, a world size and a
vector length; ringlab reruns it and redraws the player or a figure.

    >>> from ringlab.show.widgets import explorer
    >>> panel = explorer("ring_allreduce", world_size=4, length=8)   # last line of a cell shows it
    >>> panel.trace.steps
    6

The algorithms are whatever ``ringlab.collectives`` exports when you call it,
so new reference collectives appear by themselves. It needs a running kernel
(in the static book the controls do nothing; use ``trace.show()`` there).
"""

from __future__ import annotations

import html
import io
import time

import ipywidgets as W
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from ..runner import run

from . import figures
from .style import PT
from .player import TracePlayer

VIEWS = ("player", "holdings", "space-time", "bytes")
# The player runs in an iframe: widgets.HTML does not run <script>s, an iframe's
# document does. It is same-origin (srcdoc), so it can size its own frame.
_FIT_FRAME = ("<script>if (window.frameElement) new ResizeObserver(function () {"
              "window.frameElement.style.height = document.documentElement.scrollHeight + 'px';"
              "}).observe(document.body);</script>")


def algorithms():
    """``{name: function}``: the reference collectives in ``ringlab.collectives`` now."""
    from .. import collectives
    names = getattr(collectives, "__all__", [n for n in dir(collectives) if not n.startswith("_")])
    return {n: getattr(collectives, n) for n in sorted(names) if callable(getattr(collectives, n, None))}


def example_inputs(name, world_size, length, seed=0):
    """Small integer-valued vectors (exact sums), one per rank. Collectives that
    start from one rank's data (broadcast, scatter) get it on rank 0 only; an
    alltoall gets one block per destination rank on every rank."""
    rng = np.random.default_rng(seed)
    if "alltoall" in name:
        size = max(1, length // world_size)
        return [[rng.integers(0, 10, size).astype(float) for _ in range(world_size)]
                for _ in range(world_size)]
    vectors = [rng.integers(0, 10, length).astype(float) for _ in range(world_size)]
    if "broadcast" in name or (name.endswith("scatter") and "reduce" not in name):
        return [vectors[0]] + [None] * (world_size - 1)
    return vectors


class Explorer:
    """The panel: ``.widget`` is the ipywidgets box, ``.trace`` the last run's
    trace, ``.seconds`` how long the last update took."""

    def __init__(self, algorithm="ring_allreduce", world_size=4, length=8, view="player",
                 max_world_size=32, inputs=example_inputs):
        self.algorithms, self.inputs = algorithms(), inputs
        if algorithm not in self.algorithms:
            raise ValueError(f"unknown algorithm {algorithm!r}; ringlab.collectives has "
                             f"{sorted(self.algorithms)}")
        self.algorithm = W.Dropdown(options=list(self.algorithms), value=algorithm, description="algorithm")
        self.world_size = W.IntSlider(value=world_size, min=1, max=max_world_size, description="ranks",
                                      continuous_update=False)
        self.length = W.IntSlider(value=length, min=1, max=1024, description="length",
                                  continuous_update=False)
        self.view = W.ToggleButtons(options=VIEWS, value=view, description="view")
        self.status = W.HTML()
        self.frame = W.HTML(layout=W.Layout(width="100%"))
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.output = W.Box([self.frame])
        for w in (self.algorithm, self.world_size, self.length):
            w.observe(self.update, names="value")
        self.view.observe(self.redraw, names="value")
        self.widget = W.VBox([W.HBox([self.algorithm, self.world_size, self.length]), self.view,
                              self.status, self.output])
        self.trace, self.error, self.seconds = None, None, 0.0
        self.update()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def update(self, *_):
        """Rerun the algorithm with the current settings, then redraw."""
        start = time.perf_counter()
        name, n, length = self.algorithm.value, self.world_size.value, self.length.value
        try:
            program = self.algorithms[name]
            self.trace = run(program, self.inputs(name, n, length)).trace
            self.error = None
        except Exception as exc:       # noqa: BLE001 - shown in the panel, not raised in a callback
            self.trace, self.error = None, f"{type(exc).__name__}: {exc}"
        self.redraw(start=start)

    def redraw(self, *_, start=None):
        """Draw the chosen view of the current trace (only that one: fast)."""
        start = time.perf_counter() if start is None else start
        if self.trace is None:
            self.output.children = [self.frame]
            self.frame.value = f"<pre>{html.escape(self.error or '')}</pre>"
        elif self.view.value == "player":
            page = TracePlayer(self.trace).page().replace("</body>", _FIT_FRAME + "</body>")
            self.frame.value = (f'<iframe srcdoc="{html.escape(page, quote=True)}" '
                                'style="width:100%;height:640px;border:0"></iframe>')
            self.output.children = [self.frame]
        else:
            self.image.value = self._figure_png()
            self.output.children = [self.image]
        self.seconds = time.perf_counter() - start
        what = "" if self.trace is None else (f"{self.trace.steps} steps, {len(self.trace)} messages, "
                                             f"{self.trace.total_bytes} bytes · ")
        self.status.value = f"<small>{html.escape(what)}updated in {1000 * self.seconds:.0f} ms</small>"

    def _figure_png(self):
        draw = {"holdings": figures.plot_holdings_grid, "space-time": figures.plot_spacetime,
                "bytes": figures.plot_bytes_sent}[self.view.value]
        with matplotlib.rc_context({"figure.max_open_warning": 0}):
            try:
                fig = draw(self.trace)
            except ValueError as exc:  # e.g. holdings of an unlabelled trace
                fig = plt.figure(figsize=(6, 1))
                fig.text(0.02, 0.5, str(exc)[:120], fontsize=PT, va="center", wrap=True)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=72)
            plt.close(fig)      # else the notebook shows it again after the next cell
        return buf.getvalue()


def explorer(algorithm="ring_allreduce", world_size=4, length=8, view="player", **options):
    """The control panel (see ``Explorer``); display it as a cell's last line."""
    return Explorer(algorithm, world_size, length, view, **options)
