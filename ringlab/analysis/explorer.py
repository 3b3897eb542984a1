"""A panel for the closing chapter: a preset model, a cluster and the layout's
knobs (dp, tp, pp, microbatches, SP, ZeRO, recomputation) -> the step time, the
bubble, the memory and the MFU that ``ringlab.analysis.analyze`` works out.

``summary(...)`` does the work and returns the text; ``analysis_panel()`` puts
ipywidgets controls on it in a live notebook (ipywidgets is imported only
there). ``explorer(...)`` is the static book's version: every layout of a fixed
cluster and batch is analyzed ahead (they take milliseconds) and a few lines of
JavaScript pick one with drop-down menus, so the built HTML answers without a
kernel; without JavaScript it shows the default layout's text.

    >>> text = summary("gpt3-175b", dp=32, tp=8, pp=4, microbatches=48, zero=1)
    >>> text.splitlines()[0]
    'dp32-tp8-pp4-z1: 1024 GPUs, B = 1536 sequences, m = 48 microbatches of 1'
    >>> explorer().choices["tp"]
    [1, 2, 4, 8, 16]
"""

from __future__ import annotations

import html
import itertools

from . import Layout, analyze, presets
from ..show.packed import element_id, pack, unpack_js
from .compare import label

RECOMPUTE = ("none", "selective", "full")


def lines(report):
    """The panel's text for one report: what decides a layout, one line each."""
    r, lay, t = report, report.layout, report.times
    mem = r.memory
    return [f"{label(lay)}: {lay.gpus} GPUs, B = {lay.global_batch} sequences, "
            f"m = {lay.microbatches} microbatches of {lay.micro_batch}",
            f"step time  {r.step:8.3f} s = compute {t['compute']:.3f} + TP exposed "
            f"{t['tp']:.3f} + bubble {t['bubble']:.3f}",
            f"{'':21}+ exposed PP {t['pp_exposed']:.3f} + DP {t['dp_exposed']:.3f}"
            f" + SP sync {t['sp_grad_sync']:.3f} + optimizer {t['optimizer']:.3f}",
            f"bubble     {r.bubble:8.3f} = (p - 1) / (v m); {t['bubble']:.3f} s idle with "
            f"these stages",
            f"memory     {mem['total'] / 1e9:8.1f} GB per GPU (states "
            f"{(mem['total'] - mem['activations']) / 1e9:.1f}, activations "
            f"{mem['activations'] / 1e9:.1f}): fits in {r.hardware.memory / 1e9:g} GB: "
            f"{'yes' if r.fits else 'NO'}",
            f"MFU        {r.mfu:8.1%}   (HFU {r.hfu:.1%}, {r.tflops_per_gpu:.1f} TFLOP/s "
            f"per GPU done)"]


def summary(model="gpt3-175b", hardware="dgx-a100", *, dp=1, tp=1, pp=1, microbatches=1,
            micro_batch=1, sp=False, zero=0, recompute="none"):
    """``lines`` of the preset ``model`` on the preset ``hardware`` as one string,
    or the sentence saying why the layout is impossible."""
    try:
        lay = Layout(dp=dp, tp=tp, pp=pp, microbatches=microbatches, micro_batch=micro_batch,
                     sp=sp, zero=zero, recompute=recompute)
        report = analyze(presets.MODELS[model], lay, presets.HARDWARE[hardware])
    except ValueError as exc:
        return f"not possible: {exc}"
    return "\n".join(lines(report))


def analysis_panel(model="gpt3-175b", hardware="dgx-a100"):
    """ipywidgets controls over ``summary`` (live notebooks only): a VBox whose
    ``controls`` are the knobs and whose last child shows the text."""
    import ipywidgets as W

    powers = [2 ** k for k in range(11)]
    controls = dict(
        model=W.Dropdown(options=sorted(presets.MODELS), value=model, description="model"),
        hardware=W.Dropdown(options=sorted(presets.HARDWARE), value=hardware,
                            description="hardware"),
        dp=W.SelectionSlider(options=powers, value=32, description="dp"),
        tp=W.SelectionSlider(options=powers[:6], value=8, description="tp"),
        pp=W.SelectionSlider(options=powers[:7], value=4, description="pp"),
        microbatches=W.IntSlider(48, 1, 256, description="microbatches"),
        sp=W.Checkbox(False, description="sequence parallel"),
        zero=W.ToggleButtons(options=[0, 1, 2, 3], value=1, description="ZeRO"),
        recompute=W.ToggleButtons(options=RECOMPUTE, value="selective",
                                  description="recompute"))
    out = W.HTML()

    def update(*_):
        knobs = {k: c.value for k, c in controls.items()}
        out.value = f"<pre>{html.escape(summary(**knobs))}</pre>"

    for c in controls.values():
        c.observe(update, names="value")
    update()
    box = W.VBox([*controls.values(), out])
    box.controls = controls
    return box


