"""The pipeline chapter's explorer for the static book: every schedule, p, m and v
run ahead on the simulator (``panel.simulate``), packed into the page; sliders in
JavaScript pick one run and draw its timeline, its measured bubble next to the
closed form, and the activations each rank holds at most. No kernel needed.

The timelines are the runs' own traces (``drawing.pipeline_boxes``), so the
page cannot disagree with the simulator; each run takes milliseconds, and the
480 runs of the default grid take about 3 s at build (99 kB packed).

    >>> ex = PipelineExplorer(ps=(2,), ms=(2, 4), vs=(2,))
    >>> len(ex.runs), sorted(ex.runs)[2]
    (8, 'interleaved_1f1b,2,2,2')
    >>> print(ex.runs['one_f_one_b,2,4,1']['text'])
    one_f_one_b, p=2, m=4: makespan 15 (t_f = t_b = t_w = 1), 8 messages
    bubble 25.0% of compute, 20.0% of time; formula (p-1)/m = 25.0% / 20.0%
    peak activations held per rank [2, 1]
"""

from __future__ import annotations

import html
from fractions import Fraction

from ..show.packed import element_id, pack, unpack_js
from .bubble import of_total
from .drawing import PALETTE, _shade, pipeline_boxes
from .panel import SCHEDULES, _pct, simulate

KINDS = "FBW"
# Every action's time is a whole number of 1/TICKS: t = 1 split into v = 2, 3 or
# 4 chunks, and ZB-H1's halves. The page holds whole ticks, exact.
TICKS = 12


def _colours():
    """``drawing.plot_pipeline``'s colour of each (microbatch colour, kind), as #rrggbb."""
    from matplotlib.colors import to_hex
    return [[to_hex(_shade(colour, kind)) for kind in KINDS] for colour in PALETTE]


def _ticks(x):
    t = Fraction(x).limit_denominator(1000) * TICKS
    if t.denominator != 1:
        raise ValueError(f"time {x} is not a whole number of 1/{TICKS}")
    return int(t)


def describe(schedule, p, m, v, stats, closed):
    """The explorer's text for one run: makespan and messages, the bubble
    measured on the rank that idles most against the closed form, the peaks."""
    worst = max(range(p), key=lambda r: stats.bubble[r])
    vv = f", v={v}" if schedule == "interleaved_1f1b" else ""
    formula = {"gpipe": "(p-1)/m", "one_f_one_b": "(p-1)/m",
               "interleaved_1f1b": "(p-1)/(v m)", "zb_h1": "(p-1)/(3m)"}[schedule]
    return "\n".join([
        f"{schedule}, p={p}, m={m}{vv}: makespan {stats.makespan:g} "
        f"(t_f = t_b = t_w = 1), {stats.messages} messages",
        f"bubble {_pct(stats.bubble[worst])} of compute, {_pct(stats.bubble_of_total[worst])}"
        f" of time; formula {formula} = {_pct(closed)} / {_pct(of_total(closed))}",
        f"peak activations held per rank {stats.peak_held}"])


def one_run(schedule, p, m, v):
    """The page's record of one run: ``text``, ``end`` (the makespan in ticks) and
    ``boxes``, one [rank, start, end, microbatch, stage, kind] per action (times
    in 1/TICKS, kind 0/1/2 for F/B/W); or only ``text`` saying why it cannot run."""
    try:
        out = simulate(p, m, v, schedule)
    except ValueError as exc:              # interleaving needs m a multiple of p
        return {"text": f"not possible: {exc}"}
    boxes = [[b["rank"], _ticks(b["start"]), _ticks(b["end"]), b["mb"], b["stage"],
              KINDS.index(b["shade"])] for b in pipeline_boxes(out["result"].trace)]
    return {"text": describe(schedule, p, m, out["v"], out["stats"], out["closed_form"]),
            "end": _ticks(out["stats"].makespan), "boxes": boxes}


