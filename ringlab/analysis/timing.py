"""Compute time of one microbatch on one GPU, layer by layer: the compute model.

Where ``compute.py`` counts FLOPs, this module says how long they take, with a
reason for each number:

* **matmuls** (``gemm.py``): every linear layer's three GEMMs (forward, input
  gradient, weight gradient) at their own shapes on this GPU's shard, each a
  roofline with tile and wave quantization. The shapes, for a microbatch of b
  sequences, ``T = b s / cp`` tokens on a rank, ``t`` = tp: QKV ``T x h`` times
  ``h x (h + 2 kv)/t``; output projection ``T x h/t`` times ``h/t x h``; the
  MLP ``h x ffn/t`` (twice that with a gated MLP) and ``ffn/t x h``; the logits
  ``h x V/t`` on the last stage. Experts (``ep`` ranks, experts not split by
  tp): each rank's ``T/t`` tokens go to ``top_k`` experts, ``capacity`` x that
  many rows spread over its ``experts/ep`` experts, as one grouped GEMM.
* **attention**: "flash" does ``4 b s_q s_k h / t`` FLOPs forward (half of
  it with a causal mask, whose masked blocks it skips) and 2.5 times that
  backward (it recomputes Q K^T and does four more products), at
  ``attention_efficiency`` of the peak; "unfused" (Megatron-LM 2021-22) runs Q
  K^T and P V as batched GEMMs over the whole s x s matrix, masked or not, plus
  the softmax and dropout kernels that read and write it in HBM.
* **memory-bound kernels** at ``hbm_bw x hbm_efficiency``: per layer forward,
  two norms (read and write T x h), two residual adds (read two, write one;
  with dropout its 1-byte mask), the activation (GeLU: read and write T x
  ffn/t; SwiGLU: read two, write one), rotary embeddings (read and write Q and
  K), the tokens of a mixture of experts permuted and put back, and in FP8 the
  cast of each linear layer's input (read 16 bits, write 8). Backward moves
  twice the forward's bytes: each kernel reads the incoming gradient and what
  it saved, and writes one gradient. Sequence parallelism divides the norm and
  residual traffic by t. The last stage adds its final norm and the
  cross-entropy over T x V/t logits (forward: read 16-bit, write fp32;
  backward the reverse), the first the embedding lookup (read and write T x h).
* **the optimizer step** (``optimizer_seconds``): Adam reads and writes the fp32
  master weights, momentum and variance (24 bytes per parameter), reads the
  gradient twice (the update and the global norm for clipping) and writes the
  16-bit weight, for the parameters this GPU updates (1/d of them from ZeRO-1
  on); the gradient buffer is zeroed (written once) for every local parameter.
* **recomputation**: "full" runs each layer's forward again before its
  backward; "selective" recomputes unfused attention's Q K^T, softmax, dropout
  and P V (FlashAttention recomputes them anyway: nothing more).
* **fp8** (``layout.fp8``, Transformer Engine's recipe): the four linear layers'
  matmuls, forward and backward, and the experts', at ``fp8_flops x
  fp8_efficiency``; attention, the logits and every message stay 16-bit.

Left out, to be stated and not guessed: kernel launch gaps and host overhead,
data loading, stragglers and clocks below the rated boost (the published runs
include them), the embedding and loss collectives of tensor parallelism, and
contention between overlapped communication and compute for the GPU's SMs.

    >>> from ringlab.analysis.config import Hardware, Layout, Model
    >>> gpt = Model("gpt", layers=2, hidden=4096, heads=32, seq_len=2048, vocab=51200)
    >>> w = layer_work(gpt, Layout(tp=8), Hardware())
    >>> sorted(w.gemms)
    ['fc1', 'fc2', 'proj', 'qkv']
    >>> w.forward["matmul"] < w.backward["matmul"]
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .gemm import gemm_seconds, linear_seconds, memory_seconds

PARTS = ("matmul", "attention", "memory")


@dataclass
class Work:
    """Seconds of one microbatch through one layer on one GPU: ``forward``,
    ``backward`` (including what recomputation adds) and ``recompute`` alone,
    each ``{"matmul", "attention", "memory"}``; ``gemms`` {name: (forward,
    input gradient, weight gradient)} of the linear layers, which the
    tensor-parallel collectives can hide under."""

    forward: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    backward: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    recompute: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    gemms: dict = field(default_factory=dict)

    @property
    def seconds(self):
        return sum(self.forward.values()) + sum(self.backward.values())


def tokens(model, layout):
    """Tokens of one microbatch on one rank: ``b s / cp``."""
    return layout.micro_batch * model.seq_len // layout.cp


def kv_per_rank(model, t):
    """Width of K (or V) on one tensor-parallel rank: its kv heads, or one head
    when there are fewer kv heads than ranks (each is then kept by several)."""
    return max(model.kv_dim // t, model.head_dim)


def routed_tokens(model, layout):
    """Rows a rank's experts process per microbatch: its ``T/t`` tokens (sequence
    parallel) times ``top_k``, times the capacity factor if one is set."""
    local = tokens(model, layout) // layout.tp
    return local * model.top_k * (layout.capacity or 1.0)


def _linear(work, name, m, n, k, hw, fp8, item):
    f, dg, wg = linear_seconds(m, n, k, hw, fp8=fp8, itemsize=item)
    work.gemms[name] = (f, dg, wg)
    work.forward["matmul"] += f
    work.backward["matmul"] += dg + wg


def _attention(model, layout, hw, T):
    """(forward parts, backward parts, selective-recompute parts) of core attention."""
    b, s, h, a, t, item = (layout.micro_batch, model.seq_len, model.hidden, model.heads,
                           layout.tp, model.act_bytes)
    fwd, bwd, sel = dict.fromkeys(PARTS, 0.0), dict.fromkeys(PARTS, 0.0), dict.fromkeys(PARTS, 0.0)
    if layout.attention == "flash":
        # queries of this rank (T) against every key of the sequence (s); causal: half
        flops = 4 * T * s * h / t * 0.5
        fwd["attention"] = flops / (hw.peak_flops * hw.attention_efficiency)
        bwd["attention"] = 2.5 * fwd["attention"]
        return fwd, bwd, sel
    d, heads = model.head_dim, b * a // t
    scores = gemm_seconds(s, s, d, hw, batch=heads, itemsize=item)        # Q K^T
    values = gemm_seconds(s, d, s, hw, batch=heads, itemsize=item)        # P V
    fwd["attention"] = scores + values
    # dP = dO V^T (s x s), dV = P^T dO, dQ = dS K, dK = dS^T Q (s x d each)
    bwd["attention"] = scores + 3 * values
    elems = heads * s * s
    softmax = 4 * item * elems                                 # read and write the scores
    dropout = (4 * item + 1) * elems if model.dropout else 0   # read, write, 1-byte mask
    fwd["memory"] = memory_seconds(softmax + dropout, hw)
    bwd["memory"] = memory_seconds(6 * item * elems + ((4 * item + 1) * elems
                                                       if model.dropout else 0), hw)
    sel["attention"], sel["memory"] = fwd["attention"], fwd["memory"]
    return fwd, bwd, sel


def layer_work(model, layout, hw, moe=False):
    """``Work`` of one layer (with experts if ``moe``) for one microbatch."""
    t, item, fp8 = layout.tp, model.act_bytes, layout.fp8
    h, T = model.hidden, tokens(model, layout)
    T_sp = T // t if layout.sp else T                 # tokens of the norm/residual regions
    kv = kv_per_rank(model, t)
    w = Work()
    _linear(w, "qkv", T, h // t + 2 * kv, h, hw, fp8, item)
    _linear(w, "proj", T, h, h // t, hw, fp8, item)
    mem = 4 * T_sp * h * item                                   # two norms
    mem += 2 * T_sp * h * (3 * item + (1 if model.dropout else 0))   # two residual adds
    if model.rotary:
        mem += 2 * T * (h // t + kv) * item
    casts = (T * h + T * h // t) * (item + 1)                   # fp8: qkv and proj inputs
    gated = 2 if model.gated else 1
    act_passes = 3 if model.gated else 2

    def mlp(rows, ffn, name, split, batch=1):
        nonlocal mem, casts
        f = ffn // split
        m = max(1, round(rows / batch))
        fwd, dg, wg = linear_seconds(m, gated * f, h, hw, fp8=fp8, itemsize=item)
        fwd2, dg2, wg2 = linear_seconds(m, h, f, hw, fp8=fp8, itemsize=item)
        w.gemms[name + "fc1"] = (batch * fwd, batch * dg, batch * wg)
        w.gemms[name + "fc2"] = (batch * fwd2, batch * dg2, batch * wg2)
        w.forward["matmul"] += batch * (fwd + fwd2)
        w.backward["matmul"] += batch * (dg + wg + dg2 + wg2)
        mem += act_passes * rows * f * item
        casts += rows * (h + f) * (item + 1)

    if not moe:
        mlp(T, model.ffn, "", t)
    else:
        rows = routed_tokens(model, layout)
        local_experts = model.experts // layout.ep
        mlp(rows, model.moe_ffn, "expert_", 1, batch=local_experts)
        if model.shared_experts:
            mlp(T, model.moe_ffn * model.shared_experts, "shared_", t)
        router = gemm_seconds(T // t if layout.sp else T, model.experts, h, hw, itemsize=item)
        w.forward["matmul"] += router
        w.backward["matmul"] += 2 * router
        mem += 4 * rows * h * item                  # permute and un-permute, read and write
    if fp8:
        mem += casts
    w.forward["memory"] += memory_seconds(mem, hw)
    w.backward["memory"] += memory_seconds(2 * mem, hw)
    fwd, bwd, sel = _attention(model, layout, hw, T)
    for part in PARTS:
        w.forward[part] += fwd[part]
        w.backward[part] += bwd[part]
    if layout.recompute == "full":
        w.recompute = dict(w.forward)
    elif layout.recompute == "selective":
        w.recompute = sel
    for part in PARTS:
        w.backward[part] += w.recompute[part]
    return w


def embedding_work(model, layout, hw):
    """The first stage's embedding lookup, forward and backward (memory-bound)."""
    T, item = tokens(model, layout), model.act_bytes
    T_sp = T // layout.tp if layout.sp else T
    w = Work()
    w.forward["memory"] = memory_seconds(2 * T_sp * model.hidden * item, hw)
    w.backward["memory"] = 2 * w.forward["memory"]
    return w


def head_work(model, layout, hw):
    """The last stage's final norm, logits and cross-entropy. The logits stay
    16-bit (Transformer Engine leaves the output layer out of FP8)."""
    T, item, h, t = tokens(model, layout), model.act_bytes, model.hidden, layout.tp
    T_sp = T // t if layout.sp else T
    w = Work()
    _linear(w, "logits", T, model.vocab // t, h, hw, False, item)
    norm = 2 * T_sp * h * item
    ce = T * (model.vocab // t) * (item + 4)                    # 16-bit in, fp32 out
    w.forward["memory"] = memory_seconds(norm + ce, hw)
    w.backward["memory"] = memory_seconds(2 * norm + ce, hw)
    return w


def optimizer_seconds(updated, local, grad_bytes, hw):
    """Adam's step over ``updated`` parameters (this GPU's shard) and the zeroing
    of the gradients of its ``local`` parameters: 26 + 2g bytes per updated one
    (fp32 master, momentum, variance read and written; the gradient read for the
    update and for the norm; the 16-bit weight written) and g per local one."""
    return memory_seconds(updated * (26 + 2 * grad_bytes) + local * grad_bytes, hw)
