"""Published models, clusters and configurations, with where their numbers come from.

``MODELS``: shapes. ``HARDWARE``: clusters. ``MEGATRON_2021``: the rows of
Table 1 of Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC21 (arXiv:2104.04473): GPT models with
V = 51,200 and s = 2048 on Selene (DGX A100, 80 GB), tensor size t,
pipeline size p, n GPUs, global batch B, and the throughput they report per
GPU (TFLOP/s, by their equation 3, which assumes full recomputation).

    >>> round(MODELS["gpt3-175b"].params / 1e9, 1)     # Brown et al. (2020): "175.0B"
    174.6
    >>> MEGATRON_2021[-1].name, MEGATRON_2021[-1].tflops_per_gpu
    ('megatron-1008b', 163)
"""

from __future__ import annotations

from typing import NamedTuple

from .config import Hardware, Layout, Model

# The Llama family's architecture (Touvron et al. 2023; Dubey et al. 2024): SwiGLU MLP,
# RMSNorm and no biases, rotary positions, an untied output head, no dropout.
LLAMA = dict(gated=True, bias=False, learned_positions=False, tied_embeddings=False,
             dropout=False, rotary=True)
# What the three Llama 3 models share (Dubey et al. 2024, Table 3): 8 key/value heads,
# a vocabulary of 128,000, context 8192.
LLAMA3 = dict(LLAMA, kv_heads=8, seq_len=8192, vocab=128000, source="Dubey et al. 2024, Table 3")

MODELS = {
    # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1: 96 layers,
    # d_model 12288, 96 heads of 128, context 2048; GPT-2's BPE vocabulary of 50257.
    "gpt3-175b": Model("gpt3-175b", layers=96, hidden=12288, heads=96, seq_len=2048,
                       vocab=50257, source="Brown et al. 2020, Table 2.1"),
    # Touvron et al. 2023, "Llama 2", Table 1 and the model card / config.json:
    # SwiGLU MLP, RMSNorm (no biases), rotary positions, untied output head, no dropout,
    # vocabulary 32000, context 4096; 70B uses grouped-query attention with 8 kv heads.
    "llama2-7b": Model("llama2-7b", layers=32, hidden=4096, heads=32, seq_len=4096,
                       vocab=32000, ffn=11008, **LLAMA,
                       source="Touvron et al. 2023; meta-llama/Llama-2-7b config"),
    "llama2-70b": Model("llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8,
                        seq_len=4096, vocab=32000, ffn=28672, **LLAMA,
                        source="Touvron et al. 2023; meta-llama/Llama-2-70b config"),
    # Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models"), Table 3, p. 7: 8B, 70B,
    # 405B with 32/80/126 layers, model dimension 4096/8192/16384, FFN 14336/28672/53248,
    # 32/64/128 heads, 8 key/value heads, SwiGLU, vocabulary 128,000, RoPE; context 8192
    # (Table 4, p. 10). Like Llama 2: RMSNorm, no biases, no dropout, untied head.
    "llama3-8b": Model("llama3-8b", layers=32, hidden=4096, heads=32, ffn=14336, **LLAMA3),
    "llama3-70b": Model("llama3-70b", layers=80, hidden=8192, heads=64, ffn=28672, **LLAMA3),
    "llama3-405b": Model("llama3-405b", layers=126, hidden=16384, heads=128, ffn=53248,
                         **LLAMA3),
}

