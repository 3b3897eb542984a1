"""Grader for exercise ``tp_attention``: self-attention with its heads split over ranks.

Signature: ``tp_attention(comm, x, qkv_weight, qkv_bias, proj_weight,
proj_bias, n_heads) -> (y, backward)``, the math of
``ringlab.nn.CausalSelfAttention``: qkv's 3h output columns are [q | k | v],
head j is column block j inside each. Rank r owns heads block r (n_heads/t
heads): its columns of q, of k and of v, and the same rows of proj. y
(b, s, h) whole on every rank; ``backward(dy)`` returns dx whole and
``{"qkv.weight": (h, 3h/t) ordered [my q | my k | my v], "qkv.bias",
"proj.weight": (h/t, h), "proj.bias": (h,)}``. One AllReduce forward, one
backward, each b*s*h elements. If t does not divide n_heads: ValueError
naming both numbers.

Checks (see ``common.py``), t = 1 to 4, b and s not multiples of t, tp groups
of 2x2 and 2x3 meshes, and one case where t does not divide the heads: it
runs (or raises that ValueError, on every rank: a rank that goes on past the
check, and waits or fails, is named); shapes; values equal
``CausalSelfAttention``'s (relative error 1e-10), with the usual mistakes
diagnosed (qkv split as one contiguous block, heads not block r, no AllReduce
in a pass, f and g swapped, the bias counted t times); the messages of each
pass are partial sums of the ranks' partial products adding up to one
AllReduce.
"""

import sys

import numpy as np

from . import _common as common
from ._common import Expected, Mistake, Pass, block, with_bias
from ...nn import CausalSelfAttention, Linear, Module

NAME = "tp_attention"
# ring_allreduce is a tool here; ringlab.tensor_parallel (the reference answers) is not
USES = ("collectives",)
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
GRADS = ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias")
# (t, mesh, (b, s, h, n_heads)); t=3 with 4 heads: the ValueError case
CASES = [(2, None, (3, 5, 8, 4)), (1, None, (2, 3, 4, 2)), (3, None, (2, 5, 6, 3)),
         (4, None, (3, 4, 8, 4)), (2, (2, 2), (3, 3, 8, 4)), (3, None, (2, 3, 8, 4)),
         (3, (2, 3), (2, 4, 12, 6)), (4, None, (5, 3, 16, 8))]
RETURNS = ("tp_attention(comm, x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_heads) -> "
           "(y, backward); backward(dy) -> (dx, {'qkv.weight', 'qkv.bias', 'proj.weight', "
           "'proj.bias'})")
SHAPES = {"y": "(b, s, h): the whole Y on every rank", "dx": "(b, s, h): the whole dX",
          "qkv.weight": "(h, 3h/t): [my q | my k | my v] columns", "qkv.bias": "(3h/t,)",
          "proj.weight": "(h/t, h): my heads' rows of proj", "proj.bias": "(h,): the whole db"}
SHAPE_HINT = ("Rank r owns heads r*H/t .. (r+1)*H/t - 1, i.e. columns mine = r*h/t .. "
              "(r+1)*h/t - 1 of each of q, k and v: qkv columns [mine, h + mine, 2h + mine], "
              "and rows mine of proj.")
BLOCKS = {"y": "whole Y", "dx": "whole dX", "qkv.weight": "[my q | my k | my v] columns of dW",
          "qkv.bias": "[my q | my k | my v] part of db", "proj.weight": "my heads' rows of "
          "proj's dW", "proj.bias": "whole proj db"}
NO_COMM = {}
G_HINT = ("Heads are independent until proj: rank r's heads give a partial sum of Y through its "
          "rows of proj. AllReduce it once (Megatron's g), then add proj_bias once.")
F_HINT = ("Backward, rank r's dX is only the part that flows through its heads: AllReduce it "
          "once (Megatron's f).")
HEADS_HINT = ("Rank r owns the contiguous heads r*H/t .. (r+1)*H/t - 1: in each of q, k and v "
              "the columns r*h/t .. (r+1)*h/t - 1 (a block of each, not one block of qkv).")
