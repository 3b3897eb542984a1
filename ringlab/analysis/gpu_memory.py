"""Memory per GPU: model states by ZeRO stage, activations from each layer's tensors.

Model states (Rajbhandari et al. 2020): 16-bit weights, gradients of
``grad_bytes`` (4: Megatron-LM's fp32 accumulation, 18 bytes per parameter in
all, ``6 + 12/d`` with the distributed optimizer, i.e. ZeRO-1) and K bytes of
optimizer state per parameter, each divided among the d = dp x cp ranks from
ZeRO stage 3, 2 and 1 on (``ringlab.zero.accounting.memory_per_device``), for
the parameters of this GPU's shard; experts are divided among the dp x cp x tp
/ ep ranks that hold the same ones.

Activations, bytes one layer keeps for backward per microbatch: Korthikanti et
al. (2022, sec. 4.1) list them for GPT; the same list written for any shape
(b sequences, s tokens each on this context-parallel rank, ``kv`` the width
of K and V, ``f`` the MLP's hidden size, 16-bit elements, 1-byte masks):

* not split by tensor parallelism (split by t only with sequence parallelism):
  the two norms' inputs ``2sbh`` each, the QKV and fc1 inputs ``2sbh`` each,
  two dropout masks ``sbh`` each (if the model has dropout): ``10 sbh`` for GPT;
* split by t: Q ``2sbh``, K and V ``2sb kv`` each, the projection's input
  ``2sbh``, the activation's input ``2sbf`` (a gated MLP keeps both halves,
  ``4sbf``), fc2's input ``2sbf``: ``24 sbh`` for GPT (f = 4h, kv = h);
* unfused attention's ``s x s`` matrices, split by t: the softmax output ``2as^2b``,
  and with dropout its mask ``as^2b`` and output ``2as^2b``: ``5as^2b`` for GPT.
  FlashAttention keeps none of them (only one fp32 number per query and head).

For GPT that is ``sbh(10 + 24/t + 5as/(ht))``, ``(sbh/t)(34 + 5as/h)`` with
sequence parallelism (``ringlab.tensor_parallel.activation_memory.paper_activation_bytes``).
Selective recomputation drops the s x s matrices; full recomputation keeps only
the layer's input, ``2sbh`` (``2sbh/t`` with SP). FP8 keeps the four linear
layers' inputs in 8 bits. A layer with experts keeps, per routed token copy,
the expert's input, activation input and fc2 input. With "allgather" context
parallelism the gathered K and V (of the whole sequence) are kept too.

The first pipeline rank holds the most: with 1F1B ``min(m, p)`` microbatches
of its layers and with v interleaved chunks the warm-up's count of chunk
states (Korthikanti et al., sec. 4.2.3; ``ringlab.pipeline.bubble.
peak_held_closed_form``). Left out: the embedding's and the output layer's
activations and the logits, which the paper adds separately, and temporary
buffers.

    >>> from ringlab.analysis.config import Model, Layout
    >>> m = Model("tiny", layers=4, hidden=64, heads=4, seq_len=32, vocab=100)
    >>> lay = Layout(tp=2, sp=True, attention="unfused")
    >>> layer_activation_bytes(m, lay) == 32 * 64 // 2 * (34 + 5 * 4 * 32 // 64)
    True
"""

from __future__ import annotations

from fractions import Fraction

from ..pipeline.bubble import peak_held_closed_form
from ..zero.accounting import memory_per_device
from .timing import kv_per_rank, routed_tokens


def chunk_layers(model, layout):
    """``[(first layer, number of layers)]`` of each model chunk, first to last."""
    out, start = [], 0
    for n in layout.split(model):
        out.append((start, n))
        start += n
    return out


def rank_chunks(model, layout, rank):
    """Chunk indices on pipeline rank ``rank``: rank, rank + p, ..."""
    return list(range(rank, layout.stages, layout.pp))


def rank_layers(model, layout, rank):
    """Layer indices on pipeline rank ``rank``."""
    chunks = chunk_layers(model, layout)
    return [start + i for k in rank_chunks(model, layout, rank)
            for start, n in [chunks[k]] for i in range(n)]


def layer_shard_params(model, layout, layer):
    """``(dense, expert)`` parameters of one layer on one GPU: the matrices and
    column-parallel biases split tp ways, LayerNorms and row-parallel biases
    replicated (as Megatron keeps them); experts ``experts / ep`` whole ones."""
    h, t = model.hidden, layout.tp
    kv = model.kv_dim
    attn_cols = h * (h + 2 * kv) + (h + 2 * kv if model.bias else 0)
    replicated = model.norm_params + (h if model.bias else 0)          # proj bias
    dense = (attn_cols + h * h) // t + replicated
    if not model.is_moe(layer):
        f = model.ffn
        mlp = (3 if model.gated else 2) * h * f + ((2 if model.gated else 1) * f
                                                    if model.bias else 0)
        return dense + mlp // t + (h if model.bias else 0), 0
    shared = model.shared_experts * model.mlp_params(model.moe_ffn)
    experts = model.experts // layout.ep * model.mlp_params(model.moe_ffn)
    return dense + shared // t + h * model.experts, experts


def rank_params(model, layout, rank):
    """``(dense, expert)`` parameters pipeline rank ``rank``'s GPUs hold: their
    layers; the first chunk adds the vocabulary-parallel embedding (V h / t) and
    replicated learned positions, the last the output head if untied."""
    dense = expert = 0
    for layer in rank_layers(model, layout, rank):
        d, e = layer_shard_params(model, layout, layer)
        dense, expert = dense + d, expert + e
    tok = model.vocab * model.hidden // layout.tp
    chunks = rank_chunks(model, layout, rank)
    if 0 in chunks:
        dense += tok + (model.seq_len * model.hidden if model.learned_positions else 0)
    if layout.stages - 1 in chunks and (not model.tied_embeddings or 0 not in chunks):
        dense += tok          # the output head; tied, on another rank: its copy (Megatron)
    return dense, expert


