"""``analyze(model, layout, hardware)``: one training iteration, per GPU.

What the step time is made of, and what is assumed to overlap:

* compute, per microbatch and model chunk: its layers' matmuls, attention and
  memory-bound kernels (``ringlab.analysis.timing``: each GEMM from its shape,
  the kernels at HBM bandwidth), the embedding on the first chunk, the logits
  and the loss on the last;
* tensor-parallel collectives: on the critical path, except what
  ``layout.overlap_tp`` hides under the matmul next to it ("backward", the
  default: Megatron-LM's asynchronous input-gradient collective under the
  weight-gradient GEMM; "full": every collective, chunked); the context-parallel
  K/V ring under the attention blocks (the all-gather variant is exposed) and
  the experts' AlltoAlls exposed. A microbatch on chunk k takes ``F_k + B_k``,
  compute plus what is exposed of these;
* the pipeline (``pipeline_seconds``): for equal chunks Narayanan et al.'s
  ``(m + (p-1)/v)`` times a rank's work per microbatch (bubble ``(p-1)/(v m)``;
  ``ringlab.pipeline.bubble``); for unequal ones (the first chunk has the
  embedding, the last the logits and the loss, a split may be uneven) the
  schedule itself, each action as soon as its rank and its input are ready
  (``ringlab.pipeline.validate.makespan_of``). On top, the pipeline messages
  that are not hidden: GPipe
  and interleaved 1F1B expose the fill and the drain, ``2 (v p - 1)`` message
  times, or ``2 (p - 1)`` when the interleaved schedule overlaps its sends
  (``overlap_pp``, Megatron-LM's default); plain 1F1B, whose steady state has
  no slack, exposes the round trip of a gradient too: ``2 (p-1) + 2 (min(m, p) - 2)
  + 2 (p-1)(m-p)/p`` message times (the last two terms only where positive).
  These hold when a message takes less than a forward; they are what ringlab's
  simulator gives, checked in ``tests/analysis/test_analysis.py``;
* data parallelism: an AllReduce or ReduceScatter of the gradients runs under
  the last microbatch's backward if ``layout.overlap_dp`` (ZeRO-2 under every
  microbatch's, ZeRO-3's gathers under all compute: prefetch); what does not
  fit is exposed. The parameter AllGather of ZeRO-1/2 follows the optimizer
  step and is exposed, unless ``overlap_param_gather`` runs it under the
  first microbatch's forward;
* the optimizer step (``timing.optimizer_seconds``) and, with sequence
  parallelism, the LayerNorm gradients' AllReduce, after everything else.

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

import functools
import json
from dataclasses import dataclass, field

from ..pipeline.bubble import bubble_closed_form
from ..pipeline.schedules import gpipe, interleaved_1f1b, one_f_one_b
from ..pipeline.validate import makespan_of
from . import traffic as comms
from .compute import flops_per_iteration
from .config import Hardware, Layout, Model
from .gpu_memory import busiest_rank, chunk_layers, memory, rank_chunks, rank_params
from .timing import PARTS, embedding_work, head_work, layer_work, optimizer_seconds


def link_bw(hardware, link):
    """Bytes per second a collective moves on ``link``: the line rate times the
    fraction NCCL reaches (``intra_efficiency``, ``inter_efficiency``)."""
    if link == "intra":
        return hardware.intra_bw * hardware.intra_efficiency
    return hardware.inter_bw * hardware.inter_efficiency


def link_cost(hardware, link):
    """(alpha, beta) of a link: latency, seconds per byte.

    >>> from ringlab.analysis.config import Hardware
    >>> link_cost(Hardware(intra_bw=300e9, intra_efficiency=0.75), "intra")[1] * 225e9
    1.0
    """
    latency = hardware.intra_latency if link == "intra" else hardware.inter_latency
    return latency, 1 / link_bw(hardware, link)


def comm_seconds(comm, hardware):
    """Seconds of all ``comm.count`` collectives on their link; an AlltoAll whose
    peers are partly in the node sends both parts at once, one over NVLink and
    one over the NICs, and takes the longer (plus one latency)."""
    if comm.op != "alltoall" or comm.group == 1:
        return comm.time(*link_cost(hardware, "intra" if comm.link == "intra" else "inter"))
    out = comm.bytes_sent / comm.count
    intra, inter = out * comm.intra_share, out * (1 - comm.intra_share)
    latency = hardware.inter_latency if inter else hardware.intra_latency
    return comm.count * (latency + max(intra / link_bw(hardware, "intra"),
                                       inter / link_bw(hardware, "inter")))


def pp_exposed_messages(p, m, v=1, schedule="1f1b", overlap=False):
    """Message times of the pipeline left on the critical path (see the module)."""
    if p == 1:
        return 0
    if v > 1 and overlap:
        return 2 * (p - 1)
    if schedule == "gpipe" or v > 1:
        return 2 * (v * p - 1)
    # fill and drain; one more round trip per microbatch in flight past the second;
    # in the steady state 2 (p-1) links crossed every p microbatches
    return 2 * (p - 1) + 2 * max(min(m, p) - 2, 0) + 2 * (p - 1) * max(m - p, 0) / p


@functools.lru_cache(maxsize=4096)
def _makespan(forward, backward, p, m, v, schedule):
    plan = (gpipe(p, m) if schedule == "gpipe" else
            interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m))
    return makespan_of(plan, lambda a: forward[a.stage] if a.kind == "F" else backward[a.stage])


def pipeline_seconds(forward, backward, p, m, v=1, schedule="1f1b"):
    """Makespan of m microbatches through p pipeline ranks of v chunks each, chunk
    k taking ``forward[k]`` and ``backward[k]`` per microbatch, messages free.
    Equal chunks: Narayanan et al.'s ``(m + (p-1)/v) v (F + B)``. Unequal: the
    schedule run action by action (``ringlab.pipeline.validate.makespan_of``);
    past 4p microbatches the makespan grows by the same amount every p of them
    (exactly, in the tests, for chunks within a factor of two of each other), so
    it is run for 3p and 4p and extended."""
    if p == 1:
        return m * (sum(forward) + sum(backward))
    if len(set(zip(forward, backward))) == 1:
        one = v * (forward[0] + backward[0])              # a rank's work per microbatch
        return (m + (p - 1) / v) * one if schedule == "1f1b" else (m + p - 1) * one

    def run(mm):
        return _makespan(tuple(forward), tuple(backward), p, mm, v, schedule)

    if m <= 4 * p:
        return run(m)
    t3, t4 = run(3 * p), run(4 * p)
    return t3 + (m - 3 * p) * (t4 - t3) / p


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
        onoff = {True: "on", False: "off"}
        lines = [f"{m.name}: {m.params / 1e9:.2f}B parameters, l={m.layers} h={m.hidden} "
                 f"a={m.heads} s={m.seq_len} V={m.vocab}",
                 f"  ffn={m.ffn} {m.settings()}",
                 f"layout: dp={lay.dp} tp={lay.tp} pp={lay.pp} v={lay.interleave} "
                 f"m={lay.microbatches} b={lay.micro_batch} B={lay.global_batch} "
                 f"sp={onoff[lay.sp]} zero={lay.zero} recompute={lay.recompute}",
                 f"  cp={lay.cp}{'(' + lay.cp_kind + ')' if lay.cp > 1 else ''} ep={lay.ep} "
                 f"attention={lay.attention} fp8={onoff[lay.fp8]} grads={8 * m.grad_bytes}-bit"
                 f"; overlap: tp={lay.overlap_tp} dp={onoff[lay.overlap_dp]}",
                 f"  param-gather={onoff[lay.overlap_param_gather]} pp={onoff[lay.overlap_pp]}"
                 + (f" layers per chunk {runs(lay.split(m))}"
                    if len(set(lay.split(m))) > 1 else ""),
                 f"hardware: {hw.name}, {lay.gpus} GPUs, {hw.gpus_per_node} per node, "
                 f"{hw.peak_flops / 1e12:g} TFLOP/s, HBM {hw.hbm_bw / 1e12:.2f} TB/s",
                 f"  efficiency: GEMMs {hw.efficiency:.1%} at best, attention "
                 f"{hw.attention_efficiency:.1%}, memory-bound {hw.hbm_efficiency:.0%}"
                 + (f", FP8 GEMMs {hw.fp8_efficiency:.1%}" if lay.fp8 else ""),
                 f"  links (NCCL's share): in a node {hw.intra_bw / 1e9:g} GB/s x "
                 f"{hw.intra_efficiency:.1%}, between nodes {hw.inter_bw / 1e9:g} GB/s x "
                 f"{hw.inter_efficiency:.1%}",
                 "",
                 f"{'communication':<20}{'group':>9}{'count':>8}{'GB sent':>11}"
                 f"{'seconds':>11}  overlap"]
        for c in self.comms:
            lines.append(f"{c.kind:<20}{c.group:>4} {c.link:<5}{c.count:>7}"
                         f"{c.bytes_sent / 1e9:>11.3f}{c.seconds:>11.4f}  {c.overlap}")
        t = self.times
        lines += ["",
                  f"compute {t['compute']:.3f} s: matmuls {t['matmul']:.3f}, attention "
                  f"{t['attention']:.3f}, memory-bound {t['memory_bound']:.3f}",
                  f"exposed: TP {t['tp']:.3f} s, CP {t['cp']:.3f} s, EP {t['ep']:.3f} s; "
                  f"bubble {self.bubble:.3f} ({t['bubble']:.3f} s)",
                  f"exposed: pipeline messages {t['pp_exposed']:.4f} s, data-parallel "
                  f"{t['dp_exposed']:.4f} s, optimizer {t['optimizer']:.4f} s",
                  f"step {self.step:.3f} s: {self.tflops_per_gpu:.1f} TFLOP/s per GPU, "
                  f"MFU {self.mfu:.1%}, HFU {self.hfu:.1%}",
                  "",
                  "memory per GPU (GB): " + ", ".join(
                      f"{k} {v / 1e9:.2f}" for k, v in self.memory.items() if k != "total"),
                  f"total {self.memory['total'] / 1e9:.2f} GB: fits in {hw.memory / 1e9:g} GB: "
                  f"{'yes' if self.fits else 'NO'}"]
        return "\n".join(lines)


def runs(counts):
    """``(0, 1, 1, 1, 0)`` -> "0,1x3,0": a stage split, short.

    >>> runs((7, 8, 8, 8, 7))
    '7,8x3,7'
    """
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}" + (f"x{j - i}" if j - i > 1 else ""))
        i = j
    return ",".join(out)


GEMM_INDEX = {"fwd": 0, "dgrad": 1, "wgrad": 2}


def _tp_exposed(model, layout, work, seconds, blocks):
    """``(forward, backward, hidden)`` seconds of tensor-parallel collectives of
    one layer per microbatch: each collective less the matmul it hides under."""
    names = [("qkv", "proj")]
    if blocks == 2:
        names.append(("shared_fc1", "shared_fc2") if "shared_fc1" in work.gemms
                     else ("fc1", "fc2"))
    fwd = bwd = hidden = 0.0
    for inner, outer in names:
        for op, when, pair in comms.tp_pairs_per_block(layout.sp, layout.recompute,
                                                        layout.overlap_tp):
            window = 0.0
            if pair is not None:
                linear, which = pair
                window = work.gemms[inner if linear == "in" else outer][GEMM_INDEX[which]]
            exposed = max(0.0, seconds[op] - window)
            hidden += seconds[op] - exposed
            if when == "fwd":
                fwd += exposed
            else:
                bwd += exposed
    return fwd, bwd, hidden


def _cp_exposed(model, layout, work, hw, link):
    """``(forward, backward)`` exposed context-parallel seconds of one layer per
    microbatch. Ring: each of the c - 1 K/V passes (backward: K/V with their
    gradients, then the gradients' last step home) runs under one block's
    attention; all-gather: the AllGather and the ReduceScatter are exposed."""
    c = layout.cp
    if c == 1:
        return 0.0, 0.0
    n = comms.cp_block_bytes(model, layout)
    alpha, beta = link_cost(hw, link)
    again = layout.recompute == "full"
    if layout.cp_kind == "ring":
        fwd_block = work.forward["attention"] / c
        bwd_block = (work.backward["attention"] - work.recompute["attention"]) / c
        fwd = (c - 1) * max(0.0, alpha + n * beta - fwd_block)
        bwd = (c - 1) * max(0.0, alpha + 2 * n * beta - bwd_block) + alpha + n * beta
        return fwd, bwd + (fwd if again else 0.0)
    gather = comms.Traffic("cp_kv", "allgather", c, n * c, 1).time_one(alpha, beta)
    scatter = comms.Traffic("cp_dkv", "reduce_scatter", c, n * c, 1).time_one(alpha, beta)
    return gather, scatter + (gather if again else 0.0)


def analyze(model, layout, hardware):
    """One iteration of ``model`` split by ``layout`` on ``hardware`` -> ``Report``."""
    layout.check(model, hardware)
    lay, hw = layout, hardware
    links = comms.links(lay, hw)
    m, p, v, t = lay.microbatches, lay.pp, lay.interleave, lay.tp
    chunks = chunk_layers(model, lay)
    dense = layer_work(model, lay, hw)
    moe = layer_work(model, lay, hw, moe=True) if model.experts else None
    emb, head = embedding_work(model, lay, hw), head_work(model, lay, hw)

    # one collective of each tensor-parallel op on its link
    act = lay.micro_batch * model.seq_len // lay.cp * model.hidden * model.act_bytes
    a_tp, b_tp = link_cost(hw, links["tp"])
    one_tp = {op: comms.Traffic("tp", op, t, act, 1).time_one(a_tp, b_tp)
              for op in ("allreduce", "allgather", "reduce_scatter")}
    ep_one = 0.0
    if moe is not None:
        ep_list = comms.ep_comms(model, lay, 1, hw.gpus_per_node)
        if ep_list:
            c = ep_list[0]
            ep_one = comm_seconds(c, hw) / lay.microbatches    # one layer, one microbatch

    def layer_cost(layer):
        """{"compute": {part: (fwd, bwd)}, "tp", "cp", "ep": (fwd, bwd), "hidden"}."""
        is_moe = model.is_moe(layer)
        work = moe if is_moe else dense
        tp_f, tp_b, hidden = _tp_exposed(model, lay, work, one_tp,
                                         comms.tp_blocks(model, layer)) if t > 1 else (0, 0, 0)
        cp_f, cp_b = _cp_exposed(model, lay, work, hw, links["cp"])
        ep = ep_one if is_moe else 0.0
        ep_f, ep_b = (ep / 2, ep / 2) if not lay.recompute == "full" else (ep / 3, 2 * ep / 3)
        return work, (tp_f, tp_b), (cp_f, cp_b), (ep_f, ep_b), hidden

    costs = {}
    for k, (start, n) in enumerate(chunks):
        parts = {name: [0.0, 0.0] for name in PARTS + ("tp", "cp", "ep", "tp_hidden")}
        extra = ([emb] if k == 0 else []) + ([head] if k == lay.stages - 1 else [])
        for layer in range(start, start + n):
            work, tp_fb, cp_fb, ep_fb, hidden = layer_cost(layer)
            for part in PARTS:
                parts[part][0] += work.forward[part]
                parts[part][1] += work.backward[part]
            for name, fb in (("tp", tp_fb), ("cp", cp_fb), ("ep", ep_fb)):
                parts[name][0] += fb[0]
                parts[name][1] += fb[1]
            parts["tp_hidden"][1] += hidden
        for work in extra:
            for part in PARTS:
                parts[part][0] += work.forward[part]
                parts[part][1] += work.backward[part]
        costs[k] = parts

    critical = PARTS + ("tp", "cp", "ep")
    forward = [sum(costs[k][name][0] for name in critical) for k in range(lay.stages)]
    backward = [sum(costs[k][name][1] for name in critical) for k in range(lay.stages)]
    per_rank = [sum(forward[k] + backward[k] for k in rank_chunks(model, lay, r))
                for r in range(p)]
    crit = max(range(p), key=lambda r: per_rank[r])
    pipeline = pipeline_seconds(forward, backward, p, m, v, lay.schedule)

    def crit_sum(names, which=(0, 1)):
        return m * sum(costs[k][name][i] for k in rank_chunks(model, lay, crit)
                       for name in names for i in which)

    crit_layers = [start + i for k in rank_chunks(model, lay, crit)
                   for start, n in [chunks[k]] for i in range(n)]
    moe_layers = sum(model.is_moe(j) for j in crit_layers)
    dense_psi, expert_psi = rank_params(model, lay, crit)
    all_comms = (comms.tp_comms(model, lay, links["tp"], crit_layers)
                 + comms.cp_comms(model, lay, len(crit_layers), links["cp"])
                 + comms.ep_comms(model, lay, moe_layers, hw.gpus_per_node)
                 + comms.pp_comms(model, lay, links["pp"])
                 + comms.dp_comms(model, lay, dense_psi, links["dp"], expert_psi,
                                  links["expert_dp"]))
    for c in all_comms:
        c.seconds = comm_seconds(c, hw)

    pp_msg = [c for c in all_comms if c.kind == "pp_send"]
    pp_exposed = 0.0
    if pp_msg:
        one = pp_msg[0].time_one(*link_cost(hw, pp_msg[0].link))
        pp_exposed = pp_exposed_messages(p, m, v, lay.schedule, lay.overlap_pp) * one

    compute = crit_sum(PARTS)
    last_backward = crit_sum(PARTS, which=(1,)) / m
    first_forward = crit_sum(PARTS, which=(0,)) / m
    dp = [c for c in all_comms if c.kind.startswith(("dp_", "zero3_", "ex_"))]
    grads = [c for c in dp if c.overlap == "overlappable"]
    gathers = [c for c in dp if c.overlap == "exposed"]
    hideable = sum(c.seconds for c in grads) if lay.overlap_dp else 0.0
    window = {0: last_backward, 1: last_backward, 2: m * last_backward, 3: compute}[lay.zero]
    dp_exposed = (sum(c.seconds for c in grads) - hideable) + max(0.0, hideable - window)
    gather = sum(c.seconds for c in gathers)
    dp_exposed += max(0.0, gather - first_forward) if lay.overlap_param_gather else gather

    local = dense_psi + expert_psi
    updated = local
    if lay.zero >= 1:
        updated = dense_psi / (lay.dp * lay.cp) + expert_psi / (lay.dp * lay.cp * t / lay.ep)
    optimizer = optimizer_seconds(updated, local, model.grad_bytes, hw)
    sp_sync = sum(c.seconds for c in all_comms if c.kind == "tp_sp_grad_sync")
    step = pipeline + pp_exposed + dp_exposed + sp_sync + optimizer

    flops = flops_per_iteration(model, lay.global_batch, lay.recompute)
    model_flops = flops_per_iteration(model, lay.global_batch, "none")
    times = {"compute": compute, "matmul": crit_sum(("matmul",)),
             "attention": crit_sum(("attention",)), "memory_bound": crit_sum(("memory",)),
             "tp": crit_sum(("tp",)), "tp_hidden": crit_sum(("tp_hidden",)),
             "cp": crit_sum(("cp",)), "ep": crit_sum(("ep",)),
             "bubble": pipeline - m * per_rank[crit], "pipeline": pipeline,
             "pp_exposed": pp_exposed, "dp_exposed": dp_exposed, "sp_grad_sync": sp_sync,
             "optimizer": optimizer, "step": step}
    return Report(model, lay, hw, all_comms, times, flops, model_flops, bubble_fraction(lay),
                  memory(model, lay), links, sum(rank_params(model, lay,
                                                             busiest_rank(model, lay))),
                  step, {"per_rank": per_rank, "critical_rank": crit, "forward": forward,
                         "backward": backward})