HINTS = {"y": G_HINT, "dx": F_HINT, "qkv.weight": HEADS_HINT, "qkv.bias": HEADS_HINT,
         "proj.weight": HEADS_HINT,
         "proj.bias": "proj's db = dY summed over batch and sequence, on every rank: no AllReduce."}
# A wrong value made before a right AllReduce: the local part of the pass.
LOCAL = {"y": "Forward on rank r, for its heads only: q, k, v from its qkv columns, causal "
              "softmax(q k^T / sqrt(head_dim)), times v, then its rows of proj; then the "
              "AllReduce, then proj_bias once.",
         "dx": "Backward on rank r, in reverse through its heads: dO = dY @ proj_r^T, then "
               "through probs @ v, the softmax (dS = P * (dP - sum(P * dP))) and the 1/sqrt "
               "scale to dq, dk, dv, and dX_r = dqkv @ W_qkv,r^T; then the AllReduce."}
ERROR_HINT = ("A head cannot be split (its softmax needs all of q.k) and Megatron gives every "
              "rank the same number: check n_heads % comm.world_size and raise "
              "ValueError(f'... {comm.world_size} ... {n_heads} ...') naming both numbers.")


def describe(dims):
    b, s, h, heads = dims
    return f"x (b={b}, s={s}, h={h}), n_heads={heads}"


def weights(rng, dims):
    attn = CausalSelfAttention(dims[2], dims[3], rng)
    return tuple(attn.named_parameters()[n] for n in GRADS)


def _columns(h, hd, heads):
    """qkv columns of ``heads``: [their q | their k | their v]."""
    mine = np.concatenate([np.arange(j * hd, (j + 1) * hd) for j in heads]).astype(int)
    return np.concatenate([part * h + mine for part in range(3)]), mine


def _local(x, dy, w, cols, rows, hd):
    """A CausalSelfAttention holding qkv columns ``cols`` and proj rows ``rows``, no
    proj bias: its forward is a partial sum of Y, its backward a partial dX."""
    wq, bq, wp, _ = w
    m = CausalSelfAttention.__new__(CausalSelfAttention)
    Module.__init__(m)
    m.head_dim, m.n_heads = hd, len(rows) // hd
    rng = np.random.default_rng(0)
    m.qkv = Linear(wq.shape[0], len(cols), rng)
    m.qkv.params["weight"][...], m.qkv.params["bias"][...] = wq[:, cols], bq[cols]
    m.proj = Linear(len(rows), wp.shape[1], rng, bias=False)
    m.proj.params["weight"][...] = wp[rows]
    part = m.forward(x)
    b, heads, s, _ = m.v.shape
    out = (m.probs @ m.v).transpose(0, 2, 1, 3).reshape(b, s, heads * hd)
    qkv = x @ wq[:, cols] + bq[cols]
    dx = m.backward(dy) if dy is not None else None
    return part, dx, out, qkv


