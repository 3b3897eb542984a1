"""The tensor-parallel graders: different right programs pass; the usual mistakes
and the cheats that get right values with the wrong communication fail, with
the check and the words that say what to fix."""

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allgather, ring_allreduce
from ringlab.nn import CausalSelfAttention, GeLU, Linear, Module

SEED = 3
SHARED = {}     # what a cheat shares between ranks without messages (all ranks in one process)


def grade(exercise, fn):
    return ringlab.grade(exercise, fn, seed=SEED, log=False)


# ---------------------------------------------------------------- AllReduces, all right
def flat_ring(comm, a):
    """The library's ring on a flat copy (chunks equal for any shape)."""
    flat = np.array(a, copy=True).reshape(-1)
    return ring_allreduce(comm, flat, out=flat).reshape(np.shape(a))


def shaped_ring(comm, a):
    """The library's ring on the (b, s, h) array itself: chunks along b, some empty when b < t."""
    return ring_allreduce(comm, np.array(a, copy=True))


def own_ring(comm, a):
    """A hand-written ring: reduce-scatter then all-gather, sendrecv, chunks of the flat array."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    ch = np.array_split(np.array(a, dtype=np.float64).ravel(), n)
    for k in range(n - 1):
        ch[(r - k - 1) % n] = ch[(r - k - 1) % n] + comm.sendrecv(ch[(r - k) % n], right, left)
    for k in range(n - 1):
        ch[(r - k) % n] = comm.sendrecv(ch[(r + 1 - k) % n], right, left)
    return np.concatenate(ch).reshape(np.shape(a))


def reduce_broadcast(comm, a):
    """Everyone sends to rank 0, which sums and sends the total back: 2(t-1) N elements too."""
    n, r = comm.world_size, comm.rank
    if r == 0:
        total = np.array(a, dtype=np.float64)
        for src in range(1, n):
            total = total + comm.recv(src)
        for dst in range(1, n):
            comm.send(total, dst)
        return total
    comm.send(np.array(a, dtype=np.float64), 0)
    return comm.recv(0)


def averaging_ring(comm, a):
    """own_ring that averages: each complete chunk divided by t before the all-gather
    (a mean AllReduce, same bytes), times t on return (so the values are right)."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    ch = np.array_split(np.array(a, dtype=np.float64).ravel(), n)
    for k in range(n - 1):
        ch[(r - k - 1) % n] = ch[(r - k - 1) % n] + comm.sendrecv(ch[(r - k) % n], right, left)
    ch[(r + 1) % n] = ch[(r + 1) % n] / n
    for k in range(n - 1):
        ch[(r - k) % n] = comm.sendrecv(ch[(r + 1 - k) % n], right, left)
    return n * np.concatenate(ch).reshape(np.shape(a))


def twice_then_divide(comm, a):
    """Right values, two AllReduces: the second sums values that are already whole."""
    return flat_ring(comm, flat_ring(comm, a)) / comm.world_size


def naive(comm, a):
    """Every rank sends its whole part to every other rank: t(t-1) N elements."""
    n, r = comm.world_size, comm.rank
    total = np.array(a, dtype=np.float64)
    for k in range(1, n):
        got = comm.sendrecv(np.array(a, dtype=np.float64), (r + k) % n, (r - k) % n)
        total = total + got
    return total


def zeros_for_show(comm, a):
    """A ring of zeros for the trace; the real parts go through a module-level dict."""
    call = SHARED[("calls", comm.group.label, comm.rank)] = SHARED.get(
        ("calls", comm.group.label, comm.rank), 0) + 1
    SHARED[(comm.group.label, comm.rank, call)] = np.array(a, copy=True)
    flat_ring(comm, np.zeros(np.shape(a)))        # everyone has posted once this returns
    return sum(SHARED[(comm.group.label, r, call)] for r in range(comm.world_size))


def no_reduce(comm, a):
    return a