class PipelineExplorer:
    """Every run of ``SCHEDULES`` x ``ps`` x ``ms`` (x ``vs`` for interleaved 1F1B)
    with t_f = t_b = t_w = 1: ``runs[key]``, key "schedule,p,m,v" (v = 1 but for
    interleaved). Displays itself as HTML (``_repr_html_``)."""

    def __init__(self, ps=(2, 3, 4, 6, 8), ms=tuple(range(1, 17)), vs=(2, 3, 4),
                 default=("one_f_one_b", 4, 8, 2)):
        self.ps, self.ms, self.vs = list(ps), list(ms), list(vs)
        self.runs = {}
        for schedule in SCHEDULES:
            for v in (self.vs if schedule == "interleaved_1f1b" else [1]):
                for p in self.ps:
                    for m in self.ms:
                        self.runs[f"{schedule},{p},{m},{v}"] = one_run(schedule, p, m, v)
        self.default = default

    def key(self, schedule, p, m, v):
        return f"{schedule},{p},{m},{v if schedule == 'interleaved_1f1b' else 1}"

    def packed(self):
        """``runs`` and the colours, packed for the page (``show.packed.pack``)."""
        return pack({"runs": self.runs, "colours": _colours(), "ticks": TICKS})

    def _controls(self):
        schedule, p, m, v = self.default
        opts = "".join(f'<option value="{s}"{" selected" if s == schedule else ""}>{s}</option>'
                       for s in SCHEDULES)
        sliders = [f'<label>schedule <select data-key="schedule" disabled>{opts}</select>'
                   "</label>"]
        for name, values, value in (("p", self.ps, p), ("m", self.ms, m), ("v", self.vs, v)):
            sliders.append(
                f'<label style="margin-left:1em">{name} <input type="range" data-key="{name}" min="0" '
                f'max="{len(values) - 1}" value="{values.index(value)}" disabled '
                f"data-values=\"{','.join(map(str, values))}\">"
                f'<output data-for="{name}">{value}</output></label>')
        return " ".join(sliders)

    def html(self):
        """A snippet: the controls (enabled by the script), the default run's text,
        an SVG timeline the script draws, and the script."""
        packed = self.packed()
        uid = element_id("ringlab-pipeline", packed)
        text = self.runs[self.key(*self.default)]["text"]
        return (f'<div class="ringlab-pipeline" id="{uid}">'
                f'<p class="rpe-controls">{self._controls()}</p>'
                f'<pre class="rpe-text" style="white-space: pre-wrap">{html.escape(text)}</pre>'
                f'<svg class="rpe-timeline" width="100%" role="img" '
                f'aria-label="pipeline timeline"></svg></div>\n'
                f"<script>(function () {{\n"
                f"  var root = document.getElementById('{uid}');\n"
                + unpack_js(packed, f"function (data) {{ {_SCRIPT} }}") +
                f"}})();</script>\n")

    def _repr_html_(self):
        return self.html()


# The drawing (run inside the unpacking callback, with ``root`` and ``data``):
# one row per rank, one box per action coloured as ``drawing.plot_pipeline``
# colours it (microbatch colour, F light, B full, W dark), odd model chunks
# with a dashed outline, microbatch numbers where a box is wide enough.
_SCRIPT = r"""
  var NS = 'http://www.w3.org/2000/svg', svg = root.querySelector('svg');
  var out = root.querySelector('pre'), inputs = root.querySelectorAll('[data-key]');
  function value(el) {
    if (el.tagName === 'SELECT') return el.value;
    return el.dataset.values.split(',')[+el.value];
  }
  function add(parent, tag, attrs, text) {
    var el = document.createElementNS(NS, tag);
    for (var k in attrs) el.setAttribute(k, attrs[k]);
    if (text !== undefined) el.textContent = text;
    parent.appendChild(el);
    return el;
  }
  function draw(run, p) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var left = 56, width = 760, row = 26, top = 6;
    svg.setAttribute('viewBox', '0 0 ' + (left + width + 8) + ' ' + (top + row * p + 24));
    if (!run.boxes) { svg.setAttribute('data-boxes', '0'); return; }
    var scale = width / run.end;
    for (var r = 0; r < p; r++)
      add(svg, 'text', {x: 0, y: top + row * r + 17, 'font-size': 13}, 'rank ' + r);
    run.boxes.forEach(function (b) {
      var x = left + b[1] * scale, w = (b[2] - b[1]) * scale, y = top + row * b[0];
      var odd = Math.floor(b[4] / p) % 2 === 1;
      var rect = add(svg, 'rect', {x: x, y: y, width: Math.max(w - 1, 0.5), height: row - 4,
        fill: data.colours[b[3] % data.colours.length][b[5]],
        stroke: odd ? '#222' : 'none', 'stroke-dasharray': odd ? '3,2' : 'none',
        'class': 'rpe-box', 'data-kind': 'FBW'[b[5]], 'data-mb': b[3]});
      if (w >= 14)
        add(svg, 'text', {x: x + w / 2, y: y + 15, 'font-size': 11, 'text-anchor': 'middle',
          fill: b[5] === 0 ? '#000' : '#fff'}, String(b[3]));
    });
    add(svg, 'text', {x: left, y: top + row * p + 18, 'font-size': 12},
      'time (t_f = 1); colour: microbatch; F light, B full, W dark; dashed: chunk 1, 3, ...');
    svg.setAttribute('data-boxes', run.boxes.length);
  }
  function update() {
    var v = {};
    inputs.forEach(function (el) { v[el.dataset.key] = value(el); });
    root.querySelectorAll('output').forEach(function (o) { o.textContent = v[o.dataset.for]; });
    var inter = v.schedule === 'interleaved_1f1b';
    root.querySelector('[data-key=v]').disabled = !inter;
    var run = data.runs[[v.schedule, v.p, v.m, inter ? v.v : 1].join(',')];
    out.textContent = run.text;
    draw(run, +v.p);
  }
  inputs.forEach(function (el) {
    el.disabled = false; el.addEventListener('input', update);
    el.addEventListener('change', update); });
  root.setAttribute('data-ready', '1');
  update();
"""


def explorer(**options):
    """``PipelineExplorer(**options)``: the static, kernel-free explorer."""
    return PipelineExplorer(**options)
