"""Tensor parallelism: every sharded layer equals the unsharded ringlab.nn layer it
was built from (forward and every gradient, float64, relative error <= 1e-10),
and its trace shows Megatron's communication: one AllReduce forward, one backward."""

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allreduce
from ringlab.nn import MLP, CausalSelfAttention, Linear
from ringlab.tensor_parallel import ColumnParallelLinear, ParallelAttention, ParallelMLP, RowParallelLinear

DEGREES = [1, 2, 3, 4]
B, S = 2, 3


def rel_err(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def close(got, want):
    assert got.shape == want.shape
    assert rel_err(got, want) <= 1e-10


def data(*shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def fwd_bwd(layer, x, dy):
    y = layer.forward(x)
    dx = layer.backward(dy)
    return y, dx, {k: v.copy() for k, v in layer.named_grads().items()}


# -- the layers against the unsharded Linear ---------------------------------------

@pytest.mark.parametrize("gather_output", [False, True])
@pytest.mark.parametrize("t", DEGREES)
def test_column_parallel_matches_linear(t, gather_output):
    full = Linear(5, 12, np.random.default_rng(t))
    x, dy = data(B, S, 5, seed=1), data(B, S, 12, seed=2)

    def program(comm, _):
        layer = ColumnParallelLinear.from_linear(full, comm, gather_output=gather_output)
        cols = layer.columns
        return cols, fwd_bwd(layer, x, dy if gather_output else dy[..., cols])

    res = ringlab.run(program, [None] * t)
    y_ref, (dx_ref, grads_ref) = full.forward(x), (full.backward(dy), full.grads)
    for cols, (y, dx, grads) in res.outputs:
        close(y, y_ref if gather_output else y_ref[..., cols])
        close(dx, dx_ref)                                  # the AllReduce of f made it whole
        close(grads["weight"], grads_ref["weight"][:, cols])
        close(grads["bias"], grads_ref["bias"][cols])
    covered = np.concatenate([cols for cols, _ in res.outputs])
    assert np.array_equal(covered, np.arange(12))           # the shards tile the layer


@pytest.mark.parametrize("t", DEGREES)
def test_row_parallel_matches_linear(t):
    full = Linear(12, 5, np.random.default_rng(t))
    x, dy = data(B, S, 12, seed=1), data(B, S, 5, seed=2)

    def program(comm, _):
        layer = RowParallelLinear.from_linear(full, comm)
        return layer.rows, fwd_bwd(layer, x[..., layer.rows], dy)    # X split by columns

    res = ringlab.run(program, [None] * t)
    y_ref, (dx_ref, grads_ref) = full.forward(x), (full.backward(dy), full.grads)
    for rows, (y, dx, grads) in res.outputs:
        close(y, y_ref)                    # the bias counted once, after the AllReduce
        close(dx, dx_ref[..., rows])
        close(grads["weight"], grads_ref["weight"][rows])
        close(grads["bias"], grads_ref["bias"])     # replicated


def test_layers_need_divisible_shapes():
    full = Linear(4, 6, np.random.default_rng(0))
    with pytest.raises(ringlab.RankError) as err:
        ringlab.run(lambda comm, _: ColumnParallelLinear.from_linear(full, comm), [None] * 4)
    assert isinstance(err.value.__cause__, ValueError)
    assert "degree 4 does not divide out_features=6" in str(err.value.__cause__)


# -- the MLP --------------------------------------------------------------------------

def run_mlp(t, mlp, x, dy, backward_twice=False):
    def program(comm, _):
        layer = ParallelMLP.from_mlp(mlp, comm)
        out = fwd_bwd(layer, x, dy)
        if backward_twice:
            layer.backward(dy)
            out = out[:2] + ({k: v.copy() for k, v in layer.named_grads().items()},)
        return layer.fc.columns, out
    return ringlab.run(program, [None] * t)


def gathered(outputs):
    """The full MLP gradients, put together from the ranks' shards."""
    grads = [g for _, (_, _, g) in outputs]
    for g in grads[1:]:                              # proj.bias: the same on every rank
        assert np.array_equal(g["proj.bias"], grads[0]["proj.bias"])
    return {"fc.weight": np.concatenate([g["fc.weight"] for g in grads], axis=1),
            "fc.bias": np.concatenate([g["fc.bias"] for g in grads]),
            "proj.weight": np.concatenate([g["proj.weight"] for g in grads], axis=0),
            "proj.bias": grads[0]["proj.bias"]}


@pytest.mark.parametrize("t", DEGREES)
def test_mlp_matches_unsharded(t):
    mlp = MLP(6, 24, np.random.default_rng(t))
    x, dy = data(B, S, 6, seed=1), data(B, S, 6, seed=2)
    res = run_mlp(t, mlp, x, dy)
    y_ref, dx_ref = mlp.forward(x), mlp.backward(dy)
    for _, (y, dx, _) in res.outputs:
        close(y, y_ref)
        close(dx, dx_ref)
    for name, g in gathered(res.outputs).items():
        close(g, mlp.named_grads()[name])


def test_mlp_gradients_accumulate():
    mlp = MLP(6, 24, np.random.default_rng(0))
    x, dy = data(B, S, 6, seed=1), data(B, S, 6, seed=2)
    once, twice = (gathered(run_mlp(2, mlp, x, dy, k).outputs) for k in (False, True))
    for name in once:
        close(twice[name], 2 * once[name])


@pytest.mark.parametrize("t", [2, 4])
def test_mlp_matches_torch_autograd(t):
    torch = pytest.importorskip("torch")
    mlp = MLP(6, 24, np.random.default_rng(0))
    x, dy = data(B, S, 6, seed=1), data(B, S, 6, seed=2)
    res = run_mlp(t, mlp, x, dy)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in mlp.named_parameters().items()}
    xt = torch.tensor(x, requires_grad=True)
    h = torch.nn.functional.gelu(xt @ p["fc.weight"] + p["fc.bias"], approximate="tanh")
    y = h @ p["proj.weight"] + p["proj.bias"]
    y.backward(torch.tensor(dy))
    for _, (y_tp, dx_tp, _) in res.outputs:
        close(y_tp, y.detach().numpy())
        close(dx_tp, xt.grad.numpy())
    for name, g in gathered(res.outputs).items():
        close(g, p[name].grad.numpy())


# -- attention ------------------------------------------------------------------------

@pytest.mark.parametrize("t", DEGREES)
def test_attention_matches_unsharded(t):
    attn = CausalSelfAttention(24, 12, np.random.default_rng(t))     # 12 heads of 2
    x, dy = data(B, 4, 24, seed=1), data(B, 4, 24, seed=2)

    def program(comm, _):
        layer = ParallelAttention.from_attention(attn, comm)
        return layer.qkv.columns, layer.proj.rows, fwd_bwd(layer, x, dy)

    res = ringlab.run(program, [None] * t)
    y_ref, dx_ref, g_ref = attn.forward(x), attn.backward(dy), attn.named_grads()
    for cols, rows, (y, dx, grads) in res.outputs:
        close(y, y_ref)
        close(dx, dx_ref)
        close(grads["qkv.weight"], g_ref["qkv.weight"][:, cols])
        close(grads["qkv.bias"], g_ref["qkv.bias"][cols])
        close(grads["proj.weight"], g_ref["proj.weight"][rows])
        close(grads["proj.bias"], g_ref["proj.bias"])
    assert sorted(np.concatenate([c for c, _, _ in res.outputs])) == list(range(72))


@pytest.mark.parametrize("heads", [range(0, 2), range(1, 4, 2), range(4)])
def test_head_columns_pick_those_heads_q_k_v_and_proj_rows(heads):
    """``head_columns`` on the unsharded layer: its qkv columns are those heads' q, k
    and v (split_heads' blocks), its rows the heads' rows of proj."""
    from ringlab.tensor_parallel.attention import head_columns
    attn = CausalSelfAttention(8, 4, np.random.default_rng(0))
    x = data(B, S, 8, seed=1)
    cols, rows = head_columns(heads, attn.head_dim, 8)
    qkv = attn.qkv.forward(x)
    q, k, v = attn.split_heads(qkv)
    for part, whole in zip(np.split(qkv[..., cols], 3, axis=-1), (q, k, v)):
        got = part.reshape(B, S, len(heads), attn.head_dim).transpose(0, 2, 1, 3)
        assert np.array_equal(got, whole[:, list(heads)])
    assert rows.tolist() == [j * 2 + i for j in heads for i in range(2)]


def test_attention_heads_must_divide():
    attn = CausalSelfAttention(8, 4, np.random.default_rng(0))
    with pytest.raises(ringlab.RankError) as err:
        ringlab.run(lambda comm, _: ParallelAttention.from_attention(attn, comm), [None] * 3)
    cause = err.value.__cause__
    assert isinstance(cause, ValueError)
    assert "degree 3 does not divide the number of heads 4" in str(cause)


# -- what the trace shows ---------------------------------------------------------------

def check_one_allreduce(trace, span, t, elements):
    """Span ``span`` ran exactly one ring AllReduce of ``elements`` float64 on each of
    the t ranks: 2(t-1) messages per rank (2t(t-1) in all), each a 1/t chunk."""
    events = trace.filter(span=span)
    assert {e.span for e in events} == {f"{span}/ring_allreduce"}
    assert len(events) == 2 * t * (t - 1)
    assert {e.nbytes for e in events} == {elements * 8 // t}
    sent = [0] * trace.world_size
    for e in events:
        sent[e.src] += e.nbytes
    assert sent == [2 * (t - 1) * elements * 8 // t] * t     # 2(t-1)/t of b*s*h*8 bytes
    calls = [s for s in trace.spans if s.path == f"{span}/ring_allreduce"]
    assert sorted(s.rank for s in calls) == list(range(t))  # one call per rank


@pytest.mark.parametrize("t", [2, 3, 4])
def test_mlp_communicates_once_each_way(t):
    h = 6
    mlp = MLP(h, 24, np.random.default_rng(0))
    res = run_mlp(t, mlp, data(B, S, h, seed=1), data(B, S, h, seed=2))
    check_one_allreduce(res.trace, "tp.mlp.forward", t, B * S * h)
    check_one_allreduce(res.trace, "tp.mlp.backward", t, B * S * h)
    assert len(res.trace) == 2 * 2 * t * (t - 1)           # nothing else


@pytest.mark.parametrize("t", [2, 3, 4])
def test_attention_communicates_once_each_way(t):
    h, s = 24, 4
    attn = CausalSelfAttention(h, 12, np.random.default_rng(0))
    x, dy = data(B, s, h, seed=1), data(B, s, h, seed=2)
    res = ringlab.run(lambda comm, _: fwd_bwd(ParallelAttention.from_attention(attn, comm), x, dy),
                      [None] * t)
    check_one_allreduce(res.trace, "tp.attention.forward", t, B * s * h)
    check_one_allreduce(res.trace, "tp.attention.backward", t, B * s * h)
    assert len(res.trace) == 2 * 2 * t * (t - 1)


def test_tp_inside_dp_on_a_mesh():
    """2 data-parallel replicas of an MLP split over 2 ranks: the MLP talks in its
    row's tp group only; the gradient sync after it, in the dp groups."""
    mlp = MLP(6, 24, np.random.default_rng(0))
    xs, dy = [data(B, S, 6, seed=10 + d) for d in range(2)], data(B, S, 6, seed=2)

    def program(comm, _):
        mesh = ringlab.DeviceMesh(comm, (2, 2), ("dp", "tp"))
        layer = ParallelMLP.from_mlp(mlp, mesh.group("tp"))
        y, _, _ = fwd_bwd(layer, xs[mesh.coord("dp")], dy)
        dp = mesh.group("dp")
        with dp.span("dp.grad_sync"):
            for g in layer.named_grads().values():
                ring_allreduce(dp, g, out=g)
        return y

    res = ringlab.run(program, [None] * 4)
    for r, y in enumerate(res.outputs):
        close(y, mlp.forward(xs[r // 2]))          # rank r sits at (dp, tp) = divmod(r, 2)
    tp_events = [e for e in res.trace if e.span.startswith("tp.mlp")]
    assert {e.group for e in tp_events} == {"tp[0]", "tp[1]"}
    for label, ranks in (("tp[0]", {0, 1}), ("tp[1]", {2, 3})):
        mine = [e for e in tp_events if e.group == label]
        assert {e.src for e in mine} == ranks and len(mine) == 2 * 2 * 2 * 1   # 2 AllReduces of 2 ranks
    dp_events = [e for e in res.trace if e.span.startswith("dp.grad_sync")]
    assert {e.group for e in dp_events} == {"dp[0]", "dp[1]"}
    assert len(tp_events) + len(dp_events) == len(res.trace)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_sharded_flops_are_a_t_th_of_the_unsharded(t):
    """Each rank does 1/t of the matmul FLOPs of the MLP and of attention (the
    per-head scores and probs @ v included): tensor parallelism splits compute evenly."""
    mlp, attn = MLP(8, 32, np.random.default_rng(0)), CausalSelfAttention(8, 4, np.random.default_rng(1))
    shape = (B, S, 8)

    def program(comm, _):
        return (ParallelMLP.from_mlp(mlp, comm).flops(shape),
                ParallelAttention.from_attention(attn, comm).flops(shape))

    for f_mlp, f_attn in ringlab.run(program, [None] * t).outputs:
        assert f_mlp * t == mlp.flops(shape) and f_attn * t == attn.flops(shape)
