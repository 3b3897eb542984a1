"""Memory per GPU: model states by ZeRO stage, activations by Korthikanti et al.

Model states (Rajbhandari et al. 2020): 16-bit weights and gradients and K
bytes of optimizer state per parameter, each divided among the ``dp`` ranks
from ZeRO stage 3, 2 and 1 on (``ringlab.zero.accounting.memory_per_device``),
for the parameters this GPU's tensor- and pipeline shard holds.

Activations (Korthikanti et al. 2022, sec. 4, with ``ffn = 4h``), bytes one
layer keeps for backward per microbatch of b sequences:

* no recomputation: ``sbh(10 + 24/t + 5as/(ht))``, with sequence parallelism
  ``(sbh/t)(34 + 5as/h)`` (``ringlab.tensor_parallel.memory.paper_activation_bytes``);
* selective recomputation (attention's softmax, its dropout and the dropped
  probabilities are recomputed): the ``5as/h`` term goes, ``sbh(10 + 24/t)``
  or ``34 sbh / t``;
* full recomputation: only the layer's input, ``2sbh`` (``2sbh/t`` with SP).

The first pipeline stage holds the most: with 1F1B ``min(m, p)`` microbatches
of its ``l/p`` layers -- ``l`` layers' worth when m >= p, whatever p is --
and with v interleaved chunks ``l (1 + (p-1)/(p v))`` (Korthikanti et al.,
sec. 4.2.3; ``ringlab.pipeline.bubble.peak_held_closed_form``). Left out: the
embedding's and the output layer's activations and the logits, which the
paper adds separately, and temporary buffers.

    >>> from ringlab.analysis.config import Model, Layout
    >>> m = Model("tiny", layers=4, hidden=64, heads=4, seq_len=32, vocab=100)
    >>> layer_activation_bytes(m, Layout(tp=2, sp=True)) == 32 * 64 // 2 * (34 + 5 * 4 * 32 // 64)
    True
"""

from __future__ import annotations

from ..pipeline.bubble import peak_held_closed_form
from ..tensor_parallel.memory import paper_activation_bytes
from ..zero.accounting import memory_per_device
from .compute import layer_matrix_entries


def params_per_gpu(model, layout):
    """Parameters on the busiest GPU: its stage's ``l / pp`` layers, the matrices
    and column-parallel biases split ``tp`` ways, LayerNorms and the row-parallel
    biases replicated (as Megatron keeps them); plus, on the first stage, the
    vocabulary-parallel embedding (V h / t) and replicated positions, and with
    untied embeddings the output head on the last."""
    h, f, t = model.hidden, model.ffn, layout.tp
    kv = h * model.kv_heads // model.heads
    if model.bias:
        column_biases = h + 2 * kv + (2 if model.gated else 1) * f
        replicated = 4 * h + 2 * h             # two LayerNorms; proj and fc2 biases
    else:
        column_biases, replicated = 0, 2 * h   # two RMSNorm weights
    layer = (layer_matrix_entries(model) + column_biases) // t + replicated
    layers = model.layers // layout.pp
    tok = model.vocab * h // t
    pos = model.seq_len * h if model.learned_positions else 0
    first = layers * layer + tok + pos
    last = layers * layer + (0 if model.tied_embeddings else tok)
    if layout.pp == 1:
        return layers * layer + tok * (1 if model.tied_embeddings else 2) + pos
    return max(first, last)


STAGE = {0: "dp", 1: "zero1", 2: "zero2", 3: "zero3"}


def model_states(psi, d, zero, param_bytes=2, grad_bytes=2, k=12):
    """``{"weights", "gradients", "optimizer"}`` bytes per GPU: ``psi`` parameters
    over ``d`` data-parallel ranks at ZeRO stage ``zero``, each part from
    ``ringlab.zero.accounting.memory_per_device`` with the other two set to 0.

    >>> [round(sum(model_states(7.5e9, 64, z).values()) / 1e9, 1) for z in range(4)]
    [120.0, 31.4, 16.6, 1.9]
    """
    stage, none = STAGE[zero], dict(k=0, param_bytes=0, grad_bytes=0)
    return {"weights": memory_per_device(stage, psi, d, **{**none, "param_bytes": param_bytes}),
            "gradients": memory_per_device(stage, psi, d, **{**none, "grad_bytes": grad_bytes}),
            "optimizer": memory_per_device(stage, psi, d, **{**none, "k": k})}


def model_state_bytes(model, layout):
    """``model_states`` of the busiest GPU's parameters (``params_per_gpu``)."""
    return model_states(params_per_gpu(model, layout), layout.dp, layout.zero,
                        model.param_bytes, model.grad_bytes, model.optimizer_bytes)


def layer_activation_bytes(model, layout):
    """Bytes one layer keeps for one microbatch (``layout.micro_batch`` sequences)."""
    s, b, h, a, t = model.seq_len, layout.micro_batch, model.hidden, model.heads, layout.tp
    item = model.act_bytes
    if layout.recompute == "full":
        return 2 * s * b * h // (t if layout.sp else 1) * item // 2
    whole = paper_activation_bytes(s, b, h, a, t, layout.sp, itemsize=item)
    if layout.recompute == "selective":
        # softmax output and dropped probabilities (2 + 2 bytes at 16 bits) and the mask (1)
        whole -= a * s * s * b // t * (4 * item // 2 + 1)
    return whole


def layers_held(model, layout):
    """Layers' worth of microbatch activations the first stage holds at its peak."""
    p, m, v = layout.pp, layout.microbatches, layout.interleave
    if layout.schedule == "gpipe":
        return m * model.layers // p
    if v == 1:
        return peak_held_closed_form("one_f_one_b", p, m, 0) * model.layers // p
    chunks = peak_held_closed_form("interleaved_1f1b", p, m, 0, v)
    return chunks * model.layers / (p * v)


def memory(model, layout):
    """``{"weights", "gradients", "optimizer", "activations", "total"}`` bytes
    on the busiest GPU."""
    out = model_state_bytes(model, layout)
    out["activations"] = layers_held(model, layout) * layer_activation_bytes(model, layout)
    out["total"] = sum(out.values())
    return out
