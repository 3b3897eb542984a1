"""Published training runs the analyzer was not fitted to: what each team measured.

Every number below is from a text we read (source, table, page where the copy
had one); the comment on each row says which. What the source does not state
(microbatch size, recomputation, overlap) is our assumption, said in the row's
``assumed``. The analyzer's defaults (``presets.HARDWARE``) are measurements
from sources independent of these rows (``presets`` cites each; a first set,
the burst matmul rate and the links' line rates, came out 1.16x optimistic
here, and was replaced by the sustained rate and NCCL's measured share, not by
numbers fitted to these rows). One row group reads its source's stack: Llama 3
with FlashAttention-2's efficiency (``H100_FA2``, said in its ``assumed``).

Each run gives one measured number: an iteration time, or a throughput (TFLOP/s
per GPU or MFU) under the source's own FLOP count, which ``published_step``
turns back into seconds per iteration with that count. ``ratio`` is predicted
over published throughput, i.e. published over predicted step time: above 1 the
analyzer is optimistic.

    >>> run = RUNS[0]
    >>> run.team, run.published, run.metric
    ('NVIDIA', 1.42, 'seconds')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .compute import flops_per_iteration, narayanan_flops
from .config import Hardware, Layout, Model
from .presets import HARDWARE, MODELS

A100, H100 = HARDWARE["dgx-a100"], HARDWARE["dgx-h100"]


@dataclass(frozen=True)
class Run:
    """One published configuration and its measurement. ``metric``: "seconds" (an
    iteration), "model_tflops" (model FLOPs per second per GPU, no recomputation:
    Narayanan et al.'s eq. 7 / PaLM's count, what ``compute.flops_per_iteration``
    counts with recompute "none"), "eq3_tflops" (Narayanan et al.'s eq. 3, full
    recomputation counted) or "model_mfu" (model FLOPs / (time x GPUs x peak))."""

    name: str
    team: str
    source: str
    where: str
    model: Model
    layout: Layout
    hardware: Hardware
    published: float
    metric: str
    assumed: str = ""

    def published_step(self):
        """The measurement as seconds per iteration, by the source's FLOP count."""
        m, lay, hw = self.model, self.layout, self.hardware
        if self.metric == "seconds":
            return self.published
        if self.metric == "eq3_tflops":
            flops = narayanan_flops(lay.global_batch, m.seq_len, m.layers, m.hidden, m.vocab)
            return flops / (lay.gpus * self.published * 1e12)
        flops = flops_per_iteration(m, lay.global_batch, "none")
        if self.metric == "model_tflops":
            return flops / (lay.gpus * self.published * 1e12)
        if self.metric == "model_mfu":
            return flops / (lay.gpus * self.published * hw.peak_flops)
        raise ValueError(f"unknown metric {self.metric!r}")

    def report(self):
        from .step import analyze
        return analyze(self.model, self.layout, self.hardware)

    def ratio(self, report=None):
        """Predicted over published throughput (published / predicted step time)."""
        report = report or self.report()
        return self.published_step() / report.step


def gpt(name, layers, hidden, heads, vocab, seq_len=2048, source=""):
    """A GPT-3-style model as Megatron-LM trains it: GeLU MLP of 4h, biases,
    LayerNorm, learned positions, tied embeddings, dropout 0.1."""
    return Model(name, layers=layers, hidden=hidden, heads=heads, seq_len=seq_len,
                 vocab=vocab, source=source)


# -- NVIDIA: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", arXiv:2205.05198. Table 3 (model configurations: heads, hidden,
# layers, t, p, GPUs, global and micro batch), Table 5 (end-to-end iteration time, "Full
# Recompute" and "Present Work"), sec. 6 ("tensor parallel size is set to 8"; "interleaving
# schedule with three interleaving stages" for 175B and 530B; s = 2048, v = 51200; Selene:
# 8 A100 80GB per node, NVLink/NVSwitch, eight 200 Gb/s HDR InfiniBand HCAs); sec. 6.3
# (the 530B model on 2240 GPUs, 8-way data parallelism: 39.15 s, "we do not use any
# overlapping of gradient all-reduces"). Sec. 6.2: the backward overlaps the all-reduce with
# the linear weight's gradient computation (our overlap_tp="backward"). Page numbers were
# not in the text copy we read.
KORTHIKANTI = "Korthikanti et al. 2022, arXiv:2205.05198"
_K = {  # name: (layers, hidden, heads, t, p, GPUs, global batch, micro batch, v)
    "22B": (48, 6144, 64, 8, 1, 8, 4, 4, 1),
    "175B": (96, 12288, 96, 8, 8, 64, 64, 1, 3),
    "530B": (105, 20480, 128, 8, 35, 280, 280, 1, 3),
    "1T": (128, 25600, 160, 8, 64, 512, 512, 1, 1),
}
# Table 5: iteration time (s), full recompute / present work (sequence parallelism and
# selective recomputation)
_K_TIMES = {"22B": (1.42, 1.10), "175B": (18.13, 13.75), "530B": (49.05, 37.83),
            "1T": (94.42, 71.49)}
