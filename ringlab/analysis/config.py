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
"""

from __future__ import annotations

from dataclasses import dataclass, field

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer. Bytes per element: ``param_bytes`` (the
    16-bit weights the matmuls use), ``grad_bytes``, ``act_bytes`` (activations
    and the messages that carry them) and ``optimizer_bytes`` (the ZeRO paper's
    K = 12 of mixed-precision Adam: fp32 master, momentum and variance)."""

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
        if self.heads % self.kv_heads:
            raise ValueError(f"model {self.name!r}: kv_heads = {self.kv_heads} must divide "
                             f"heads = {self.heads}")

    @property
    def layer_params(self):
        """Parameters of one layer: Q, K, V, output projection, the MLP's matrices,
        their biases and two LayerNorms (weight and bias). For GPT (ffn = 4h) it is
        12h^2 + 13h, Narayanan et al. (2021), equation 2."""
        h, f = self.hidden, self.ffn
        kv = h * self.kv_heads // self.heads
        attn = h * (h + 2 * kv) + h * h
        mlp = (3 if self.gated else 2) * h * f
        biases = (h + 2 * kv + h + (2 if self.gated else 1) * f + h) if self.bias else 0
        norms = 4 * h if self.bias else 2 * h           # RMSNorm has no bias
        return attn + mlp + biases + norms

    @property
    def embedding_params(self):
        """Token embeddings (and the output head when untied), learned positions."""
        tok = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return tok + (self.seq_len * self.hidden if self.learned_positions else 0)

    @property
    def params(self):
        """All parameters, Narayanan et al.'s P = 12lh^2 (1 + 13/(12h) + (V + s)/(12lh))
        for GPT; the final LayerNorm (2h) is left out, as there."""
        return self.layers * self.layer_params + self.embedding_params


@dataclass(frozen=True)
class Layout:
    """How the GPUs split the work. ``dp`` x ``tp`` x ``pp`` GPUs.

    ``global_batch`` sequences per iteration, ``micro_batch`` per microbatch:
    each pipeline runs ``global_batch / (dp * micro_batch)`` microbatches, which
    is also the gradient accumulation count (set it with ``microbatches`` instead
    of ``global_batch`` if you prefer). ``interleave`` = v model chunks per
    pipeline rank. ``sp``: sequence parallelism; ``zero``: ZeRO stage 0-3 over
    the dp group; ``recompute``: "none", "selective" or "full" (Korthikanti et
    al. 2022). ``overlap_dp``: the gradient ReduceScatter / AllReduce runs under
    the last microbatch's backward (DDP buckets); ``pp_scatter_gather``:
    Narayanan et al.'s optimization, each tensor-parallel rank sends 1/t of a
    pipeline message."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    global_batch: int | None = None
    microbatches: int | None = None
    interleave: int = 1
    sp: bool = False
    zero: int = 0
    recompute: str = "none"
    overlap_dp: bool = True
    pp_scatter_gather: bool = False
    schedule: str = field(default="1f1b")

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "micro_batch", "interleave"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"layout: {name} must be a positive integer, got {v!r}")
        if self.zero not in ZERO_STAGES:
            raise ValueError(f"layout: zero must be one of 0, 1, 2, 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"layout: recompute must be one of {RECOMPUTE}, got "
                             f"{self.recompute!r}")
        if self.schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"layout: schedule must be 'gpipe' or '1f1b', got {self.schedule!r}")
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
        if self.sp and self.tp == 1:
            raise ValueError("layout: sequence parallelism needs tp > 1")

    @property
    def gpus(self):
        return self.dp * self.tp * self.pp

    def check(self, model, hardware=None):
        """Raise ``ValueError`` if ``model`` cannot be split this way."""
        if model.heads % self.tp:
            raise ValueError(f"tp = {self.tp} must divide the {model.heads} attention heads "
                             f"(each rank keeps whole heads)")
        if model.kv_heads % self.tp and self.tp % model.kv_heads:
            raise ValueError(f"tp = {self.tp} and the {model.kv_heads} key/value heads: one must "
                             f"divide the other")
        if model.ffn % self.tp:
            raise ValueError(f"tp = {self.tp} must divide the MLP's hidden size {model.ffn}")
        if model.layers % (self.pp * self.interleave):
            raise ValueError(f"pp x interleave = {self.pp} x {self.interleave} must divide the "
                             f"{model.layers} layers (every model chunk gets the same number)")
        if self.sp and model.seq_len % self.tp:
            raise ValueError(f"sequence parallelism: tp = {self.tp} must divide the sequence "
                             f"length {model.seq_len}")
        if hardware is not None and hardware.gpus is not None and hardware.gpus != self.gpus:
            raise ValueError(f"dp x tp x pp = {self.dp} x {self.tp} x {self.pp} = {self.gpus}, "
                             f"but the cluster has {hardware.gpus} GPUs")
        return self


@dataclass(frozen=True)
class Hardware:
    """A cluster of nodes of ``gpus_per_node`` GPUs. Bandwidths are bytes per
    second one GPU can send (and receive) at once: ``intra_bw`` inside a node
    (NVLink), ``inter_bw`` to another node (its share of the node's NICs);
    latencies in seconds. ``peak_flops``: dense 16-bit FLOP/s of one GPU;
    ``achieved``: the fraction of it the matmuls reach (an assumption you state,
    not a measurement); ``memory``: bytes of one GPU's memory (the analyzer's GB
    are 1e9 bytes throughout: the presets' ``80e9`` is 80 GB, not 80 GiB;
    ``memory=80 * 2**30`` counts an 80 GiB card). ``gpus``: the cluster's size,
    if you want the layout checked against it."""

    name: str = "cluster"
    gpus_per_node: int = 8
    intra_bw: float = 300e9
    inter_bw: float = 25e9
    intra_latency: float = 5e-6
    inter_latency: float = 10e-6
    peak_flops: float = 312e12
    achieved: float = 0.75
    memory: float = 80e9
    gpus: int | None = None

    def __post_init__(self):
        if not (isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1):
            raise ValueError(f"hardware: gpus_per_node must be a positive integer, got "
                             f"{self.gpus_per_node!r}")
        for name in ("intra_bw", "inter_bw", "peak_flops", "memory"):
            if not getattr(self, name) > 0:
                raise ValueError(f"hardware: {name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.achieved <= 1:
            raise ValueError(f"hardware: achieved is a fraction of peak in (0, 1], got "
                             f"{self.achieved!r}")