class Explorer:
    """Every layout of ``gpus`` GPUs for a batch of ``global_batch`` sequences
    (dp = gpus / (tp pp), m = B / dp), its text ready: ``texts[key]`` with
    key "tp,pp,sp,zero,recompute". Displays itself as HTML (``_repr_html_``)."""

    def __init__(self, model="gpt3-175b", hardware="dgx-a100", gpus=1024, global_batch=1536,
                 tps=(1, 2, 4, 8, 16), pps=(1, 2, 4, 8, 16, 32),
                 default=(8, 4, 0, 1, "selective")):
        self.model, self.hardware = presets.MODELS[model], presets.HARDWARE[hardware]
        self.choices = {"tp": list(tps), "pp": list(pps), "sp": [0, 1], "zero": [0, 1, 2, 3],
                        "recompute": list(RECOMPUTE)}
        self.texts = {}
        for tp, pp, sp, zero, rc in itertools.product(*self.choices.values()):
            key = f"{tp},{pp},{sp},{zero},{rc}"
            dp, rest = divmod(gpus, tp * pp)
            if rest:
                self.texts[key] = f"not possible: tp x pp = {tp * pp} does not divide {gpus}"
                continue
            try:
                lay = Layout(dp=dp, tp=tp, pp=pp, global_batch=global_batch, sp=bool(sp),
                             zero=zero, recompute=rc)
                self.texts[key] = "\n".join(lines(analyze(self.model, lay, self.hardware)))
            except ValueError as exc:
                self.texts[key] = f"not possible: {exc}"
        self.default = ",".join(map(str, default))
        self.title = (f"{self.model.name} on {gpus} GPUs of {self.hardware.name}, "
                      f"B = {global_batch}")

    def packed(self):
        """``texts`` packed for the page (``show.packed.pack``): 720 layouts' texts
        are 285 kB, packed 26 kB."""
        return pack(self.texts)

    def html(self):
        """A snippet: the menus (enabled by the script), the default layout's text,
        and the script that unpacks ``texts`` and shows the text of the layout the
        menus pick."""
        packed = self.packed()
        uid = element_id("ringlab-analysis", packed)
        names = {"tp": "tp", "pp": "pp", "sp": "SP", "zero": "ZeRO", "recompute": "recompute"}
        selects = []
        for (key, options), value in zip(self.choices.items(), self.default.split(",")):
            opts = "".join(f'<option value="{o}"{" selected" if str(o) == value else ""}>'
                           f"{html.escape(str(o))}</option>" for o in options)
            selects.append(f'<label style="margin-right:1em">{names[key]} '
                           f'<select data-key="{key}" disabled>{opts}</select></label>')
        return (f'<div class="ringlab-analysis" id="{uid}">'
                f"<p><b>{html.escape(self.title)}</b>: pick a layout "
                f"(dp = GPUs / (tp pp), m = B / dp)</p><p>{''.join(selects)}</p>"
                f'<pre style="white-space: pre-wrap">'
                f"{html.escape(self.texts[self.default])}</pre></div>\n"
                f"<script>(function () {{\n"
                f"  var root = document.getElementById('{uid}');\n"
                f"  var sel = root.querySelectorAll('select'), out = root.querySelector('pre');\n"
                + unpack_js(packed, "function (texts) {\n"
                f"    function update() {{\n"
                f"      var key = Array.prototype.map.call(sel, function (s) "
                f"{{ return s.value; }});\n"
                f"      out.textContent = texts[key.join(',')];\n"
                f"    }}\n"
                f"    sel.forEach(function (s) {{\n"
                f"      s.disabled = false; s.addEventListener('change', update); }});\n"
                f"    root.setAttribute('data-ready', '1');\n"
                f"    update();\n"
                f"  }}") +
                f"}})();</script>\n")

    def _repr_html_(self):
        return self.html()


def explorer(**options):
    """``Explorer(**options)``: the static, kernel-free panel."""
    return Explorer(**options)
