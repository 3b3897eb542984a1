"""Grader for exercise ``tp_attention``: self-attention with its heads split over ranks.

``tp_attention(comm, x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_heads) ->
(y, backward)``, the math of ``ringlab.nn.CausalSelfAttention``: qkv's 3h output
columns are [q | k | v], head j is column block j inside each. Rank r owns heads block
r: its columns of q, of k and of v, and the same rows of proj. y (b, s, h) whole on
every rank; ``backward(dy)`` returns dx whole and ``{"qkv.weight": (h, 3h/t) ordered
[my q | my k | my v], "qkv.bias", "proj.weight": (h/t, h), "proj.bias": (h,)}``. One
AllReduce forward, one backward, each of b*s*h elements. If t does not divide n_heads:
ValueError naming both numbers, on every rank (one more case checks it: a rank that
goes on past the check, and waits or fails, is named). The checks are ``_common``'s.
"""

import sys

import numpy as np

from . import _common as common
from ._common import DEPENDS_ON_ALL, USES  # noqa: F401 (see there)
from ._common import Expected, Mistake, block
from ...nn import CausalSelfAttention, Linear, Module
from ...tensor_parallel.attention import head_columns

NAME = "tp_attention"
GRADS = ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias")
MODULE = CausalSelfAttention
# (b, s, h, n_heads) for each of the groups every layer is graded on; and, before the
# 3x2 mesh, t=3 with 4 heads: the ValueError case
CASES = common.on_groups([(3, 5, 8, 4), (2, 3, 4, 2), (2, 5, 6, 3), (3, 4, 8, 4),
                          (3, 3, 8, 4), (2, 4, 12, 6), (5, 3, 16, 8)])
CASES.insert(5, (3, None, (2, 3, 8, 4)))
RETURNS = ("tp_attention(comm, x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_heads) -> "
           "(y, backward); backward(dy) -> (dx, {'qkv.weight', 'qkv.bias', 'proj.weight', "
           "'proj.bias'})")
SHAPE_HINT = ("Rank r owns heads r*H/t .. (r+1)*H/t - 1, i.e. columns mine = r*h/t .. "
              "(r+1)*h/t - 1 of each of q, k and v: qkv columns [mine, h + mine, 2h + mine], "
              "and rows mine of proj.")
G_HINT = ("Heads are independent until proj: rank r's heads give a partial sum of Y through its "
          "rows of proj. " + common.G_ONCE)
F_HINT = common.f_hint("heads")
HEADS_HINT = ("Rank r owns the contiguous heads r*H/t .. (r+1)*H/t - 1: in each of q, k and v "
              "the columns r*h/t .. (r+1)*h/t - 1 (a block of each, not one block of qkv).")
# Of each output: its shape, which block of the unsharded layer's it is, a hint when it is wrong.
OUTPUTS = common.block_outputs(G_HINT, F_HINT, {
    "qkv.weight": ("(h, 3h/t): [my q | my k | my v] columns",
                   "[my q | my k | my v] columns of dW", HEADS_HINT),
    "qkv.bias": ("(3h/t,)", "[my q | my k | my v] part of db", HEADS_HINT),
    "proj.weight": ("(h/t, h): my heads' rows of proj", "my heads' rows of proj's dW",
                    HEADS_HINT)})
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
SPLIT = {"qkv.weight": (-1, "cols"), "qkv.bias": (-1, "cols"), "proj.weight": (0, "rows")}


def mine(dims, t, r):
    """Rank r's heads: its columns of each of q, k and v in qkv, its rows of proj."""
    h = dims[2]
    rows = block(h, t, r)
    return {"cols": np.concatenate([rows, h + rows, 2 * h + rows]), "rows": rows}


def describe(dims):
    b, s, h, heads = dims
    return f"x (b={b}, s={s}, h={h}), n_heads={heads}"


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
    whole, idx, outputs = common.answers(sys.modules[__name__], np.random.default_rng(0), w,
                                         x, dy, dims, t)
    hd, c = h // heads, w[3]
    local = [_local(x, dy, w, i["cols"], i["rows"], hd) for i in idx]
    parts, partial_dx = [p[0] for p in local], [p[1] for p in local]
    gather = ("an AllGather of the heads' data, so that every rank computes more than its own "
              "heads; attention sums the heads' partial products with one AllReduce (g)")
    passes = common.block_passes(
        x, dy, c, t, (f"the partial products (your heads' outputs @ proj rows, {b * s * h} "
                      f"elements)", parts,
                      {"O": ([p[2] for p in local], "your heads' outputs (probs @ v)", gather),
                       "QKV": ([p[3] for p in local], "your q, k and v", gather)}),
        (f"the partial dX (through your heads, {b * s * h} elements)", partial_dx,
         {"dO": ([dy @ w[2][i["rows"]].T for i in idx], "the gradient of your heads' outputs",
                 "an AllGather of the heads' gradients; backward sums the partial dX with one "
                 "AllReduce (f)")}), G_HINT, F_HINT)
    swapped = [_local(t * x, None, w, i["cols"], i["rows"], hd)[0] + c for i in idx]
    contiguous = sum(_local(x, None, w, np.arange(r * 3 * h // t, (r + 1) * 3 * h // t),
                            i["rows"], hd)[0] for r, i in enumerate(idx)) + c
    strided = [dict(zip(("cols", "rows"), head_columns(range(r, heads, t), hd, h)))
               for r in range(t)]
    mistakes = common.block_mistakes(parts, partial_dx, c, t, swapped, "your heads'",
                                     G_HINT, F_HINT) + [
        Mistake({"y": [t * sum(parts) + c] * t, "dx": [t * whole["dx"]] * t},
                "all-reduced twice: the result is t times the sum", G_HINT),
        Mistake({"y": [contiguous] * t},
                "qkv split as one contiguous block of 3h/t columns instead of a block of each of "
                "q, k and v: your 'heads' mix q, k and v columns", HEADS_HINT),
        Mistake(common.resharded(whole, SPLIT, strided, SPLIT),
                "your heads are not block r (interleaved): your gradients are those of heads "
                "r, r+t, r+2t, ... (r::t)", HEADS_HINT),
    ]
    return Expected(inputs, outputs, passes, mistakes)


cases, check = common.grader(sys.modules[__name__])
