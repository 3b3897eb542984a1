"""Grader for exercise ``megatron_mlp``: the transformer MLP split by hidden units.

``megatron_mlp(comm, x, fc_weight, fc_bias, proj_weight, proj_bias) -> (y, backward)``,
y = GeLU(x @ fc_weight + fc_bias) @ proj_weight + proj_bias (``ringlab.nn.GeLU()``, the
tanh form). x (b, s, h) and the whole weights are on every rank, which owns hidden
units block r: those columns of fc and rows of proj. y whole on every rank;
``backward(dy)`` returns dx whole and ``{"fc.weight", "fc.bias", "proj.weight",
"proj.bias"}``, this rank's blocks (proj.bias whole). Exactly one AllReduce forward (g)
and one backward (f), each of b*s*h elements. The checks are ``_common``'s; the usual
mistakes (GeLU of partial sums, the exact GeLU, ...) are the formulas of ``group``.
"""

import sys

import numpy as np

from . import _common as common
from ._common import DEPENDS_ON_ALL, USES  # noqa: F401 (see there)
from ._common import Expected, Mistake, block
from ...nn import MLP, GeLU

NAME = "megatron_mlp"
GRADS, MODULE = ("fc.weight", "fc.bias", "proj.weight", "proj.bias"), MLP
# (b, s, h, H4) for each of the groups every layer is graded on
CASES = common.on_groups([(3, 5, 4, 8), (2, 3, 4, 8), (2, 5, 6, 12), (3, 5, 6, 16),
                          (3, 3, 4, 10), (2, 4, 5, 9), (5, 2, 8, 24)])
RETURNS = ("megatron_mlp(comm, x, fc_weight, fc_bias, proj_weight, proj_bias) -> (y, backward); "
           "backward(dy) -> (dx, {'fc.weight', 'fc.bias', 'proj.weight', 'proj.bias'})")
SHAPE_HINT = ("Rank r owns hidden units r*H4/t .. (r+1)*H4/t - 1: fc_weight[:, hid], "
              "fc_bias[hid], proj_weight[hid, :], and the whole proj_bias.")
G_HINT = ("fc is column-parallel and proj row-parallel: rank r computes GeLU(x A_r + a_r) B_r, a "
          "partial sum of Y. " + common.G_ONCE)
F_HINT = common.f_hint("hidden units")
# Of each output: its shape, which block of the unsharded layer's it is, a hint when it is wrong.
OUTPUTS = common.block_outputs(G_HINT, F_HINT, {
    "fc.weight": ("(h, H4/t): this rank's columns of fc", "columns of fc's dW (this rank's)",
                  "fc's dW_r = x^T dU_r, dU_r the gradient of your hidden pre-activations: local."),
    "fc.bias": ("(H4/t,)", "part of fc's db (this rank's)",
                "fc's db_r = dU_r summed over batch and sequence: local."),
    "proj.weight": ("(H4/t, h): this rank's rows of proj", "rows of proj's dW (this rank's)",
                    "proj's dW_r = GeLU(U_r)^T dY over all b*s rows: local.")})
# A wrong value made before a right AllReduce: the local part of the pass.
LOCAL = {"y": "Forward on rank r: GeLU(x @ A_r + a_r) @ B_r, with ringlab.nn's GeLU (tanh "
              "form), then the AllReduce, then proj_bias once.",
         "dx": "Backward on rank r, in reverse: dH = dY @ B_r^T, dU = dH * GeLU'(U) (GeLU's "
               "derivative at its input U = x A_r + a_r: GeLU.backward), dX_r = dU @ A_r^T; "
               "then the AllReduce."}
SPLIT = {"fc.weight": (-1, "cols"), "fc.bias": (-1, "cols"), "proj.weight": (0, "rows")}


def mine(dims, t, r):
    """Rank r's hidden units: its columns of fc, its rows of proj."""
    hid = block(dims[3], t, r)
    return {"cols": hid, "rows": hid}