_K_ASSUMED = ("unfused attention (Megatron-LM 2022), fp16 weights with fp32 gradients, "
              "pipeline scatter/gather on")


def _korthikanti(size, present, dp=1, seconds=None):
    layers, hidden, heads, t, p, gpus, batch, micro, v = _K[size]
    model = gpt(f"korthikanti-{size.lower()}", layers, hidden, heads, 51200,
                source=KORTHIKANTI + ", Table 3")
    model = dataclasses.replace(model, grad_bytes=4)
    lay = Layout(dp=dp, tp=t, pp=p, micro_batch=micro, global_batch=batch * dp, interleave=v,
                 sp=present, recompute="selective" if present else "full",
                 attention="unfused", pp_scatter_gather=True, overlap_dp=False)
    kind = "present work" if present else "full recompute"
    where = "Table 5" if dp == 1 else "sec. 6.3"
    return Run(f"{size} {kind}" + (f", dp {dp}" if dp > 1 else ""), "NVIDIA", KORTHIKANTI,
               where, model, lay, A100, seconds or _K_TIMES[size][present], "seconds",
               _K_ASSUMED + ("; ZeRO-0 all-reduce, not overlapped (sec. 6.3)" if dp > 1
                             else ""))


# -- ByteDance: Jiang et al. 2024, "MegaScale: Scaling Large Language Model Training to More
# Than 10,000 GPUs", arXiv:2402.15627 (NSDI 2024). The Megatron-LM baseline rows (commit
# 285068c8) of Table 2 ("Strong-scaling training performance for the 175B model"; batch 768
# on 256-1024 GPUs, 6144 on 3072-12288; iteration time in s), Table 1 (175B: 128 heads,
# hidden 12288, 96 layers, TP 8, PP 8), sec. 6.1 (interleaved schedule with six stages for
# 175B; sequence 2048, vocabulary 64,000), sec. 3.6 (eight 200G NICs per server), Table 3
# (the baseline Megatron-LM at 47.7% MFU, 175B on 256 GPUs, batch 256). Their GPUs are
# "NVIDIA Ampere GPUs" (sec. 6); the MFU column matches 312 TFLOP/s per GPU with the
# model FLOPs of Korthikanti et al.'s eq. 7 (checked in tests/analysis/test_analysis_validation.py).
MEGASCALE = "Jiang et al. 2024, arXiv:2402.15627"
_MS_ASSUMED = ("sequence parallelism, selective recomputation, distributed optimizer with fp32 "
               "gradients, one sequence per microbatch; unfused attention, no DP or PP overlap "
               "(MegaScale lists FlashAttention-2 and the 3D overlap as its own additions)")


def _megascale(gpus, batch, seconds=None, mfu=None, where="Table 2"):
    model = gpt("megascale-175b", 96, 12288, 128, 64000, source=MEGASCALE + ", Table 1")
    model = dataclasses.replace(model, grad_bytes=4)
    lay = Layout(dp=gpus // 64, tp=8, pp=8, interleave=6, global_batch=batch, sp=True,
                 recompute="selective", zero=1, attention="unfused", overlap_dp=False,
                 overlap_pp=False)
    value, metric = (seconds, "seconds") if seconds is not None else (mfu, "model_mfu")
    return Run(f"175B, {gpus} GPUs, batch {batch}", "ByteDance", MEGASCALE, where, model, lay,
               A100, value, metric, _MS_ASSUMED)


# -- Meta: Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783. Table 4, p. 10
# ("Scaling configurations and MFU for each stage of Llama 3 405B pre-training": GPUs, TP,
# CP, PP, DP, sequence length, batch size per DP, TFLOPs/GPU, BF16 MFU); Table 3, p. 7 (the
# 405B shape); sec. 3.3.1 (H100 80GB HBM3 at 700 W, 8 per server on NVLink, 400 Gbps
# between GPUs); sec. 3.3.2 (interleaved schedule; "we reduce one Transformer layer each from
# the first and the last stages", so the first chunk holds only the embedding and the last
# only the output and loss; all-gather context parallelism of K and V; FSDP that shards the
# optimizer and gradients and does not reshard the weights after forward; "pre-train Llama 3
# on sequences of 8K tokens without activation checkpointing"; FP32 gradient accumulation
# and reduce-scatter; DP prefetches weights and reduces gradients asynchronously). MFU "as
# Chowdhery et al.": the model FLOPs count. One text copy of Table 4's last row reads DP 4;
# 8 x 16 x 16 x 8 = 16,384 GPUs and 8 x 16 x 131,072 = 16M tokens say 8.
# Two readings where the paper is silent. Overlap: it names it for FSDP ("asynchronously
# prefetching ... and reducing gradients") and for the pipeline ("asynchronous
# point-to-point communication"), none for tensor parallelism, and Meta's stack is not
# Megatron-LM: the TP collectives are taken as not overlapped. Attention: the paper names
# no kernel; FlashAttention-3 (Shah et al., arXiv:2407.08608, with NVIDIA and Meta authors)
# appeared in July 2024, after the 405B pre-training, and its abstract puts the kernel of
# before, FlashAttention-2, at "only 35% utilization" on H100: so 35% here, not the
# preset's FlashAttention-3 figure.
LLAMA3 = "Dubey et al. 2024, arXiv:2407.21783"
_L3_ASSUMED = ("sequence parallelism; v = 8 chunks of one layer (126 layers + the embedding "
               "chunk + the loss chunk on 16 ranks); FSDP as ZeRO-1 with fp32 gradients, "
               "its gathers and reduce-scatters overlapped; TP collectives not overlapped; "
               "FlashAttention-2 (35% of peak), causal; document masks not modelled")