# The hardware presets. Links and peaks are datasheet numbers; what cannot be derived
# (how close a kernel gets to them) is one measured or stated number each, from a source
# independent of the published runs in ``published.py`` and the same for every run:
#
# * efficiency: what the best-shaped cuBLAS matmul *sustains* once the GPU sits at its
#   power limit, as a training step keeps it. A100 SXM: 257 of 312 TFLOP/s (82.4%), an
#   8192^3 BF16 matmul on normally distributed inputs (H. He, "Strangely, Matrix
#   Multiplications on GPUs Run Faster When Given 'Predictable' Data", thonking.ai,
#   2024: 295 on zeros, 257 on randn, the clock pulled down by the 400 W limit). H100
#   SXM: 708.5 of 989 (71.6%), the "maximum sustainable matmul FLOPS" (MSMF) that S.
#   Bekman measured on an H200 SXM, the same GH100 compute at the same 700 W, "~693 W @
#   1465 MHz" against a 1830 MHz rating (ml-engineering, compute/accelerator/README.md at
#   commit 082816f, "Maximum Achievable Matmul FLOPS comparison table"; the table's MAMF
#   row for H100 notes "H200 is the same"); FP8 on H200: 1288.7 of 1979 (65.1%). Not
#   the same table's *achievable* MAMF (A100 86.9%, H100 80.3%), a short burst at the
#   boost clock that a training step does not hold. ``gemm`` takes it as the ceiling
#   and loses more on badly shaped matmuls.
# * attention_efficiency: FlashAttention-2 reaches "50-73% of the theoretical maximum
#   FLOPs/s on A100" (Dao 2023, arXiv:2307.08691, abstract): we take the middle, 61.5%,
#   for forward and backward together. On H100, FlashAttention-3 reaches "up to 740
#   TFLOPs/s (75% utilization)" (Shah et al. 2024, arXiv:2407.08608, abstract); we take
#   the same ratio of typical to best as FlashAttention-2's on A100: 75% x 61.5/73 = 63.2%.
#   (The same abstract: FlashAttention-2 reaches "only 35% utilization" on H100.)
# * hbm_efficiency: a read-bandwidth kernel tuned for it reaches about 88-90% of an
#   A100's 2.04 TB/s (NVIDIA developer forum, "Trouble to Reach Peak Bandwidth of A100",
#   citing a GTC talk's best kernel at about 90%); a framework's norms, activations and
#   optimizer are shorter and less tuned: 80%, an assumption.
# * intra_efficiency: NVLink's line rate less its packet overhead, what NCCL's ring
#   collectives reach (S. Jeaugey, NCCL's maintainer): A100, "~20GB/s effective bandwidth"
#   per 25 GB/s link, "some other bottlenecks ... limits it to ~230GB/s" of 300
#   (NVIDIA/nccl-tests#149): 76.7%; H100, "450GB/s is the line rate. With the protocol
#   overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" (nccl-tests
#   #212): 82.2%. (NVLink SHARP lifts an H100 AllReduce's bus bandwidth to ~480 GB/s;
#   the AllGathers and ReduceScatters of sequence parallelism do not get it.)
# * inter_efficiency: "the peak for 200G HDR is 24GB/s" of 25 (Jeaugey, NVIDIA/nccl#412;
#   NVIDIA's "On an Nvidia DGX-A100 ... 8x200Gbit/s IB cards ... we measure 192GB/s
#   AllReduce BusBW", quoted in NVIDIA/nccl#1576): 96%, taken for 400G NICs too.
#
# HBM: 2.0 TB/s (A100 80GB SXM, HBM2e; 2039 GB/s), 3.35 TB/s (H100 SXM, HBM3); SMs: 108
# (A100), 132 (H100) (Bekman, ibid., "Accelerator memory size and speed", "Caches").
HARDWARE = {
    # DGX A100 (Narayanan et al. 2021, sec. 5): 8 A100s per node on NVSwitch (NVLink 3:
    # 600 GB/s per GPU both directions together, 300 each way), eight 200 Gb/s HDR
    # InfiniBand NICs per node (25 GB/s per GPU), 312 TFLOP/s dense 16-bit.
    # memory: "80 GB" as 80e9 bytes, the analyzer's GB (10^9 bytes) everywhere.
    "dgx-a100": Hardware("dgx-a100", gpus_per_node=8, intra_bw=300e9, inter_bw=25e9,
                         intra_latency=5e-6, inter_latency=10e-6, peak_flops=312e12,
                         sms=108, hbm_bw=2.039e12, memory=80e9, efficiency=0.824,
                         attention_efficiency=0.615, hbm_efficiency=0.8,
                         intra_efficiency=0.767, inter_efficiency=0.96),
    # DGX H100: NVLink 4 (900 GB/s both directions, 450 each way), eight 400 Gb/s NICs,
    # 989 TFLOP/s dense BF16, 1979 dense FP8.
    "dgx-h100": Hardware("dgx-h100", gpus_per_node=8, intra_bw=450e9, inter_bw=50e9,
                         intra_latency=5e-6, inter_latency=10e-6, peak_flops=989e12,
                         fp8_flops=1979e12, sms=132, hbm_bw=3.35e12, memory=80e9,
                         efficiency=0.716, fp8_efficiency=0.651, attention_efficiency=0.632,
                         hbm_efficiency=0.8, intra_efficiency=0.822, inter_efficiency=0.96),
}


class Published(NamedTuple):
    """One row of Narayanan et al. (2021), Table 1."""

    name: str
    billions: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: int

    def model(self):
        return Model(self.name, layers=self.layers, hidden=self.hidden, heads=self.heads,
                     seq_len=2048, vocab=51200,
                     source="Narayanan et al. 2021, Table 1")

    def layout(self):
        """The row's t, p, n and B. Not stated in the table, our assumptions: one
        sequence per microbatch, no interleaving, full recomputation (what equation
        3 counts), the scatter/gather optimization (sec. 4.1), no overlap of the
        data-parallel gradient AllReduce, and Megatron-LM's unfused attention of
        2021 (FlashAttention came a year later)."""
        return Layout(dp=self.gpus // (self.tp * self.pp), tp=self.tp, pp=self.pp,
                      micro_batch=1, global_batch=self.batch, recompute="full",
                      pp_scatter_gather=True, overlap_dp=False, attention="unfused")


MEGATRON_2021 = [Published(*row) for row in [
    # name             B params heads hidden layers t  p    n     B     TFLOP/s per GPU
    ("megatron-1.7b", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    ("megatron-3.6b", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    ("megatron-7.5b", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    ("megatron-18.4b", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("megatron-39.1b", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("megatron-76.1b", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("megatron-145.6b", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("megatron-310.1b", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("megatron-529.6b", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("megatron-1008b", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]]

for _row in MEGATRON_2021:
    MODELS[_row.name] = _row.model()
# The ZeRO paper's 7.5B model (Rajbhandari et al. 2020, Figure 1: Psi = 7.5B): we take
# the shape of Table 1's 7.5B row, whose equation-2 count is 7.47B.
MODELS["zero-7.5b"] = MODELS["megatron-7.5b"]


def megatron_comparison(hardware=None):
    """``[(row, report)]``: the analyzer on every Table 1 configuration."""
    from .step import analyze
    hw = hardware or HARDWARE["dgx-a100"]
    return [(row, analyze(row.model(), row.layout(), hw)) for row in MEGATRON_2021]