# ----------------------------------------------------------------- column-parallel Linear
def rows2(a):
    return a.reshape(-1, a.shape[-1])


def column(ar=flat_ring, *, fwd=None, twice=False, strided=False, gather_dy=False, boom=False,
           hang=False, global_rank=False):
    def column_parallel_linear(comm, x, weight, bias):
        t, r = comm.world_size, comm.rank
        if global_rank:     # right only where the tp groups are contiguous ranks
            r = comm.global_rank % t
        n = weight.shape[1] // t
        cols = np.arange(r, weight.shape[1], t) if strided else np.arange(r * n, (r + 1) * n)
        W, b = weight[:, cols], bias[cols]
        if boom and r == t - 1:
            raise KeyError("oops")
        xin = fwd(comm, x) if fwd is not None else x
        y = xin @ W + b

        def backward(dy):
            if hang and r == 0 and t > 1:
                comm.recv(1, tag=99)       # nobody sends that: a deadlock
            if gather_dy:
                whole = np.moveaxis(ring_allgather(comm, np.moveaxis(dy, -1, 0)), 0, -1)
                dx = whole @ weight.T
            else:
                dx = ar(comm, dy @ W.T)
                if twice:
                    dx = ar(comm, dx)
            return dx, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
        return y, backward
    return column_parallel_linear


def column_gather_y(comm, x, weight, bias):
    """f and g swapped: AllReduce of the output columns forward, none backward."""
    t, r = comm.world_size, comm.rank
    n = weight.shape[1] // t
    W, b = weight[:, r * n:(r + 1) * n], bias[r * n:(r + 1) * n]
    y = flat_ring(comm, x @ W + b)

    def backward(dy):
        return dy @ W.T, {"weight": rows2(x).T @ rows2(dy), "bias": rows2(dy).sum(0)}
    return y, backward


def column_no_bias_grad_key(comm, x, weight, bias):
    y, back = column()(comm, x, weight, bias)

    def backward(dy):
        dx, g = back(dy)
        return dx, {"w": g["weight"], "bias": g["bias"]}
    return y, backward


COLUMN_RIGHT = [column(flat_ring), column(shaped_ring), column(own_ring), column(reduce_broadcast)]
COLUMN_WRONG = [
    (column(no_reduce), "dx equals", ["no AllReduce in backward", "only your shard's contribution"]),
    (column_gather_y, "y equals", ["f and g swapped", "AllReduce in forward"]),
    (column(twice=True), "dx equals", ["dX all-reduced twice"]),
    (column(twice_then_divide), "backward communication", ["twice"]),
    (column(naive), "backward communication", ["bytes of one bandwidth-optimal AllReduce"]),
    (column(fwd=lambda comm, x: flat_ring(comm, x) / comm.world_size), "forward communication",
     ["forward needs none"]),
    (column(strided=True), "y equals", ["every t-th column (r::t)"]),
    # its tp rank from the global rank: right on contiguous groups, wrong on strided ones
    (column(global_rank=True), "y equals", ["3x2 DeviceMesh (tp x dp)",
                                            "rank 1 (rank 0 of its tp group, tp[1])",
                                            "it is rank 1's block, not this rank's"]),
    (column(gather_dy=True), "backward communication", ["your columns of dY", "AllGather of dY"]),
    (column(zeros_for_show), "backward communication", ["zeros", "do not pass"]),
    (column(boom=True), "runs without error", ["KeyError"]),
    (column(hang=True), "no deadlock", ["rank 0"]),
    (column_no_bias_grad_key, "returns (y, backward)", ["'weight', 'bias'"]),
]


