"""Grader for exercise ``column_parallel_linear``: W split by output columns.

Signature: ``column_parallel_linear(comm, x, weight, bias) -> (y, backward)``.
``comm`` is the tensor-parallel group (t ranks); ``x`` (b, s, d_in) is the same
on every rank; ``weight`` (d_in, d_out) and ``bias`` (d_out,) are whole, and
rank r uses columns block r (``cols_r``). ``y`` (b, s, d_out/t) is this rank's
columns of ``x @ W + b``, with no communication. ``backward(dy)``, dy this
rank's columns of dY, returns ``(dx, {"weight", "bias"})``: dx (b, s, d_in)
whole on every rank (ONE AllReduce of the partial ``dy @ W[:, cols_r].T``),
the gradients this rank's blocks.

Checks (see ``_common.py``), t = 1 to 4, b and s not multiples of t, tp groups
of 2x2 and 2x3 meshes: it runs; shapes; y, dx and the gradients equal
``ringlab.nn.Linear``'s (relative error 1e-10); the forward sends nothing; the
backward's messages are partial sums of the ranks' partial dX and add up to
one AllReduce (2(t-1) x b*s*d_in elements in the group).
"""

import sys

import numpy as np

from . import _common as common
from ._common import DEPENDS_ON_ALL, USES  # noqa: F401 (see there)
from ._common import Expected, Mistake, Pass, block, by_key, shard

NAME = "column_parallel_linear"
GRADS = ("weight", "bias")
# (b, s, d_in, d_out) for each of the groups every layer is graded on
CASES = common.on_groups([(3, 5, 5, 8), (2, 3, 4, 6), (2, 5, 7, 9), (3, 5, 6, 8),
                          (3, 3, 4, 6), (2, 4, 5, 6), (5, 2, 9, 12)])
RETURNS = ("column_parallel_linear(comm, x, weight, bias) -> (y, backward); "
           "backward(dy) -> (dx, {'weight': ..., 'bias': ...})")
SHAPES = {"y": "(b, s, d_out/t): this rank's columns of Y", "dx": "(b, s, d_in): the whole dX",
          "weight": "(d_in, d_out/t): this rank's columns of dW",
          "bias": "(d_out/t,): this rank's part of db"}
SHAPE_HINT = ("Rank r keeps columns r*d_out/t .. (r+1)*d_out/t - 1 of weight and bias: "
              "weight[:, cols], bias[cols].")
BLOCKS = {"y": "columns of this rank", "dx": "whole dX", "weight": "columns of dW (this rank's)",
          "bias": "part of db (this rank's)"}
NO_COMM = {"forward": "a column-parallel layer's forward needs none: every rank has the whole X "
                      "and computes its own columns of Y"}
ALLREDUCE_HINT = ("dX = dY @ W^T sums over all output columns; rank r has only its columns, so "
                  "its dY_r @ W_r^T is a partial sum. AllReduce it once in backward "
                  "(Megatron's f): ring_allreduce(comm, partial) (flatten it first if you like).")
HINTS = {"y": "Y_r = x @ weight[:, cols_r] + bias[cols_r], cols_r block r of range(d_out): "
              "no communication.",
         "dx": ALLREDUCE_HINT,
         "weight": "dW_r = x^T dY_r over all b*s rows: x.reshape(-1, d_in).T @ dy.reshape(-1, "
                   "d_out/t); it needs no communication.",
         "bias": "db_r = dY_r summed over batch and sequence: dy.reshape(-1, d_out/t).sum(0)."}
# A wrong value made before a right AllReduce: the local part of the pass.
LOCAL = {"dx": "Backward on rank r: dY_r @ weight[:, cols_r]^T (dY_r: its columns of dY), then "
               "the AllReduce."}
SPLIT = {"y": (-1, "cols"), "weight": (-1, "cols"), "bias": (-1, "cols")}


def mine(dims, t, r):
    return {"cols": block(dims[3], t, r)}


describe, weights = common.describe_linear, common.linear_weights


def group(w, rng, dims, t):
    b, s, di, do = dims
    weight, bias = w
    x, dy, whole = common.run_linear(w, rng, dims)
    dx = whole["dx"]
    outputs = [shard(whole, SPLIT, mine(dims, t, r)) for r in range(t)]
    cols = [mine(dims, t, r)["cols"] for r in range(t)]
    dys = [dy[..., c] for c in cols]
    partial = [dys[r] @ weight[:, c].T for r, c in enumerate(cols)]
    ys = [o["y"] for o in outputs]
    passes = {
        "forward": Pass(0, raw={
            "Y": (ys, "your columns of Y", ""), "X": ([x], "X", ""),
            "W": ([weight[:, c] for c in cols], "your columns of W", "")},
            hint=HINTS["y"]),
        "backward": Pass(1, f"the partial dX (dY_r @ W_r^T, b*s*d_in = {b * s * di} elements)",
                         [partial], raw={
            "dY": (dys, "your columns of dY",
                   "an AllGather of dY, so that every rank can multiply the whole dY by the "
                   "whole W; a column-parallel layer sums partial products with one AllReduce"),
            "X": ([x], "X", "X is the same on every rank: nothing to send"),
            "W": ([weight[:, c] for c in cols], "your columns of W",
                  "every rank has the whole W already"),
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
        Mistake({"y": [t * x @ weight[:, c] + bias[c] for c in cols]},
                "your forward all-reduced X, which every rank already has, so the sum is t x X "
                "(f and g swapped? f is the identity forward)",
                "Use X as it is: every rank has the whole X."),
        Mistake({"y": [x @ weight[:, c] for c in cols]}, "the bias is missing",
                "Add bias[cols_r] to your columns of Y."),
        Mistake(by_key([shard(whole, SPLIT, {"cols": np.arange(r, do, t)}) for r in range(t)],
                       ("y", "weight")),
                "you took every t-th column (r::t), not block r",
                "Rank r owns the contiguous block r*d_out/t .. (r+1)*d_out/t - 1 (Megatron's "
                "convention, as ColumnParallelLinear.from_linear)."),
    ]
    return Expected([[[x, weight, bias], dys[r]] for r in range(t)], outputs, passes, mistakes)


cases, check = common.grader(sys.modules[__name__])
