"""Predict, then reveal: which AllReduce algorithm and protocol NCCL's model picks.

The reader picks a message size and a node count, guesses ring or tree and
LL, LL128 or Simple, then reveals what ``ringlab.cost.nccl.choose`` says and
every pair's predicted time. Two front ends share ``reveal``:

* ``quiz(**system)``: an ipywidgets panel for a live kernel (any size, any
  system parameters);
* ``static_quiz(sizes, node_counts, **system)``: one self-contained piece of
  HTML and JavaScript with the predictions for a grid precomputed. It needs no
  kernel and fetches nothing, so it works in the static book and offline
  (``_repr_html_``; ``save_html(path)`` writes a page).

    >>> r = reveal(8 << 10, n_nodes=4, gpus_per_node=8, guess=("ring", "LL"))
    >>> (r.algorithm, r.protocol), r.right
    (('tree', 'LL'), False)
    >>> round(r.times[("ring", "LL")] / r.time_us, 2)     # the guess, against the best
    2.28
    >>> "tree/LL" in static_quiz([8 << 10], [4]).html()
    True
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
from typing import NamedTuple

from . import nccl

_counter = itertools.count()


def size_label(nbytes):
    """``8 B``, ``64 KiB``, ``1 GiB``: powers of two in binary units."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


class Reveal(NamedTuple):
    algorithm: str
    protocol: str
    time_us: float
    times: dict          # {(algorithm, protocol): predicted us} for every pair NCCL considers
    right: bool | None   # the guess matched; None without a guess


def reveal(nbytes, n_nodes, gpus_per_node=8, guess=None, **system):
    """NCCL's choice for an AllReduce of ``nbytes`` on ``n_nodes`` x ``gpus_per_node``
    GPUs, every pair's predicted time, and whether ``guess`` = (algorithm, protocol)
    was it. ``system``: the keywords of ``ringlab.cost.nccl.model``."""
    best = nccl.choose(nbytes, n_nodes, gpus_per_node, **system)
    table = nccl.model(n_nodes, gpus_per_node, **system)
    times = {pair: nccl.predict(nbytes, *pair, n_nodes, gpus_per_node, **system).time_us
             for pair in table}
    right = None if guess is None else tuple(guess) == (best.algorithm, best.protocol)
    return Reveal(best.algorithm, best.protocol, best.time_us, times, right)


def reveal_html(r, guess=None):
    """The answer as HTML: the choice, the guess against it, all pairs fastest first."""
    head = f"<b>NCCL's model picks {r.algorithm}/{r.protocol}</b>: {r.time_us:.1f} µs."
    if guess is not None:
        g = tuple(guess)
        if r.right:
            head += " Your guess is right."
        elif g in r.times:
            head += (f" Your guess {g[0]}/{g[1]}: {r.times[g]:.1f} µs, "
                     f"{r.times[g] / r.time_us:.2f}x the best.")
    rows = "".join(f"<tr><td>{a}/{p}</td><td>{t:.1f}</td></tr>"
                   for (a, p), t in sorted(r.times.items(), key=lambda kv: kv[1]))
    return (f"<p>{head}</p><table><tr><th>pair</th><th>predicted µs</th></tr>"
            f"{rows}</table>")


# -- live: ipywidgets ---------------------------------------------------------------------

def quiz(gpus_per_node=8, **system):
    """An ipywidgets panel: size, nodes, your guess, a Reveal button. Changing the
    question hides the answer again. Returns the ``VBox`` (display it)."""
    import ipywidgets as W

    size = W.Dropdown(options=[(size_label(1 << k), 1 << k) for k in range(3, 33)],
                      value=1 << 20, description="size")
    nodes = W.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128], value=4,
                       description=f"nodes (x{gpus_per_node})")
    algorithm = W.ToggleButtons(options=list(nccl.ALGORITHMS), description="guess")
    protocol = W.ToggleButtons(options=list(nccl.PROTOCOLS), description="protocol")
    button = W.Button(description="Reveal", button_style="primary")
    out = W.HTML("<i>Pick a size and a node count, guess, then reveal.</i>")

    def show(_):
        guess = (algorithm.value, protocol.value)
        r = reveal(size.value, nodes.value, gpus_per_node, guess=guess, **system)
        out.value = reveal_html(r, guess)

    def hide(_):
        out.value = "<i>Guess, then reveal.</i>"

    button.on_click(show)
    for w in (size, nodes, algorithm, protocol):
        w.observe(hide, names="value")
    panel = W.VBox([W.HBox([size, nodes]), algorithm, protocol, button, out])
    panel.reveal = show            # for tests and scripts: press the button
    return panel


# -- static: HTML and JavaScript, no kernel ---------------------------------------------

_STYLE = """
.ringlab-quiz{font:14px/1.4 sans-serif;border:1px solid #ccc;border-radius:6px;
  padding:.6em .9em;margin:.5em 0}
.ringlab-quiz select,.ringlab-quiz button{font:inherit;margin-right:.8em}
.ringlab-quiz table{border-collapse:collapse;margin:.3em 0}
.ringlab-quiz td,.ringlab-quiz th{padding:0 .8em;text-align:left}
.ringlab-quiz .answer{margin-top:.4em;min-height:1.5em}
"""

