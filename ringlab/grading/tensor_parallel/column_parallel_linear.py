"""Grader for exercise ``column_parallel_linear``: W split by output columns.

``column_parallel_linear(comm, x, weight, bias) -> (y, backward)``: ``comm`` is the
tensor-parallel group (t ranks); x (b, s, d_in) and the whole weight (d_in, d_out) and
bias are on every rank, which uses its columns block r (``cols_r``). y (b, s, d_out/t):
this rank's columns of ``x @ W + b``, with no communication. ``backward(dy)``, dy this
rank's columns of dY, returns ``(dx, {"weight", "bias"})``: dx (b, s, d_in) whole (ONE
AllReduce of the partial ``dy @ W[:, cols_r].T``), the gradients this rank's blocks.
The checks are ``_common``'s; the usual mistakes and what else a message could carry
are the formulas of ``group``.
"""

import sys

import numpy as np

from . import _common as common
from ._common import DEPENDS_ON_ALL, USES  # noqa: F401 (see there)
from ._common import Expected, Mistake, Pass, block

NAME = "column_parallel_linear"
GRADS, MODULE, RETURNS, describe = common.linear_layer(NAME)
# (b, s, d_in, d_out) for each of the groups every layer is graded on
CASES = common.on_groups([(3, 5, 5, 8), (2, 3, 4, 6), (2, 5, 7, 9), (3, 5, 6, 8),
                          (3, 3, 4, 6), (2, 4, 5, 6), (5, 2, 9, 12)])
SHAPE_HINT = ("Rank r keeps columns r*d_out/t .. (r+1)*d_out/t - 1 of weight and bias: "
              "weight[:, cols], bias[cols].")
NO_COMM = {"forward": "a column-parallel layer's forward needs none: every rank has the whole X "
                      "and computes its own columns of Y"}
ALLREDUCE_HINT = ("dX = dY @ W^T sums over all output columns; rank r has only its columns, so "
                  "its dY_r @ W_r^T is a partial sum. AllReduce it once in backward "
                  "(Megatron's f): ring_allreduce(comm, partial) (flatten it first if you like).")
Y_HINT = ("Y_r = x @ weight[:, cols_r] + bias[cols_r], cols_r block r of range(d_out): "
          "no communication.")
# Of each output: its shape, which block of the unsharded layer's it is, a hint when it is wrong.
OUTPUTS = {
    "y": ("(b, s, d_out/t): this rank's columns of Y", "columns of this rank", Y_HINT),
    "dx": ("(b, s, d_in): the whole dX", "whole dX", ALLREDUCE_HINT),
    "weight": ("(d_in, d_out/t): this rank's columns of dW", "columns of dW (this rank's)",
               "dW_r = x^T dY_r over all b*s rows: x.reshape(-1, d_in).T @ dy.reshape(-1, "
               "d_out/t); it needs no communication."),
    "bias": ("(d_out/t,): this rank's part of db", "part of db (this rank's)",
             "db_r = dY_r summed over batch and sequence: dy.reshape(-1, d_out/t).sum(0).")}
# A wrong value made before a right AllReduce: the local part of the pass.
LOCAL = {"dx": "Backward on rank r: dY_r @ weight[:, cols_r]^T (dY_r: its columns of dY), then "
               "the AllReduce."}
SPLIT = {"y": (-1, "cols"), "weight": (-1, "cols"), "bias": (-1, "cols")}


def mine(dims, t, r):
    return {"cols": block(dims[3], t, r)}


def group(w, rng, dims, t):
    (b, s, di, do), (weight, bias) = dims, w
    x, dy, whole, idx, outputs = common.linear_group(sys.modules[__name__], w, rng, dims, t)
    cols = [i["cols"] for i in idx]
    dys, ws = [dy[..., c] for c in cols], [weight[:, c] for c in cols]
    partial = [d @ wc.T for d, wc in zip(dys, ws)]
    ys, dx = [o["y"] for o in outputs], whole["dx"]
    passes = {
        "forward": Pass(0, raw={"Y": (ys, "your columns of Y", ""), "X": ([x], "X", ""),
                                "W": (ws, "your columns of W", "")}, hint=Y_HINT),
        "backward": Pass(1, f"the partial dX (dY_r @ W_r^T, b*s*d_in = {b * s * di} elements)",
                         [partial], raw={
            "dY": (dys, "your columns of dY",
                   "an AllGather of dY, so that every rank can multiply the whole dY by the "
                   "whole W; a column-parallel layer sums partial products with one AllReduce"),
            "X": ([x], "X", "X is the same on every rank: nothing to send"),
            "W": (ws, "your columns of W", "every rank has the whole W already"),
            "dW": ([o["weight"] for o in outputs], "your weight gradient",
                   "dW stays on its rank: each holds its own columns")}, hint=ALLREDUCE_HINT)}
    mistakes = [
        Mistake({"dx": partial},
                "your dX is only your shard's contribution: no AllReduce in backward",
                ALLREDUCE_HINT),
        Mistake({"dx": [t * dx] * t}, "dX all-reduced twice: it is t times the right dX",
                "AllReduce the partial dX once: after one AllReduce it is already whole."),
        Mistake({"dx": [dx / t] * t}, "dX averaged over the ranks instead of summed",
                "The partial dX are parts of one sum: AllReduce sums them; do not divide by t."),
        Mistake({"y": [sum(ys)] * t},
                "your Y is the sum of every rank's columns: an AllReduce in forward "
                "(f and g swapped?)",
                "f is the identity forward and an AllReduce backward: a column-parallel layer's "
                "forward sends nothing."),
        Mistake({"y": [t * x @ wc + bias[c] for wc, c in zip(ws, cols)]},
                "your forward all-reduced X, which every rank already has, so the sum is t x X "
                "(f and g swapped? f is the identity forward)",
                "Use X as it is: every rank has the whole X."),
        Mistake({"y": [x @ wc for wc in ws]}, "the bias is missing",
                "Add bias[cols_r] to your columns of Y."),
        Mistake(common.resharded(whole, SPLIT, [{"cols": np.arange(r, do, t)} for r in range(t)],
                                 ("y", "weight")),
                "you took every t-th column (r::t), not block r",
                "Rank r owns the contiguous block r*d_out/t .. (r+1)*d_out/t - 1 (Megatron's "
                "convention, as ColumnParallelLinear.from_linear)."),
    ]
    return Expected([[[x, weight, bias], dys[r]] for r in range(t)], outputs, passes, mistakes)


cases, check = common.grader(sys.modules[__name__])
