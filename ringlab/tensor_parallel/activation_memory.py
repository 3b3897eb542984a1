"""Activation memory: what a layer keeps for backward, measured and by formula.

Korthikanti et al. (2022), section 4, count the bytes one transformer layer
stores for backward with 16-bit activations (s: sequence, b: batch, h:
hidden, a: heads, t: tensor-parallel degree; the MLP's hidden size is 4h):

* no parallelism: ``sbh(34 + 5as/h)`` = 34sbh + 5as^2b. Attention 11sbh +
  5as^2b (QKV input 2, Q and K 4, V 2, output-projection input 2, its
  dropout mask 1; softmax output 2as^2b, its dropout mask as^2b, the dropped
  probabilities 2as^2b), MLP 19sbh (fc input 2, GeLU input 8, proj input 8,
  dropout mask 1), the two LayerNorms' inputs 4sbh.
* tensor parallelism: ``sbh(10 + 24/t + 5as/(ht))``: the LayerNorm inputs,
  the QKV and fc inputs and the two dropout masks (10sbh) stay whole on every
  rank; the rest is split.
* tensor + sequence parallelism: ``(sbh/t)(34 + 5as/h)``: everything split,
  provided the QKV and fc layers store only their sequence shard of the input
  (section 4.2.2; ``store_input_shard=True``).

``activation_bytes(module)`` measures what our modules hold: every array
attribute of every module below ``module``, each counted once (a view
counts as the array it views: it keeps all of it alive). Our layers store what
Megatron's store -- LayerNorm keeps x-hat instead of x, the same size; GeLU
keeps only its input -- plus one term the paper neglects:

* LayerNorm's per-token statistic ``rstd``: b*s values per LayerNorm, two
  LayerNorms, ``layernorm_stats_bytes`` (b*s/t each with sequence
  parallelism). (Megatron keeps mean and rstd in float32: 16 bytes per token.)

so that, exactly, ``activation_bytes(block) == paper_activation_bytes(...) +
layernorm_stats_bytes(...)``.

    >>> import numpy as np
    >>> from ringlab.nn import TransformerBlock
    >>> block = TransformerBlock(8, 2, 32, np.random.default_rng(0), dtype=np.float16,
    ...                          dropout=0.1)
    >>> _ = block.forward(np.ones((2, 4, 8), np.float16))
    >>> activation_bytes(block), paper_activation_bytes(s=4, b=2, h=8, a=2, itemsize=2)
    (2528, 2496)
    >>> layernorm_stats_bytes(s=4, b=2, itemsize=2)
    32
"""

from fractions import Fraction

import numpy as np


def held_arrays(module):
    """{id: array} of the arrays ``module`` and its sub-modules hold as attributes
    (parameters and gradients are not activations and are left out), views replaced
    by the arrays they view. Integer arrays are a layer's index tables (a shard's
    columns), not activations: left out too."""
    held = {}
    for _, m in module.named_modules():
        for name, value in vars(m).items():
            if name in ("params", "grads") or not isinstance(value, np.ndarray):
                continue
            if value.dtype.kind not in "fb":         # floats and bool masks
                continue
            while value.base is not None and isinstance(value.base, np.ndarray):
                value = value.base
            held[id(value)] = value
    return held


def activation_bytes(module):
    """Bytes of the arrays ``module`` holds after a forward, each counted once."""
    return sum(a.nbytes for a in held_arrays(module).values())


def paper_activation_bytes(s, b, h, a, t=1, sequence_parallel=False, itemsize=2):
    """Korthikanti et al. (2022), equations 1, 2 and 4, per layer; the paper's
    16-bit activations are ``itemsize=2`` (masks: 1 byte per element throughout)."""
    sbh, attn = Fraction(s * b * h), Fraction(5 * a * s, h)
    if sequence_parallel:
        total = sbh / t * (34 + attn)
    else:
        total = sbh * (10 + Fraction(24, t) + attn / t)
    # The formulas assume 2-byte activations: scale every non-mask byte by itemsize/2.
    masks = sbh * (2 / Fraction(t) if sequence_parallel else 2) + Fraction(a * s * s * b, t)
    total = (total - masks) * Fraction(itemsize, 2) + masks
    if total.denominator != 1:
        raise ValueError(f"s*b*h = {s * b * h} and a*s^2*b are not divisible by t = {t}")
    return int(total)


def layernorm_stats_bytes(s, b, t=1, sequence_parallel=False, itemsize=2):
    """What the paper neglects: two LayerNorms' rstd, one value per token (mine)."""
    tokens = s * b // t if sequence_parallel else s * b
    return 2 * tokens * itemsize