H100_FA2 = dataclasses.replace(H100, name="dgx-h100, FlashAttention-2", attention_efficiency=0.35)


def _llama3(gpus, cp, dp, seq_len, per_dp, tflops):
    model = dataclasses.replace(MODELS["llama3-405b"], seq_len=seq_len, grad_bytes=4)
    lay = Layout(dp=dp, tp=8, pp=16, cp=cp, sp=True, interleave=8, global_batch=dp * per_dp,
                 stage_layers=(0,) + (1,) * 126 + (0,), cp_kind="allgather", zero=1,
                 overlap_param_gather=True, overlap_tp="none")
    return Run(f"405B, {gpus} GPUs, cp {cp}, {seq_len // 1024}K", "Meta", LLAMA3,
               "Table 4, p. 10",
               model, lay, H100_FA2, tflops, "model_tflops", _L3_ASSUMED)


# -- BigScience: BLOOM 176B. bigscience-workshop/bigscience, train/tr11-176B-ml/README.md
# ("Architecture": 70 layers, hidden 14336, 112 heads, the pipeline partition [embed | 5],
# 6 x 10, [5 | embed]; "Replica setup": TP 4, PP 12, DP 8, MBS 2, 384 A100 80GB, 8 per
# node, "4 OmniPath links" per node; vocabulary 250,680, embedding 250880 x 14336;
# sequence 2048; ALiBi; dropout 0.1; activation checkpointing; BF16 with ZeRO-1 in its
# BF16Optimizer, which accumulates gradients in FP32; "Throughput": hardware TFLOPs with
# the 4 x 2 coefficient); S. Bekman, "Machine Learning Engineering", training/hparams:
# "ramped up to GBS=2048 (150 TFLOPs)"; math/README.md: the exact formula is Narayanan et
# al.'s eq. 3. The huggingface/blog "The Technology Behind BLOOM Training": no sequence
# parallelism, Megatron-LM's fused softmax kernels.
BLOOM = "bigscience-workshop/bigscience, tr11-176B-ml README; Bekman, ML Engineering"
# Jean Zay: four 100 Gb/s Omni-Path links per node of 8 GPUs: 6.25 GB/s per GPU; NVLink
# inside the node, taken as the A100's 300 GB/s each way.
JEAN_ZAY = dataclasses.replace(A100, name="jean-zay-a100", inter_bw=4 * 12.5e9 / 8)


def _bloom():
    model = Model("bloom-176b", layers=70, hidden=14336, heads=112, seq_len=2048,
                  vocab=250880, learned_positions=False, grad_bytes=4, source=BLOOM)
    lay = Layout(dp=8, tp=4, pp=12, micro_batch=2, global_batch=2048, recompute="full",
                 zero=1, attention="unfused", overlap_dp=False,
                 stage_layers=(5,) + (6,) * 10 + (5,))
    return Run("BLOOM 176B, 384 GPUs", "BigScience", BLOOM, "README; hparams", model,
               lay, JEAN_ZAY, 150, "eq3_tflops",
               "unfused attention; DeepSpeed's 1F1B pipeline; gradients reduced after the "
               "last microbatch")


RUNS = [
    *[_korthikanti(size, present) for size in _K for present in (False, True)],
    _korthikanti("530B", True, dp=8, seconds=39.15),
    _megascale(256, 768, 40.0), _megascale(512, 768, 21.2), _megascale(768, 768, 15.2),
    _megascale(1024, 768, 11.9),
    _megascale(3072, 6144, 29.02), _megascale(6144, 6144, 14.78), _megascale(8192, 6144, 12.24),
    _megascale(12288, 6144, 8.57),
    _megascale(256, 256, mfu=0.477, where="Table 3"),
    _llama3(8192, 1, 64, 8192, 32, 430), _llama3(16384, 1, 128, 8192, 16, 400),
    _llama3(16384, 16, 8, 131072, 16, 380),
    _bloom(),
]

# MegaScale's Table 2 also gives MFU for its Megatron-LM rows: a check of the FLOP count
# and the peak we use to turn Table 3's MFU into seconds
# (tests/analysis/test_analysis_validation.py).
MEGASCALE_MFU = {(256, 768): 0.530, (512, 768): 0.499, (768, 768): 0.467, (1024, 768): 0.447,
                 (3072, 6144): 0.487, (6144, 6144): 0.478, (8192, 6144): 0.433,
                 (12288, 6144): 0.412}


def comparison():
    """``[(run, report, ratio)]`` for every run."""
    out = []
    for run in RUNS:
        report = run.report()
        out.append((run, report, run.ratio(report)))
    return out