# -------------------------------------------------------------------- row-parallel Linear
def row(ar=flat_ring, *, bias_where="after", bwd=None, bias_grad=None, gather_x=False):
    def row_parallel_linear(comm, x, weight, bias):
        t, r = comm.world_size, comm.rank
        n = weight.shape[0] // t
        W = weight[r * n:(r + 1) * n]
        if gather_x:
            whole = np.moveaxis(ring_allgather(comm, np.moveaxis(x, -1, 0)), 0, -1)
            y = whole @ weight + bias
        elif bias_where == "after":
            y = ar(comm, x @ W) + bias
        elif bias_where == "rank0":
            y = ar(comm, x @ W + (bias if r == 0 else 0))
        else:                                             # "every": the mistake
            y = ar(comm, x @ W + bias)

        def backward(dy):
            dx = dy @ W.T
            if bwd is not None:
                dx = bwd(comm, dx)
            db = rows2(dy).sum(0)
            if bias_grad is not None:
                db = bias_grad(comm, db)
            return dx, {"weight": rows2(x).T @ rows2(dy), "bias": db}
        return y, backward
    return row_parallel_linear


ROW_RIGHT = [row(flat_ring), row(shaped_ring, bias_where="rank0"), row(own_ring),
             row(reduce_broadcast)]
ROW_WRONG = [
    (row(bias_where="every"), "y equals", ["bias was added on every rank before the AllReduce",
                                           "counts t times"]),
    (row(no_reduce), "y equals", ["no AllReduce in forward"]),
    (row(no_reduce, bwd=flat_ring), "y equals", ["no AllReduce in forward"]),
    (row(bwd=flat_ring), "dx equals", ["AllReduce in backward", "f and g swapped"]),
    (row(bias_grad=flat_ring), 'grads["bias"] equals', ["t times too large"]),
    (row(bwd=lambda comm, d: d + 0 * flat_ring(comm, d)),
     "backward communication", ["backward needs none"]),
    (row(gather_x=True), "forward communication", ["your shard of X to the other ranks",
                                                   "AllGather of X", "one AllReduce"]),
    (row(zeros_for_show), "forward communication", ["zeros"]),
    (row(twice_then_divide), "forward communication", ["twice"]),
    # a mean AllReduce times t: right values, same bytes, not "stand-ins sent for show"
    (row(averaging_ring), "forward communication",
     ["your forward's AllReduce averages", "holds the sum over all the ranks, divided by t = 2",
      "where the layer needs their sum", "a mean (sum / t) is data parallelism's"]),
    # a mean AllReduce, not multiplied back: wrong values, named from the messages
    (row(lambda c, a: averaging_ring(c, a) / c.world_size), "y equals",
     ["your forward's AllReduce averages", "divided by t = 2", "AllReduce with a sum"]),
]


# ------------------------------------------------------------------------- Megatron MLP
def mlp(ar=flat_ring, *, fwd_ar=None, bias_where="after", swapped=False, strided=False,
        gather_h=False, approximate="tanh", boom=False, bad_derivative=False):
    fwd_ar = fwd_ar or ar

    def megatron_mlp(comm, x, fc_weight, fc_bias, proj_weight, proj_bias):
        t, r = comm.world_size, comm.rank
        n = fc_weight.shape[1] // t
        k = np.arange(r, fc_weight.shape[1], t) if strided else np.arange(r * n, (r + 1) * n)
        A, a, B = fc_weight[:, k], fc_bias[k], proj_weight[k]
        if boom and r == 1:
            raise ValueError("boom")
        act = GeLU(approximate)
        xin = flat_ring(comm, x) if swapped else x             # f and g swapped: f reduces X
        h = act.forward(xin @ A + a)
        if gather_h:
            hh = np.moveaxis(ring_allgather(comm, np.moveaxis(h, -1, 0)), 0, -1)
            order = np.concatenate([np.arange(q * n, (q + 1) * n) for q in range(t)])
            y = hh @ proj_weight[order] + proj_bias
        elif swapped:
            y = h @ B + proj_bias
        elif bias_where == "after":
            y = fwd_ar(comm, h @ B) + proj_bias
        elif bias_where == "rank0":
            y = fwd_ar(comm, h @ B + (proj_bias if r == 0 else 0))
        else:
            y = fwd_ar(comm, h @ B + proj_bias)

        def backward(dy):
            dyin = flat_ring(comm, dy) if swapped else dy
            du = act.backward(dyin @ B.T)
            if bad_derivative:      # GeLU's derivative taken as 1: a wrong local backward
                du = dyin @ B.T
            dx = du @ A.T if swapped else ar(comm, du @ A.T)
            return dx, {"fc.weight": rows2(x).T @ rows2(du), "fc.bias": rows2(du).sum(0),
                        "proj.weight": rows2(h).T @ rows2(dy), "proj.bias": rows2(dy).sum(0)}
        return y, backward
    return megatron_mlp