def busiest_rank(model, layout):
    """The pipeline rank whose GPUs hold the most parameter bytes."""
    return max(range(layout.pp), key=lambda r: sum(rank_params(model, layout, r)))


def params_per_gpu(model, layout):
    """Parameters on the busiest GPU (dense and experts together)."""
    return sum(rank_params(model, layout, busiest_rank(model, layout)))


STAGE = {0: "dp", 1: "zero1", 2: "zero2", 3: "zero3"}


def model_states(psi, d, zero, param_bytes=2, grad_bytes=2, k=12):
    """``{"weights", "gradients", "optimizer"}`` bytes per GPU: ``psi`` parameters
    over ``d`` data-parallel ranks at ZeRO stage ``zero``, each part from
    ``ringlab.zero.accounting.memory_per_device`` with the other two set to 0.

    >>> [round(sum(model_states(7.5e9, 64, z).values()) / 1e9, 1) for z in range(4)]
    [120.0, 31.4, 16.6, 1.9]
    >>> [round(sum(model_states(1, d, z, grad_bytes=4).values()), 3) for z, d in [(0, 8), (1, 8)]]
    [18.0, 7.5]
    """
    stage, none = STAGE[zero], dict(k=0, param_bytes=0, grad_bytes=0)
    return {"weights": memory_per_device(stage, psi, d, **{**none, "param_bytes": param_bytes}),
            "gradients": memory_per_device(stage, psi, d, **{**none, "grad_bytes": grad_bytes}),
            "optimizer": memory_per_device(stage, psi, d, **{**none, "k": k})}


def model_state_bytes(model, layout, rank=None):
    """``model_states`` of a pipeline rank's parameters (default: the busiest),
    dense ones over dp x cp ranks, experts over dp x cp x tp / ep."""
    lay = layout
    dense, expert = rank_params(model, lay, busiest_rank(model, lay) if rank is None else rank)
    args = (lay.zero, model.param_bytes, model.grad_bytes, model.optimizer_bytes)
    out = model_states(dense, lay.dp * lay.cp, *args)
    if expert:
        more = model_states(expert, lay.dp * lay.cp * lay.tp // lay.ep, *args)
        out = {k: out[k] + more[k] for k in out}
    return out


def layer_activation_bytes(model, layout, moe=False):
    """Bytes one layer (with experts if ``moe``) keeps for one microbatch
    (``layout.micro_batch`` sequences), on one GPU."""
    lay = layout
    s, b, h, a, t = model.seq_len // lay.cp, lay.micro_batch, model.hidden, model.heads, lay.tp
    item, sbh = model.act_bytes, s * b * h
    sp = t if lay.sp else 1
    if lay.recompute == "full":
        return Fraction(item * sbh, sp)
    lin = 1 if lay.fp8 else item                       # the linear layers' saved inputs
    mask = 1 if model.dropout else 0
    gate = 2 if model.gated else 1
    # not split by tp: two norm inputs, the QKV and fc1 (or router) inputs, two masks
    whole = Fraction((2 * item + 2 * lin + 2 * mask) * sbh, sp)
    # split by tp: Q, K, V (kv heads on this rank) and the projection's input
    split = s * b * (item * (h // t + 2 * kv_per_rank(model, t)) + Fraction(lin * h, t))
    if moe:
        fe = model.moe_ffn
        experts = routed_tokens(model, lay) * (lin * h + gate * item * fe + lin * fe)
        mlp = Fraction(experts) + Fraction(s * b * model.shared_experts * fe
                                           * (gate * item + lin), t)
    else:
        mlp = Fraction(s * b * model.ffn * (gate * item + lin), t)
    total = whole + split + mlp
    if lay.attention == "unfused" and lay.recompute == "none":
        total += Fraction(a * s * s * b * (item + (item + 1 if model.dropout else 0)), t)
    if lay.cp > 1 and lay.cp_kind == "allgather":
        total += 2 * model.seq_len * b * kv_per_rank(model, t) * item
    return total


def layers_held(model, layout, rank=0):
    """Layers' worth of microbatch activations pipeline rank ``rank`` holds at its
    peak: in-flight microbatch states times the layers of its chunks (on
    average, with interleaving)."""
    p, m, v = layout.pp, layout.microbatches, layout.interleave
    chunks = chunk_layers(model, layout)
    mine = [chunks[k][1] for k in rank_chunks(model, layout, rank)]
    if layout.schedule == "gpipe":
        return m * sum(mine)
    if v == 1:
        return peak_held_closed_form("one_f_one_b", p, m, rank) * sum(mine)
    held = peak_held_closed_form("interleaved_1f1b", p, m, rank, v)
    return Fraction(held * sum(mine), v)


def memory(model, layout):
    """``{"weights", "gradients", "optimizer", "activations", "total"}`` bytes
    on the busiest GPU: the model states of the rank that holds the most
    parameters and the activations of the first rank (the most in flight)."""
    out = model_state_bytes(model, layout)
    layers = rank_layers(model, layout, 0)
    moe_share = sum(model.is_moe(j) for j in layers) / len(layers) if layers else 0
    per_layer = layer_activation_bytes(model, layout)
    if moe_share:
        per_layer = ((1 - moe_share) * per_layer
                     + moe_share * layer_activation_bytes(model, layout, moe=True))
    out["activations"] = float(layers_held(model, layout) * per_layer)
    out["total"] = sum(out.values())
    return out
