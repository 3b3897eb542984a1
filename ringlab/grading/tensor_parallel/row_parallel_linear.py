"""Grader for exercise ``row_parallel_linear``: W split by input rows.

``row_parallel_linear(comm, x, weight, bias) -> (y, backward)``: x (b, s, d_in/t) is
this rank's columns ``rows_r`` of X (as a column-parallel layer leaves them); the whole
weight (d_in, d_out) and bias are on every rank, which uses rows block r of W. y
(b, s, d_out) whole on every rank: ONE AllReduce of the partial products
``x @ W[rows_r]``, the bias added once (before the sum on one rank, or 1/t of it on
each, is right too). ``backward(dy)``, dy whole, returns ``(dx, {"weight", "bias"})``
with no communication: dx this rank's columns, dW its rows, db whole. The checks are
``_common``'s; the usual mistakes are the formulas of ``group``.
"""

import sys

from . import _common as common
from ._common import DEPENDS_ON_ALL, USES  # noqa: F401 (see there)
from ._common import Expected, Mistake, Pass, block, with_bias

NAME = "row_parallel_linear"
GRADS, MODULE, RETURNS, describe = common.linear_layer(NAME)
# (b, s, d_in, d_out) for each of the groups every layer is graded on
CASES = common.on_groups([(3, 5, 8, 5), (2, 3, 4, 6), (2, 5, 9, 7), (3, 5, 8, 6),
                          (3, 3, 6, 4), (2, 4, 6, 5), (5, 2, 12, 9)])
SHAPE_HINT = ("Rank r keeps rows r*d_in/t .. (r+1)*d_in/t - 1 of weight (weight[rows, :]) and "
              "the whole bias; x is already only its columns of X.")
NO_COMM = {"backward": "a row-parallel layer's backward needs none: dY is the same on every rank, "
                       "and dX_r = dY @ W_r^T, dW_r = X_r^T dY need only this rank's data"}
ALLREDUCE_HINT = ("Each rank's x_r @ W[rows_r] is a partial sum of Y: AllReduce it once "
                  "(Megatron's g), then add the bias, once.")
DX_HINT = "dX_r = dY @ W[rows_r].T: local, no communication."
BIAS_HINT = ("db = dY summed over batch and sequence, on every rank (dY is whole there): no "
             "AllReduce.")
# Of each output: its shape, which block of the unsharded layer's it is, a hint when it is wrong.
OUTPUTS = {
    "y": ("(b, s, d_out): the whole Y on every rank", "whole Y", ALLREDUCE_HINT),
    "dx": ("(b, s, d_in/t): this rank's columns of dX", "columns of dX (this rank's)", DX_HINT),
    "weight": ("(d_in/t, d_out): this rank's rows of dW", "rows of dW (this rank's)",
               "dW_r = x_r^T dY over all b*s rows: x.reshape(-1, d_in/t).T @ dy.reshape(-1, "
               "d_out)."),
    "bias": ("(d_out,): the whole db", "whole db", BIAS_HINT)}
# A wrong value made before a right AllReduce: the local part of the pass.
LOCAL = {"y": "Forward on rank r: x_r @ weight[rows_r] (x_r is rank r's shard of X), then the "
              "AllReduce, then the bias once."}
SPLIT = {"dx": (-1, "rows"), "weight": (0, "rows")}


def mine(dims, t, r):
    return {"rows": block(dims[2], t, r)}


def group(w, rng, dims, t):
    (b, s, _, do), (weight, bias) = dims, w
    x, dy, whole, idx, outputs = common.linear_group(sys.modules[__name__], w, rng, dims, t)
    xs, ws = [x[..., i["rows"]] for i in idx], [weight[i["rows"]] for i in idx]
    partial = [xr @ wr for xr, wr in zip(xs, ws)]
    dxs = [o["dx"] for o in outputs]
    gather = ("an AllGather of X, so that every rank can multiply the whole X by the whole W; "
              "a row-parallel layer sums partial products with one AllReduce")
    passes = {
        "forward": Pass(1, f"the partial products (x_r @ W_r, b*s*d_out = {b * s * do} elements)",
                        with_bias(partial, bias, t),
                        raw={"X": (xs, f"your shard of X to the other ranks (b*s*d_in/t = "
                                       f"{xs[0].size} elements from each rank)", gather),
                             "W": (ws, "your rows of W", "every rank has the whole W already")},
                        hint=ALLREDUCE_HINT),
        "backward": Pass(0, raw={"dX": (dxs, "your columns of dX", ""), "dY": ([dy], "dY", ""),
                                 "X": (xs, "your shard of X", "")}, hint=DX_HINT)}
    total = sum(partial)
    mistakes = common.g_mistakes(partial, bias, t, "the bias", "your Y is only your rows' partial "
                                 "sum: no AllReduce in forward", ALLREDUCE_HINT) + [
        Mistake({"y": [total] * t}, "the bias is missing", "Add the bias once, after the sum."),
        Mistake({"y": [t * total + bias] * t, "dx": [t * d for d in dxs]},
                "your forward summed partial sums that were already whole: all-reduced twice",
                ALLREDUCE_HINT),
        Mistake({"dx": [sum(dxs)] * t},
                "your dX is the sum of every rank's dX: an AllReduce in backward, which a "
                "row-parallel layer does not need (f and g swapped?)",
                "g is an AllReduce forward and the identity backward: dX_r = dY @ W_r^T, local."),
        Mistake({"bias": [t * whole["bias"]] * t},
                "your bias gradient is t times too large: all-reduced, but dY is the same on "
                "every rank, so each rank's db is already the whole one", BIAS_HINT),
        Mistake({"bias": [whole["bias"] / t] * t},
                "your bias gradient is divided by t: the bias is added once, so its gradient is "
                "the whole sum of dY", BIAS_HINT),
    ]
    return Expected([[[xs[r], weight, bias], dy] for r in range(t)], outputs, passes, mistakes)


cases, check = common.grader(sys.modules[__name__])