def mlp_gelu_before_reduce(comm, x, fc_weight, fc_bias, proj_weight, proj_bias):
    """fc split by its input rows: GeLU of a partial sum."""
    t, r = comm.world_size, comm.rank
    rows = np.array_split(np.arange(x.shape[-1]), t)[r]
    act = GeLU()
    h = act.forward(x[..., rows] @ fc_weight[rows] + fc_bias)
    y = flat_ring(comm, h @ proj_weight) + proj_bias

    def backward(dy):
        n = fc_weight.shape[1] // t
        return np.zeros_like(x), {"fc.weight": np.zeros((x.shape[-1], n)), "fc.bias": np.zeros(n),
                                  "proj.weight": np.zeros((n, x.shape[-1])),
                                  "proj.bias": np.zeros(x.shape[-1])}
    return y, backward


MLP_RIGHT = [mlp(flat_ring), mlp(shaped_ring, bias_where="rank0"), mlp(own_ring),
             mlp(reduce_broadcast, fwd_ar=own_ring)]
MLP_WRONG = [
    (mlp(no_reduce, fwd_ar=flat_ring), "dx equals", ["your dX is only your shard's contribution",
                                   "no AllReduce in backward"]),
    (mlp(fwd_ar=no_reduce), "y equals", ["no AllReduce in forward"]),
    (mlp(bias_where="every"), "y equals", ["bias was added on every rank before the AllReduce"]),
    (mlp_gelu_before_reduce, "y equals", ["GeLU applied to partial sums before the reduce"]),
    (mlp(swapped=True), "y equals", ["f and g swapped"]),
    (mlp(lambda c, a: flat_ring(c, flat_ring(c, a)), fwd_ar=flat_ring), "dx equals", ["dX all-reduced twice", "f)"]),
    (mlp(twice_then_divide, fwd_ar=flat_ring), "backward communication", ["twice"]),
    (mlp(approximate="none"), "y equals", ["exact (erf) GeLU"]),
    (mlp(lambda c, a: flat_ring(c, np.asarray(a, dtype=np.float32)).astype(np.float64)),
     "messages carry float64", ["rank 0 sent rank 1 a float32 message", "no astype"]),
    # exact values, but bytes no real backend sends: told so, not "rounds the values"
    (mlp(lambda c, a: flat_ring(c, np.asarray(a, dtype=">f8")).astype(np.float64)),
     "messages carry float64", ["a >f8 message", "float64 in the other byte order"]),
    # a wrong local derivative before a right AllReduce: not told to AllReduce (f)
    (mlp(bad_derivative=True), "dx equals", [
        "the AllReduce is right (every rank ends with the same dx, and your backward moved "
        "exactly one AllReduce's 960 bytes)", "rank 0's first message, sent before it received "
        "anything, holds values that are not its part of it", "The local backward before the "
        "AllReduce is wrong", "dU = dH * GeLU'(U)"]),
    (mlp(strided=True), 'grads["fc.weight"] equals', ["every t-th hidden unit"]),
    (mlp(gather_h=True), "forward communication", ["your hidden activations",
                                                   "AllGather of the hidden activations"]),
    (mlp(zeros_for_show), "forward communication", ["zeros"]),
    (mlp(boom=True), "runs without error", ["rank 1 raised ValueError", "boom"]),
]


