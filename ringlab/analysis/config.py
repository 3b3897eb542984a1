"""The three inputs of the analyzer: the model, the parallel layout, the hardware.

Each is a frozen dataclass that checks itself when built, so an impossible
layout fails at once with a sentence saying what does not divide what::

    >>> m = Model("tiny", layers=4, hidden=64, heads=4, seq_len=32, vocab=100)
    >>> Layout(dp=2, tp=3, pp=2).check(m, Hardware(gpus_per_node=4))
    Traceback (most recent call last):
    ...
    ValueError: tp = 3 must divide the 4 attention heads (each rank keeps whole heads)

Shapes follow Narayanan et al. (2021): ``l`` layers, hidden size ``h``, ``a``
heads, sequence length ``s``, vocabulary ``V``; the MLP's hidden size is
``ffn`` (4h for GPT). ``gated=True`` is a SwiGLU MLP (Llama: three ffn x h
matrices instead of two), ``kv_heads`` < heads is grouped-query attention.
A mixture of experts (``experts`` > 0) replaces the MLP of its last
``moe_layers`` layers by ``experts`` MLPs of hidden size ``moe_ffn``, of which
each token uses ``top_k`` (plus ``shared_experts`` every token uses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "unfused")
CP_KINDS = ("ring", "allgather")
OVERLAP_TP = ("none", "backward", "full")


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer. Bytes per element: ``param_bytes`` (the
    16-bit weights the matmuls use), ``grad_bytes`` (2, or 4 for fp32 gradient
    accumulation and reduction, Megatron-LM's default with bf16), ``act_bytes``
    (activations and the messages that carry them) and ``optimizer_bytes`` (the
    ZeRO paper's K = 12 of mixed-precision Adam: fp32 master, momentum and
    variance). ``dropout``: dropout after attention's softmax and on both
    residual branches (GPT, Megatron's default 0.1; Llama has none);
    ``rotary``: rotary position embeddings applied to Q and K in every layer."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn: int | None = None
    kv_heads: int | None = None
    gated: bool = False
    bias: bool = True
    learned_positions: bool = True
    tied_embeddings: bool = True
    dropout: bool = True
    rotary: bool = False
    experts: int = 0
    top_k: int = 1
    moe_ffn: int | None = None
    shared_experts: int = 0
    moe_layers: int | None = None
    param_bytes: int = 2
    grad_bytes: int = 2
    act_bytes: int = 2
    optimizer_bytes: int = 12
    source: str = ""

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"model {self.name!r}: {name} must be a positive integer, "
                                 f"got {getattr(self, name)!r}")
        if self.hidden % self.heads:
            raise ValueError(f"model {self.name!r}: hidden = {self.hidden} is not a multiple of "
                             f"heads = {self.heads}")
        if self.ffn is None:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if not (isinstance(self.kv_heads, int) and 1 <= self.kv_heads <= self.heads
                and self.heads % self.kv_heads == 0):
            raise ValueError(f"model {self.name!r}: kv_heads = {self.kv_heads} must divide "
                             f"heads = {self.heads}")
        for name in ("param_bytes", "grad_bytes", "act_bytes"):
            if getattr(self, name) not in (1, 2, 4, 8):
                raise ValueError(f"model {self.name!r}: {name} is 1, 2, 4 or 8 bytes, got "
                                 f"{getattr(self, name)!r}")
        if self.experts:
            if self.moe_ffn is None:
                object.__setattr__(self, "moe_ffn", self.ffn)
            if self.moe_layers is None:
                object.__setattr__(self, "moe_layers", self.layers)
            if not 1 <= self.top_k <= self.experts:
                raise ValueError(f"model {self.name!r}: top_k = {self.top_k} must be between 1 "
                                 f"and experts = {self.experts}")
            if not 0 <= self.moe_layers <= self.layers:
                raise ValueError(f"model {self.name!r}: moe_layers = {self.moe_layers} is more "
                                 f"than the {self.layers} layers")
        else:
            if self.shared_experts or (self.moe_layers or 0) or self.top_k != 1:
                raise ValueError(f"model {self.name!r}: top_k, shared_experts and moe_layers "
                                 f"need experts > 0")
            object.__setattr__(self, "moe_layers", 0)

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def kv_dim(self):
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def dense_layers(self):
        """Layers with a dense MLP: the first ``layers - moe_layers``."""
        return self.layers - self.moe_layers

    def is_moe(self, layer):
        """Whether layer ``layer`` (0-based) has experts."""
        return layer >= self.dense_layers

    @property
    def attention_params(self):
        h, kv = self.hidden, self.kv_dim
        biases = (h + 2 * kv + h) if self.bias else 0
        return h * (h + 2 * kv) + h * h + biases

    def mlp_params(self, ffn):
        h = self.hidden
        mats = (3 if self.gated else 2) * h * ffn
        return mats + (((2 if self.gated else 1) * ffn + h) if self.bias else 0)

    @property
    def norm_params(self):
        return 4 * self.hidden if self.bias else 2 * self.hidden    # RMSNorm has no bias

    @property
    def layer_params(self):
        """Parameters of one dense layer: Q, K, V, output projection, the MLP's
        matrices, their biases and two LayerNorms (weight and bias). For GPT
        (ffn = 4h) it is 12h^2 + 13h, Narayanan et al. (2021), equation 2."""
        return self.attention_params + self.mlp_params(self.ffn) + self.norm_params

    @property
    def moe_layer_params(self):
        """One layer with experts: attention, norms, the router (h x experts),
        every expert and the shared experts."""
        if not self.experts:
            return self.layer_params
        experts = (self.experts + self.shared_experts) * self.mlp_params(self.moe_ffn)
        return self.attention_params + self.norm_params + self.hidden * self.experts + experts

    @property
    def embedding_params(self):
        """Token embeddings (and the output head when untied), learned positions."""
        tok = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return tok + (self.seq_len * self.hidden if self.learned_positions else 0)

    @property
    def params(self):
        """All parameters, Narayanan et al.'s P = 12lh^2 (1 + 13/(12h) + (V + s)/(12lh))
        for GPT; the final LayerNorm (2h) is left out, as there."""
        return (self.dense_layers * self.layer_params + self.moe_layers * self.moe_layer_params
                + self.embedding_params)

    def settings(self):
        """The switches a shape does not show, one word each (for the report)."""
        words = ["gated" if self.gated else "gelu", "bias" if self.bias else "no-bias",
                 "learned-pos" if self.learned_positions else "no-learned-pos",
                 "tied" if self.tied_embeddings else "untied",
                 "dropout" if self.dropout else "no-dropout"]
        if self.rotary:
            words.append("rotary")
        if self.kv_heads != self.heads:
            words.append(f"gqa-{self.kv_heads}")
        if self.experts:
            words.append(f"moe-{self.experts}x{self.moe_ffn}-top{self.top_k}"
                         + (f"+{self.shared_experts}shared" if self.shared_experts else ""))
        return " ".join(words)


def even_split(layers, stages):
    """``layers`` over ``stages`` as evenly as possible; the extra layers go to the
    middle stages, so that the first and last (which also hold the embedding,
    the logits and the loss) are the lighter ones.

    >>> even_split(126, 16), even_split(8, 4)
    ((7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7), (2, 2, 2, 2))
    """
    base, extra = divmod(layers, stages)
    order = sorted(range(stages), key=lambda k: (k in (0, stages - 1), abs(k - (stages - 1) / 2)))
    plus = set(order[:extra])
    return tuple(base + (k in plus) for k in range(stages))


@dataclass(frozen=True)
class Layout:
    """How the GPUs split the work: ``dp`` x ``cp`` x ``tp`` x ``pp`` GPUs.

    ``global_batch`` sequences per iteration, ``micro_batch`` per microbatch:
    each pipeline runs ``global_batch / (dp * micro_batch)`` microbatches, which
    is also the gradient accumulation count (set it with ``microbatches`` instead
    of ``global_batch`` if you prefer). ``interleave`` = v model chunks per
    pipeline rank; ``stage_layers``: the layers of each of the pp x v model
    chunks (default: ``even_split``; any split is allowed, as Megatron-LM's
    ``--decoder-first/last-pipeline-num-layers`` allow). ``sp``: sequence
    parallelism; ``cp``: context parallelism, each sequence split over ``cp``
    ranks (``cp_kind`` "ring": K and V passed around a ring, Liu et al. 2023;
    "allgather": gathered, Llama 3); ``ep``: expert parallelism, the experts
    split over ``ep`` ranks of the dp x cp x tp ranks of a stage, ``capacity``
    the capacity factor (None: no token dropped or padded). ``zero``: ZeRO stage
    0-3 over the dp x cp ranks (stage 1 is Megatron-LM's distributed
    optimizer); ``recompute``: "none", "selective" or "full" (Korthikanti et
    al. 2022). ``attention``: "flash" (FlashAttention: no s x s matrix in
    memory) or "unfused" (Megatron-LM's batched matmuls and fused softmax).
    ``fp8``: the linear layers' matmuls in FP8 (Transformer Engine).

    Overlap: ``overlap_dp``, the gradient ReduceScatter / AllReduce runs under
    the last microbatch's backward (DDP buckets); ``overlap_param_gather``,
    ZeRO-1/2's parameter AllGather runs under the next forward; ``overlap_tp``,
    "none", "backward" (Megatron-LM's asynchronous collectives: a column-parallel
    layer's input-gradient collective under its weight-gradient matmul) or
    "full" (every collective chunked under the matmul next to it: Transformer
    Engine's userbuffers, MegaScale; needs sp); ``overlap_pp``, interleaved
    schedules send under compute (Megatron-LM's ``--overlap-p2p-communication``);
    ``pp_scatter_gather``: Narayanan et al.'s optimization, each tensor-parallel
    rank sends 1/t of a pipeline message."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1
    global_batch: int | None = None
    microbatches: int | None = None
    interleave: int = 1
    stage_layers: tuple | None = None
    sp: bool = False
    cp_kind: str = "ring"
    capacity: float | None = None
    zero: int = 0
    recompute: str = "none"
    attention: str = "flash"
    fp8: bool = False
    overlap_dp: bool = True
    overlap_param_gather: bool = False
    overlap_tp: str = "backward"
    overlap_pp: bool = True
    pp_scatter_gather: bool = False
    schedule: str = field(default="1f1b")

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "interleave"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"layout: {name} must be a positive integer, got {v!r}")
        choices = {"zero": ZERO_STAGES, "recompute": RECOMPUTE, "attention": ATTENTION,
                   "cp_kind": CP_KINDS, "overlap_tp": OVERLAP_TP, "schedule": ("gpipe", "1f1b")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"layout: {name} must be one of "
                                 f"{', '.join(map(repr, allowed))}, got {getattr(self, name)!r}")
        if self.global_batch is None and self.microbatches is None:
            object.__setattr__(self, "microbatches", 1)
        if self.global_batch is not None:
            per_pipeline, rest = divmod(self.global_batch, self.dp * self.micro_batch)
            if rest or per_pipeline < 1:
                raise ValueError(f"layout: global_batch = {self.global_batch} is not a multiple "
                                 f"of dp x micro_batch = {self.dp} x {self.micro_batch}")
            if self.microbatches is not None and self.microbatches != per_pipeline:
                raise ValueError(f"layout: microbatches = {self.microbatches} but global_batch / "
                                 f"(dp x micro_batch) = {per_pipeline}")
            object.__setattr__(self, "microbatches", per_pipeline)
        else:
            object.__setattr__(self, "global_batch",
                               self.microbatches * self.dp * self.micro_batch)
        if self.microbatches < 1:
            raise ValueError(f"layout: microbatches must be >= 1, got {self.microbatches}")
        if self.interleave > 1 and self.microbatches % self.pp:
            raise ValueError(f"layout: the interleaved schedule needs microbatches = "
                             f"{self.microbatches} to be a multiple of pp = {self.pp} "
                             f"(Narayanan et al. 2021, 2.2.2)")
        if self.interleave > 1 and self.schedule == "gpipe":
            raise ValueError("layout: interleave > 1 is an interleaved 1F1B schedule, not gpipe")
        if self.sp and self.tp == 1:
            raise ValueError("layout: sequence parallelism needs tp > 1")
        if self.overlap_tp == "full" and not self.sp:
            raise ValueError("layout: overlap_tp='full' chunks the AllGathers and ReduceScatters "
                             "of sequence parallelism: it needs sp")
        if self.cp > 1 and self.attention != "flash":
            raise ValueError("layout: context parallelism computes attention block by block "
                             "(FlashAttention): it needs attention='flash'")
        if self.capacity is not None and not self.capacity > 0:
            raise ValueError(f"layout: capacity must be > 0, got {self.capacity!r}")
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
            if len(self.stage_layers) != self.pp * self.interleave or any(
                    not isinstance(n, int) or n < 0 for n in self.stage_layers):
                raise ValueError(f"layout: stage_layers needs pp x interleave = "
                                 f"{self.pp * self.interleave} counts >= 0, got "
                                 f"{self.stage_layers!r}")

    @property
    def gpus(self):
        return self.dp * self.cp * self.tp * self.pp

    @property
    def stages(self):
        return self.pp * self.interleave

    def split(self, model):
        """Layers of each model chunk (virtual stage), first to last."""
        if self.stage_layers is not None:
            return self.stage_layers
        return even_split(model.layers, self.stages)

    def check(self, model, hardware=None):
        """Raise ``ValueError`` if ``model`` cannot be split this way."""
        t = self.tp
        if model.heads % t:
            raise ValueError(f"tp = {t} must divide the {model.heads} attention heads "
                             f"(each rank keeps whole heads)")
        if model.kv_heads % t and t % model.kv_heads:
            raise ValueError(f"tp = {t} and the {model.kv_heads} key/value heads: one must "
                             f"divide the other")
        if model.ffn % t:
            raise ValueError(f"tp = {t} must divide the MLP's hidden size {model.ffn}")
        if self.stage_layers is not None and sum(self.stage_layers) != model.layers:
            raise ValueError(f"stage_layers add up to {sum(self.stage_layers)}, but the model "
                             f"has {model.layers} layers")
        if self.stages > model.layers + 2:
            raise ValueError(f"pp x interleave = {self.stages} model chunks for {model.layers} "
                             f"layers: at most layers + 2 (a chunk of only the embedding, one "
                             f"of only the logits)")
        if self.cp > 1 and model.seq_len % (2 * self.cp):
            raise ValueError(f"context parallelism: 2 x cp = {2 * self.cp} must divide the "
                             f"sequence length {model.seq_len} (each rank takes two chunks, "
                             f"one early and one late, to balance the causal mask)")
        local = model.seq_len // self.cp
        if self.sp and local % t:
            raise ValueError(f"sequence parallelism: tp = {t} must divide the sequence "
                             f"length {local}" + (" per context-parallel rank"
                                                  if self.cp > 1 else ""))
        if self.ep > 1 or model.experts:
            self._check_experts(model)
        if hardware is not None:
            if hardware.gpus is not None and hardware.gpus != self.gpus:
                raise ValueError(f"dp x cp x tp x pp = {self.dp} x {self.cp} x {self.tp} x "
                                 f"{self.pp} = {self.gpus}, but the cluster has "
                                 f"{hardware.gpus} GPUs")
            if self.fp8 and not hardware.fp8_flops:
                raise ValueError(f"fp8: {hardware.name} has no FP8 tensor cores "
                                 f"(fp8_flops = 0)")
        return self

    def _check_experts(self, model):
        if not model.experts:
            raise ValueError(f"ep = {self.ep}: expert parallelism needs a model with experts "
                             f"(--experts)")
        if model.experts % self.ep:
            raise ValueError(f"ep = {self.ep} must divide the {model.experts} experts")
        ranks = self.dp * self.cp * self.tp
        if ranks % self.ep:
            raise ValueError(f"ep = {self.ep} must divide dp x cp x tp = {ranks} (the ranks "
                             f"of a pipeline stage, over which experts are spread)")
        if self.tp > 1 and not self.sp:
            raise ValueError("experts with tp > 1 need sequence parallelism: each "
                             "tensor-parallel rank routes its own 1/tp of the tokens "
                             "(Megatron-LM asserts the same)")


@dataclass(frozen=True)
class Hardware:
    """A cluster of nodes of ``gpus_per_node`` GPUs. Bandwidths are bytes per
    second one GPU can send (and receive) at once: ``intra_bw`` inside a node
    (NVLink), ``inter_bw`` to another node (its share of the node's NICs);
    latencies in seconds. ``peak_flops``: dense 16-bit FLOP/s of one GPU,
    ``fp8_flops`` dense FP8 (0: none); ``sms``: streaming multiprocessors;
    ``hbm_bw``: bytes per second of its memory; ``memory``: bytes of it (the
    analyzer's GB are 1e9 bytes throughout: the presets' ``80e9`` is 80 GB, not
    80 GiB; ``memory=80 * 2**30`` counts an 80 GiB card).

    What cannot be derived from those, with the defaults of ``presets`` and their
    sources there: ``efficiency``, the fraction of the 16-bit peak the best
    shaped matmul reaches in the GEMM library (``fp8_efficiency`` in FP8);
    ``attention_efficiency``, the fraction FlashAttention reaches;
    ``hbm_efficiency``, the fraction of ``hbm_bw`` memory-bound kernels reach;
    ``intra_efficiency`` and ``inter_efficiency``, the fraction of the link rate
    (``intra_bw``, ``inter_bw``) NCCL's collectives reach: NVLink packets carry
    headers, so a collective moves its payload at about 80% of the line rate
    (1.0 here, the line rate; the presets take NCCL's measured numbers).
    ``gpus``: the cluster's size, if you want the layout checked against it."""

    name: str = "cluster"
    gpus_per_node: int = 8
    intra_bw: float = 300e9
    inter_bw: float = 25e9
    intra_latency: float = 5e-6
    inter_latency: float = 10e-6
    peak_flops: float = 312e12
    fp8_flops: float = 0.0
    sms: int = 108
    hbm_bw: float = 2.039e12
    memory: float = 80e9
    efficiency: float = 0.869
    fp8_efficiency: float = 0.0
    attention_efficiency: float = 0.615
    hbm_efficiency: float = 0.8
    intra_efficiency: float = 1.0
    inter_efficiency: float = 1.0
    gpus: int | None = None

    def __post_init__(self):
        for name in ("gpus_per_node", "sms"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"hardware: {name} must be a positive integer, got "
                                 f"{getattr(self, name)!r}")
        for name in ("intra_bw", "inter_bw", "peak_flops", "memory", "hbm_bw"):
            if not getattr(self, name) > 0:
                raise ValueError(f"hardware: {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("efficiency", "attention_efficiency", "hbm_efficiency",
                     "intra_efficiency", "inter_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"hardware: {name} is a fraction of peak in (0, 1], got "
                                 f"{getattr(self, name)!r}")
        if self.fp8_flops and not 0 < self.fp8_efficiency <= 1:
            raise ValueError(f"hardware: fp8_efficiency is a fraction of the FP8 peak in "
                             f"(0, 1], got {self.fp8_efficiency!r}")