def group(w, rng, dims, t):
    b, s, h, heads = dims
    x, dy = rng.standard_normal((b, s, h)), rng.standard_normal((b, s, h))
    inputs = [[[x, *w, heads], dy] for _ in range(t)]
    if heads % t:
        return Expected(inputs, error=(ValueError, [str(t), str(heads)],
                                       "t does not divide n_heads"))
    attn = CausalSelfAttention(h, heads, np.random.default_rng(0))
    for name, v in zip(GRADS, w):
        attn.named_parameters()[name][...] = v
    y = attn.forward(x)
    dx = attn.backward(dy)
    full = attn.named_grads()
    hd = h // heads
    own = [_columns(h, hd, range(r * heads // t, (r + 1) * heads // t)) for r in range(t)]
    outputs = [{"y": y, "dx": dx, "qkv.weight": full["qkv.weight"][:, c],
                "qkv.bias": full["qkv.bias"][c], "proj.weight": full["proj.weight"][m],
                "proj.bias": full["proj.bias"]} for c, m in own]
    local = [_local(x, dy, w, c, m, hd) for c, m in own]
    parts, partial_dx = [p[0] for p in local], [p[1] for p in local]
    c = w[3]
    n = b * s * h
    gather = ("an AllGather of the heads' data, so that every rank computes more than its own "
              "heads; attention sums the heads' partial products with one AllReduce (g)")
    passes = {
        "forward": Pass(1, f"the partial products (your heads' outputs @ proj rows, {n} elements)",
                        with_bias(parts, c, t),
                        raw={"O": ([p[2] for p in local], "your heads' outputs (probs @ v)",
                                   gather),
                             "QKV": ([p[3] for p in local], "your q, k and v", gather),
                             "X": ([x], "X", "X is the same on every rank: nothing to send")},
                        hint=G_HINT),
        "backward": Pass(1, f"the partial dX (through your heads, {n} elements)", [partial_dx],
                         raw={"dO": ([dy @ w[2][m].T for _, m in own],
                                     "the gradient of your heads' outputs",
                                     "an AllGather of the heads' gradients; backward sums the "
                                     "partial dX with one AllReduce (f)"),
                              "dY": ([dy], "dY", "dY is the same on every rank: nothing to send")},
                         hint=F_HINT)}
    total = sum(parts)
    swapped = [_local(t * x, None, w, cc, m, hd)[0] + c for cc, m in own]
    contiguous = sum(_local(x, None, w, np.arange(r * 3 * h // t, (r + 1) * 3 * h // t), m, hd)[0]
                     for r, (_, m) in enumerate(own)) + c
    strided = [_columns(h, hd, range(r, heads, t)) for r in range(t)]
    mistakes = [
        Mistake({"y": [total + t * c] * t},
                "the bias was added on every rank before the AllReduce: it counts t times",
                "Add proj_bias after the AllReduce (or on one rank only before it): once."),
        Mistake({"y": [p + c for p in parts]},
                "your Y is only your heads' contribution: no AllReduce in forward (g)", G_HINT),
        Mistake({"dx": partial_dx},
                "your dX is only your shard's contribution: no AllReduce in backward (f)", F_HINT),
        Mistake({"dx": [t * p for p in partial_dx]},
                "your backward all-reduced dY (which every rank already has: t x dY) and not dX: "
                "f and g swapped?",
                "f: identity forward, AllReduce of dX backward; g: AllReduce of Y forward, "
                "identity backward."),
        Mistake({"y": swapped},
                "your forward all-reduced X, which every rank already has, and not the output: "
                "f and g swapped?",
                "f: identity forward, AllReduce of dX backward; g: AllReduce of Y forward, "
                "identity backward."),
        Mistake({"y": [t * total + c] * t, "dx": [t * dx] * t},
                "all-reduced twice: the result is t times the sum", G_HINT),
        Mistake({"y": [contiguous] * t},
                "qkv split as one contiguous block of 3h/t columns instead of a block of each of "
                "q, k and v: your 'heads' mix q, k and v columns", HEADS_HINT),
        Mistake({"qkv.weight": [full["qkv.weight"][:, cc] for cc, _ in strided],
                 "qkv.bias": [full["qkv.bias"][cc] for cc, _ in strided],
                 "proj.weight": [full["proj.weight"][m] for _, m in strided]},
                "your heads are not block r (interleaved): your gradients are those of heads "
                "r, r+t, r+2t, ... (r::t)", HEADS_HINT),
    ]
    return Expected(inputs, outputs, passes, mistakes)


def owned(dims, t, r):
    """Rank r's part of each weight argument: {argument: (axis, indices)}."""
    h = dims[2]
    mine = block(h, t, r)
    cols = np.concatenate([mine, h + mine, 2 * h + mine])
    return {1: (1, cols), 2: (0, cols), 3: (0, mine)}


def cases(rng):
    return common.make_cases(rng, sys.modules[__name__], CASES)


def check(program, case, backend="sim"):
    return common.check(program, case, backend, sys.modules[__name__])