def describe(dims):
    b, s, h, h4 = dims
    return f"x (b={b}, s={s}, h={h}), hidden H4={h4}"


def _forward(x, A, a, B, approximate="tanh"):
    act = GeLU(approximate)
    u = x @ A + a
    return act, u, act.forward(u), act.forward(u) @ B


def group(w, rng, dims, t):
    b, s, h, h4 = dims
    A, a, B, c = w
    x, dy = rng.standard_normal((b, s, h)), rng.standard_normal((b, s, h))
    whole, idx, outputs = common.answers(sys.modules[__name__], rng, w, x, dy, dims, t)
    hid = [i["cols"] for i in idx]
    parts, hs, us, dus, partial_dx = [], [], [], [], []
    for k in hid:
        act, u, hk, p = _forward(x, A[:, k], a[k], B[k])
        du = act.backward(dy @ B[k].T)
        parts.append(p), hs.append(hk), us.append(u), dus.append(du)
        partial_dx.append(du @ A[:, k].T)
    gather = ("an AllGather of the hidden activations, so that every rank multiplies all of "
              "them by the whole proj weight; the Megatron MLP sums partial products with one "
              "AllReduce (g)")
    passes = common.block_passes(
        x, dy, c, t, (f"the partial products GeLU(x A_r + a_r) B_r ({b * s * h} elements)", parts,
                      {"H": (hs, "your hidden activations GeLU(x A_r + a_r)", gather),
                       "U": (us, "your hidden pre-activations x A_r + a_r", gather)}),
        (f"the partial dX (dU_r A_r^T, {b * s * h} elements)", partial_dx,
         {"dU": (dus, "the gradient of your hidden units",
                 "an AllGather of the hidden units' gradients, so that every rank multiplies "
                 "them by the whole fc weight; backward sums the partial dX with one AllReduce "
                 "(f)")}), G_HINT, F_HINT)
    total = sum(parts)
    swapped = [_forward(t * x, A[:, k], a[k], B[k])[3] + c for k in hid]
    mistakes = common.block_mistakes(parts, partial_dx, c, t, swapped, "your hidden units'",
                                     G_HINT, F_HINT) + [
        Mistake({"y": [t * total + c] * t},
                "Y all-reduced twice: the result is t times the sum", G_HINT),
        Mistake({"dx": [t * whole["dx"]] * t},
                "dX all-reduced twice: the result is t times the sum", F_HINT),
        Mistake({"y": [sum(_forward(x, A[:, k], a[k], B[k], "none")[3] for k in hid) + c] * t},
                "you used the exact (erf) GeLU; the exercise uses the tanh approximation",
                "Use ringlab.nn.GeLU() (approximate='tanh'), as ringlab.nn.MLP does.")]
    rows = np.array_split(np.arange(h), t)
    for bias_on in ("every", "first"):
        y_bad = sum(_forward(x[..., rw], A[rw], a if bias_on == "every" or r == 0 else 0, B)[3]
                    for r, rw in enumerate(rows)) + c
        mistakes.append(Mistake(
            {"y": [y_bad] * t},
            "GeLU applied to partial sums before the reduce: you split fc by its input rows, so "
            "each rank holds a partial sum of x A, and GeLU(a + b) != GeLU(a) + GeLU(b)",
            "Split fc by its output columns (hidden units): each rank then holds complete hidden "
            "pre-activations, GeLU applies exactly, and only proj's output needs the AllReduce."))
    strided = [{"cols": np.arange(r, h4, t), "rows": np.arange(r, h4, t)} for r in range(t)]
    mistakes.append(Mistake(
        common.resharded(whole, SPLIT, strided, SPLIT),
        "your gradients are those of every t-th hidden unit (r::t), not of block r",
        "Rank r owns the contiguous hidden units r*H4/t .. (r+1)*H4/t - 1 (Megatron's "
        "convention)."))
    return Expected([[[x, A, a, B, c], dy] for _ in range(t)], outputs, passes, mistakes)


cases, check = common.grader(sys.modules[__name__])