def test_a_wrong_local_derivative_is_not_told_to_all_reduce():
    """Values are read before messages: a dX that is wrong because of the local backward
    once got the hint of a missing AllReduce ("AllReduce it once (Megatron's f)")."""
    text = str(grade("megatron_mlp", mlp(bad_derivative=True)))
    assert "The local backward before the AllReduce is wrong" in text, text
    assert "Megatron's f" not in text and "AllReduce it once" not in text, text


# ----------------------------------------------------------------------- TP attention
def attention(ar=flat_ring, *, fwd_ar=None, heads="block", check_heads=True,
              bias_where="after", gather_out=False, hang=False):
    fwd_ar = fwd_ar or ar

    def tp_attention(comm, x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_heads):
        t, r = comm.world_size, comm.rank
        if check_heads and n_heads % t and (check_heads != "rank0" or r == 0):
            raise ValueError(f"t={t} does not divide n_heads={n_heads}")
        h = x.shape[-1]
        hd = h // n_heads
        if heads == "block":
            mine = np.arange(r * h // t, (r + 1) * h // t)
        elif heads == "strided":
            mine = np.concatenate([np.arange(j * hd, (j + 1) * hd) for j in range(r, n_heads, t)])
        else:                                   # "uneven": array_split of the heads, no check
            js = np.array_split(np.arange(n_heads), t)[r]
            mine = np.concatenate([np.arange(j * hd, (j + 1) * hd) for j in js]).astype(int)
        cols = np.concatenate([mine, h + mine, 2 * h + mine])
        if heads == "contiguous":
            cols = np.arange(r * 3 * h // t, (r + 1) * 3 * h // t)
        m = CausalSelfAttention.__new__(CausalSelfAttention)
        Module.__init__(m)
        m.head_dim, m.n_heads = hd, len(mine) // hd
        rng = np.random.default_rng(0)
        m.qkv = Linear(h, len(cols), rng)
        m.qkv.params["weight"][...], m.qkv.params["bias"][...] = qkv_weight[:, cols], qkv_bias[cols]
        m.proj = Linear(len(mine), h, rng, bias=False)
        m.proj.params["weight"][...] = proj_weight[mine]
        part = m.forward(x)
        if gather_out:    # ship every rank's proj input around and multiply by the whole W
            mine_all = ring_allgather(comm, mine.astype(np.float64)).astype(int)
            b, heads_, s, _ = m.v.shape
            out = (m.probs @ m.v).transpose(0, 2, 1, 3).reshape(b, s, heads_ * hd)
            whole = np.moveaxis(ring_allgather(comm, np.moveaxis(out, -1, 0)), 0, -1)
            y = whole @ proj_weight[mine_all] + proj_bias
        elif bias_where == "after":
            y = fwd_ar(comm, part) + proj_bias
        elif bias_where == "rank0":
            y = fwd_ar(comm, part + (proj_bias if r == 0 else 0))
        else:
            y = fwd_ar(comm, part + proj_bias)

        def backward(dy):
            if hang and r == t - 1 and t > 1:
                comm.recv(0, tag=99)
            dx = ar(comm, m.backward(dy))
            g = m.named_grads()
            return dx, {"qkv.weight": g["qkv.weight"], "qkv.bias": g["qkv.bias"],
                        "proj.weight": g["proj.weight"], "proj.bias": rows2(dy).sum(0)}
        return y, backward
    return tp_attention


ATTENTION_RIGHT = [attention(flat_ring), attention(shaped_ring, bias_where="rank0"),
                   attention(own_ring), attention(reduce_broadcast, fwd_ar=own_ring)]
ATTENTION_WRONG = [
    (attention(heads="contiguous"), "y equals",
     ["qkv split as one contiguous block", "a block of each of q, k and v"]),
    (attention(heads="strided"), 'grads["qkv.weight"] equals', ["your heads are not block r"]),
    (attention(heads="uneven", check_heads=False), "raises ValueError when t does not divide",
     ["ValueError on every rank", "naming"]),
    # only rank 0 checks: the others run on into the AllReduce and wait for it
    (attention(check_heads="rank0"), "raises ValueError when t does not divide",
     ["rank 0 raised ValueError as required; rank 1 did not", "every rank must raise it",
      "went on past the check and failed there with ValueError: cannot reshape",
      "one rank's exception does not stop the others"]),
    (attention(check_heads="rank0", heads="uneven"), "raises ValueError when t does not divide",
     ["rank 0 raised ValueError as required; ranks 1 and 2 did not",
      "wait for ranks that left", "rank 1: waits in recv"]),
    (attention(bias_where="every"), "y equals", ["counts t times"]),
    (attention(no_reduce, fwd_ar=flat_ring), "dx equals", ["no AllReduce in backward"]),
    (attention(fwd_ar=no_reduce), "y equals", ["no AllReduce in forward"]),
    (attention(lambda c, a: flat_ring(c, flat_ring(c, a)), fwd_ar=flat_ring),
     "dx equals", ["all-reduced twice"]),
    (attention(gather_out=True), "forward communication", ["your heads' outputs"]),
    (attention(zeros_for_show, fwd_ar=flat_ring), "backward communication", ["zeros"]),
    (attention(hang=True), "no deadlock", ["waits"]),
]


# Each exercise's right programs pass; each wrong one fails its check, with the words.
LISTS = {"column_parallel_linear": (COLUMN_RIGHT, COLUMN_WRONG),
         "row_parallel_linear": (ROW_RIGHT, ROW_WRONG), "megatron_mlp": (MLP_RIGHT, MLP_WRONG),
         "tp_attention": (ATTENTION_RIGHT, ATTENTION_WRONG)}


@pytest.mark.parametrize("exercise, fn", [(ex, fn) for ex, (right, _) in LISTS.items()
                                          for fn in right])
def test_accepts(exercise, fn):
    report = grade(exercise, fn)
    assert report.passed, report


@pytest.mark.parametrize("exercise, fn, check, words", [(ex, *w) for ex, (_, wrong) in LISTS.items()
                                                        for w in wrong])
def test_rejects(exercise, fn, check, words):
    report = grade(exercise, fn)
    assert not report.passed and check in report.failure.check, report
    for w in words:
        assert w in str(report), (w, str(report))


def test_a_value_error_that_does_not_name_both_numbers_fails():
    def vague(comm, x, *w):
        if w[-1] % comm.world_size:
            raise ValueError("bad split")
        return attention()(comm, x, *w)
    report = grade("tp_attention", vague)
    assert not report.passed, report
    assert report.failure.check == "raises ValueError when t does not divide n_heads", report
    assert "rank 0 raised ValueError ('bad split'), whose message does not name 3 and 4" in str(
        report), report


# ----------------------------------------------------------------------------- shared
@pytest.mark.parametrize("exercise", ["column_parallel_linear", "row_parallel_linear",
                                      "megatron_mlp", "tp_attention"])
def test_stub_is_not_implemented_and_cases_cover_the_brief(exercise):
    def stub(comm, *args):
        raise NotImplementedError("your code here")
    report = grade(exercise, stub)
    assert report.not_implemented and "not implemented yet" in str(report)
    import importlib
    module = importlib.import_module(f"ringlab.grading.{ringlab.grading.GRADERS[exercise]}")
    cases = list(module.cases(np.random.default_rng(0)))
    assert {c.info["t"] for c in cases} == {1, 2, 3, 4}
    assert {c.info["mesh"] for c in cases} >= {None, ((2, 2), ("dp", "tp")),
                                             ((3, 2), ("tp", "dp"))}
    dims = [c.info["dims"] for c in cases]
    assert any(d[0] % c.info["t"] and d[1] % c.info["t"] for d, c in zip(dims, cases))


def test_a_group_of_the_same_ranks_is_the_tensor_parallel_group():
    """The partial dX summed in a group of the program's own making with the tp group's
    ranks (in another order): the messages stay among the tp ranks, so it passes; the
    check is on ranks, not on the group's name."""
    def other_group(comm, a):
        return flat_ring(comm.new_group(list(range(comm.world_size))[::-1], name="mine"), a)
    report = grade("column_parallel_linear", column(other_group))
    assert report.passed, report


def test_grades_isolated_right_and_wrong():
    """`ringlab grade`'s path: one process per rank, the program as cloudpickle bytes."""
    import cloudpickle

    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import Submission, runner
    from ringlab.grading.kit.loop import grade_cases
    from ringlab.grading.trusted import banned_answers
    import importlib
    module = importlib.import_module(f"ringlab.grading.{GRADERS['megatron_mlp']}")
    run = runner(banned=banned_answers("megatron_mlp"))
    good = grade_cases("megatron_mlp", module, Submission(cloudpickle.dumps(mlp(own_ring)), "m"),
                       seed=1, runner=run)
    assert good.passed, good
    bad = grade_cases("megatron_mlp", module, Submission(cloudpickle.dumps(mlp(no_reduce, fwd_ar=flat_ring)), "m"),
                      seed=1, runner=run)
    assert not bad.passed and "no AllReduce in backward" in str(bad), bad
    # The cheat that works in one process (shared globals) cannot share anything here.
    cheat = grade_cases("megatron_mlp", module,
                        Submission(cloudpickle.dumps(mlp(zeros_for_show)), "m"), seed=1, runner=run)
    assert not cheat.passed, cheat
    # A big-endian float64 message: the same first reason as in one process.
    swapped = mlp(lambda c, a: flat_ring(c, np.asarray(a, dtype=">f8")).astype(np.float64))
    apart = grade_cases("megatron_mlp", module, Submission(cloudpickle.dumps(swapped), "m"),
                        seed=1, runner=run)
    here = ringlab.grade("megatron_mlp", swapped, seed=1, log=False)
    assert not apart.passed and not here.passed
    assert apart.failure.check == here.failure.check == "messages carry float64"
    assert "the other byte order" in str(apart) and "the other byte order" in str(here), apart


def test_the_reference_layers_fail_isolated_grading():
    """ringlab.tensor_parallel holds the answers: calling it fails, under any name."""
    import importlib

    import cloudpickle

    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import Submission, runner
    from ringlab.grading.kit.loop import grade_cases
    from ringlab.grading.trusted import banned_answers, reference_in

    def cheat(comm, x, weight, bias):
        tp = importlib.import_module("ringlab." + "tensor_parallel")
        lin = Linear(weight.shape[0], weight.shape[1], np.random.default_rng(0))
        lin.params["weight"][...], lin.params["bias"][...] = weight, bias
        layer = tp.ColumnParallelLinear.from_linear(lin, comm)

        def backward(dy):
            return layer.backward(dy), dict(layer.grads)
        return layer.forward(x), backward
    assert grade("column_parallel_linear", cheat).passed      # in one process: right values
    from ringlab.tensor_parallel import ColumnParallelLinear
    banned = banned_answers("column_parallel_linear")
    assert "answer to column_parallel_linear" in reference_in(
        cloudpickle.dumps(ColumnParallelLinear.forward), banned)
    module = importlib.import_module(f"ringlab.grading.{GRADERS['column_parallel_linear']}")
    report = grade_cases("column_parallel_linear", module, Submission(cloudpickle.dumps(cheat), "c"),
                         seed=1, runner=runner(banned=banned_answers("column_parallel_linear")))
    assert not report.passed and "own answer" in str(report), report