_SCRIPT = """
(function (root, data) {
  var q = function (sel) { return root.querySelector(sel); };
  var answer = q(".answer");
  function value(name) {
    var c = root.querySelector("input[name='" + name + "']:checked");
    return c ? c.value : null;
  }
  function hide() { answer.innerHTML = "<i>Guess, then reveal.</i>"; }
  root.querySelectorAll("select, input").forEach(function (el) {
    el.addEventListener("change", hide);
  });
  q("button").addEventListener("click", function () {
    var cell = data.cells[q(".size").value][q(".nodes").value];
    var best = cell[0][0], guess = value(root.id + "-a") + "/" + value(root.id + "-p");
    var t = {};
    cell.forEach(function (row) { t[row[0]] = row[1]; });
    var text = "<b>NCCL's model picks " + best + "</b>: " + t[best].toFixed(1) + " \\u00b5s.";
    if (guess === best) text += " Your guess is right.";
    else if (guess in t) text += " Your guess " + guess + ": " + t[guess].toFixed(1) +
        " \\u00b5s, " + (t[guess] / t[best]).toFixed(2) + "x the best.";
    var rows = cell.map(function (row) {
      return "<tr><td>" + row[0] + "</td><td>" + row[1].toFixed(1) + "</td></tr>";
    }).join("");
    answer.innerHTML = "<p>" + text + "</p><table><tr><th>pair</th>" +
        "<th>predicted \\u00b5s</th></tr>" + rows + "</table>";
  });
})
"""


class StaticQuiz:
    """The quiz for a fixed grid of sizes and node counts, as HTML (see the module)."""

    def __init__(self, sizes, node_counts, gpus_per_node=8, **system):
        self.sizes, self.node_counts = list(sizes), list(node_counts)
        self.gpus_per_node, self.system = gpus_per_node, system
        # cells[i][j]: [["alg/proto", us], ...] fastest first, for sizes[i], node_counts[j]
        self.cells = []
        for s in self.sizes:
            row = []
            for m in self.node_counts:
                r = reveal(s, m, gpus_per_node, **system)
                # ties keep NCCL's loop order (the first found wins, as in choose)
                pairs = sorted(r.times.items(), key=lambda kv: kv[1])
                best = (r.algorithm, r.protocol)
                pairs.sort(key=lambda kv: kv[0] != best)
                row.append([[f"{a}/{p}", round(t, 3)] for (a, p), t in pairs])
            self.cells.append(row)

    def html(self):
        """A self-contained snippet: style, controls, a fallback line, the script."""
        payload = json.dumps({"cells": self.cells}).replace("<", "\\u003c")
        digest = hashlib.sha1(payload.encode()).hexdigest()[:8]
        uid = f"ringlab-quiz-{digest}-{next(_counter)}"
        sizes = "".join(f'<option value="{i}"{" selected" if i == len(self.sizes) // 2 else ""}>'
                        f"{size_label(s)}</option>" for i, s in enumerate(self.sizes))
        nodes = "".join(f'<option value="{j}">{m} x {self.gpus_per_node} GPUs</option>'
                        for j, m in enumerate(self.node_counts))

        def radios(name, options):
            return " ".join(f'<label><input type="radio" name="{uid}-{name}" value="{o}"'
                            f'{" checked" if k == 0 else ""}> {html.escape(o)}</label>'
                            for k, o in enumerate(options))
        return (f'<div class="ringlab-quiz" id="{uid}"><style>{_STYLE}</style>'
                f'<div>AllReduce of <select class="size">{sizes}</select> on '
                f'<select class="nodes">{nodes}</select></div>'
                f'<div>Your guess: {radios("a", nccl.ALGORITHMS)} &nbsp;|&nbsp; '
                f'{radios("p", nccl.PROTOCOLS)}</div>'
                f'<button type="button">Reveal</button>'
                f'<div class="answer"><i>Pick, guess, then reveal. (This quiz needs '
                f'JavaScript.)</i></div></div>\n'
                f'<script>{_SCRIPT}(document.getElementById("{uid}"), {payload});</script>\n')

    def _repr_html_(self):
        return self.html()

    def save_html(self, path):
        """Write a standalone page."""
        page = f"<!doctype html><meta charset=utf-8><title>NCCL quiz</title>{self.html()}"
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        return path


def static_quiz(sizes=None, node_counts=(1, 2, 4, 16, 64), gpus_per_node=8, **system):
    """The quiz over ``sizes`` (default: powers of 4 from 64 B to 1 GiB) and
    ``node_counts``, precomputed (see ``StaticQuiz``)."""
    sizes = [1 << k for k in range(6, 31, 2)] if sizes is None else sizes
    return StaticQuiz(sizes, node_counts, gpus_per_node, **system)
