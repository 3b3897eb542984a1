"""``analyze(model, layout, hardware)``: one training iteration, per GPU.

What the step time is made of, and what is assumed to overlap (Megatron-LM
2021's behaviour unless a layout flag says otherwise):

* compute: ``flops_per_iteration / gpus`` at ``hardware.achieved`` of peak,
  spread evenly over microbatches and stages;
* tensor-parallel collectives: on the critical path, none overlapped: each
  microbatch on a stage takes its compute plus its TP communication, ``T``;
* the pipeline: ``(m + (p-1)/v) T`` (bubble ``(p-1)/(v m)`` of ``m T``,
  Narayanan et al. 2021, sec. 2.2; ``ringlab.pipeline.bubble``), plus the
  pipeline messages that are not hidden: GPipe and interleaved 1F1B expose
  the fill and the drain, ``2 (v p - 1)`` message times; plain 1F1B, whose
  steady state has no slack, exposes the round trip of a gradient too:
  ``2 (p-1) + 2 (min(m, p) - 2) + 2 (p-1)(m-p)/p`` message times (the last
  two terms only where positive). These hold
  when a message takes less than a forward; they are what ringlab's
  simulator gives, checked in ``tests/test_analysis.py``;
* data parallelism: an AllReduce or ReduceScatter of the gradients runs under
  the last microbatch's backward if ``layout.overlap_dp`` (ZeRO-2 under every
  microbatch's, ZeRO-3's gathers under all compute: prefetch); what does not
  fit is exposed. The parameter AllGather of ZeRO-1/2 follows the optimizer
  step and is exposed. The optimizer step itself is not timed.

MFU counts the model's FLOPs (no recomputation) against peak; HFU and
``tflops_per_gpu`` the FLOPs done (Narayanan et al. report the latter, with
full recomputation: their equation 3).

    >>> from ringlab.analysis import presets
    >>> r = analyze(presets.MODELS["gpt3-175b"], Layout(dp=8, tp=8, pp=12, global_batch=256,
    ...             recompute="full"), presets.HARDWARE["dgx-a100"])
    >>> round(r.bubble, 4), r.layout.microbatches      # (p - 1) / m = 11 / 32
    (0.3438, 32)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..pipeline.bubble import bubble_closed_form
from . import comm as comms
from .compute import compute_seconds, flops_per_iteration
from .config import Hardware, Layout, Model
from .memory import memory, params_per_gpu


def link_cost(hardware, link):
    """(alpha, beta) of a link: latency, seconds per byte."""
    if link == "intra":
        return hardware.intra_latency, 1 / hardware.intra_bw
    return hardware.inter_latency, 1 / hardware.inter_bw


def pp_exposed_messages(p, m, v=1, schedule="1f1b"):
    """Message times of the pipeline left on the critical path (see the module)."""
    if p == 1:
        return 0
    if schedule == "gpipe" or v > 1:
        return 2 * (v * p - 1)
    # fill and drain; one more round trip per microbatch in flight past the second;
    # in the steady state 2 (p-1) links crossed every p microbatches
    return 2 * (p - 1) + 2 * max(min(m, p) - 2, 0) + 2 * (p - 1) * max(m - p, 0) / p


def bubble_fraction(layout):
    if layout.schedule == "gpipe":
        return float(bubble_closed_form("gpipe", layout.pp, layout.microbatches))
    name = "interleaved_1f1b" if layout.interleave > 1 else "one_f_one_b"
    return float(bubble_closed_form(name, layout.pp, layout.microbatches, layout.interleave))


@dataclass
class Report:
    """Everything ``analyze`` worked out, per iteration and per GPU (seconds, bytes)."""

    model: Model
    layout: Layout
    hardware: Hardware
    comms: list
    times: dict
    flops: float
    model_flops: float
    bubble: float
    memory: dict
    links: dict
    params_per_gpu: int
    step: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def mfu(self):
        return self.model_flops / (self.step * self.layout.gpus * self.hardware.peak_flops)

    @property
    def hfu(self):
        return self.flops / (self.step * self.layout.gpus * self.hardware.peak_flops)

    @property
    def tflops_per_gpu(self):
        """FLOPs done per second per GPU, in 1e12: what Narayanan et al. report."""
        return self.flops / self.step / self.layout.gpus / 1e12

    @property
    def fits(self):
        return self.memory["total"] <= self.hardware.memory

    def by_kind(self):
        """``{kind: bytes sent per iteration}``."""
        return {c.kind: c.bytes_sent for c in self.comms}

    def to_dict(self):
        lay = self.layout
        return {
            "model": self.model.name, "params": self.model.params,
            "layout": {k: getattr(lay, k) for k in lay.__dataclass_fields__} | {"gpus": lay.gpus},
            "hardware": self.hardware.name,
            "comm": [{"kind": c.kind, "op": c.op, "group": c.group, "link": c.link,
                      "count": c.count, "nbytes_each": c.nbytes, "bytes_sent": c.bytes_sent,
                      "seconds": c.seconds, "overlap": c.overlap} for c in self.comms],
            "times": self.times, "bubble": self.bubble, "step_seconds": self.step,
            "flops": self.flops, "model_flops": self.model_flops, "mfu": self.mfu,
            "hfu": self.hfu, "tflops_per_gpu": self.tflops_per_gpu,
            "memory_bytes": self.memory, "fits": self.fits,
            "params_per_gpu": self.params_per_gpu}

    def to_json(self):
        return json.dumps(self.to_dict(), indent=1)

    def table(self):
        """A text report, lines of at most 88 characters."""
        m, lay, hw = self.model, self.layout, self.hardware
        lines = [f"{m.name}: {m.params / 1e9:.2f}B parameters, l={m.layers} h={m.hidden} "
                 f"a={m.heads} s={m.seq_len} V={m.vocab}",
                 f"layout: dp={lay.dp} tp={lay.tp} pp={lay.pp} v={lay.interleave} "
                 f"m={lay.microbatches} b={lay.micro_batch} B={lay.global_batch} "
                 f"sp={'on' if lay.sp else 'off'} zero={lay.zero} recompute={lay.recompute}",
                 f"hardware: {hw.name}, {lay.gpus} GPUs, {hw.gpus_per_node} per node, "
                 f"{hw.achieved:.0%} of {hw.peak_flops / 1e12:g} TFLOP/s",
                 "",
                 f"{'communication':<18}{'group':>9}{'count':>8}{'GB sent':>11}"
                 f"{'seconds':>11}  overlap"]
        for c in self.comms:
            lines.append(f"{c.kind:<18}{c.group:>4} {c.link:<5}{c.count:>7}"
                         f"{c.bytes_sent / 1e9:>11.3f}{c.seconds:>11.4f}  {c.overlap}")
        t = self.times
        lines += ["",
                  f"compute {t['compute']:.3f} s, TP comm {t['tp']:.3f} s, bubble "
                  f"{self.bubble:.3f} ({t['bubble']:.3f} s)",
                  f"exposed: pipeline messages {t['pp_exposed']:.4f} s, data-parallel "
                  f"{t['dp_exposed']:.4f} s",
                  f"step {self.step:.3f} s: {self.tflops_per_gpu:.1f} TFLOP/s per GPU, "
                  f"MFU {self.mfu:.1%}, HFU {self.hfu:.1%}",
                  "",
                  "memory per GPU (GB): " + ", ".join(
                      f"{k} {v / 1e9:.2f}" for k, v in self.memory.items() if k != "total"),
                  f"total {self.memory['total'] / 1e9:.2f} GB: fits in {hw.memory / 1e9:g} GB: "
                  f"{'yes' if self.fits else 'NO'}"]
        return "\n".join(lines)


def analyze(model, layout, hardware):
    """One iteration of ``model`` split by ``layout`` on ``hardware`` -> ``Report``."""
    layout.check(model, hardware)
    lay, hw = layout, hardware
    links = comms.links(lay, hw)
    psi = params_per_gpu(model, lay)
    all_comms = (comms.tp_comms(model, lay, links["tp"]) + comms.pp_comms(model, lay, links["pp"])
                 + comms.dp_comms(model, lay, psi, links["dp"]))
    for c in all_comms:
        c.seconds = c.time(*link_cost(hw, c.link))
    flops = flops_per_iteration(model, lay.global_batch, lay.recompute)
    model_flops = flops_per_iteration(model, lay.global_batch, "none")
    m, p, v = lay.microbatches, lay.pp, lay.interleave
    compute = compute_seconds(flops, lay.gpus, hw)
    tp = sum(c.seconds for c in all_comms
             if c.kind.startswith("tp_") and c.kind != "tp_sp_grad_sync")
    per_mb = (compute + tp) / m                       # T: one microbatch on one stage
    bubble = bubble_fraction(lay)
    pipeline = m * per_mb * (1 + bubble)
    pp_msg = [c for c in all_comms if c.kind == "pp_send"]
    pp_exposed = 0.0
    if pp_msg:
        one = pp_msg[0].time_one(*link_cost(hw, pp_msg[0].link))
        pp_exposed = pp_exposed_messages(p, m, v, lay.schedule) * one
    # the windows data-parallel communication can hide in
    backward_share = 0.75 if lay.recompute == "full" else 2 / 3
    last_backward = compute / m * backward_share
    dp = [c for c in all_comms if c.kind.startswith(("dp_", "zero3_"))]
    hideable = sum(c.seconds for c in dp if c.overlap == "overlappable" and lay.overlap_dp)
    window = {0: last_backward, 1: last_backward, 2: m * last_backward, 3: compute}[lay.zero]
    dp_exposed = (sum(c.seconds for c in dp) - hideable) + max(0.0, hideable - window)
    sp_sync = sum(c.seconds for c in all_comms if c.kind == "tp_sp_grad_sync")
    step = pipeline + pp_exposed + dp_exposed + sp_sync
    times = {"compute": compute, "tp": tp, "bubble": m * per_mb * bubble,
             "pp_exposed": pp_exposed, "dp_exposed": dp_exposed, "sp_grad_sync": sp_sync,
             "step": step}
    return Report(model, lay, hw, all_comms, times, flops, model_flops, bubble,
                  memory(model, lay), links, psi, step)
