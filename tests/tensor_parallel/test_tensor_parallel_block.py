"""A whole transformer block with tensor (and sequence) parallelism: it equals the
unsharded ringlab.nn TransformerBlock and torch autograd (forward, dX, every
gradient, float64, relative error <= 1e-10), and its traces show Megatron's
communication: 2 AllReduces forward and 2 backward per layer, or with sequence
parallelism 2 AllGathers + 2 ReduceScatters each way, the same bytes."""

import numpy as np
import pytest

import ringlab
from ringlab.nn import Dropout, TransformerBlock
from ringlab.tensor_parallel import ParallelTransformerBlock, activation_bytes, layernorm_stats_bytes, paper_activation_bytes, tp_bytes_per_layer, tp_dp_sgd_step

B, S, H, HEADS, HIDDEN = 2, 12, 24, 12, 96      # s and the heads divide by t = 1, 2, 3, 4
DEGREES = [1, 2, 3, 4]

# The comparison helpers of the layer tests: one definition of "equal" for all of Part 3.
from test_tensor_parallel import close, data, rel_err  # noqa: E402


def make_block(dropout=0.0, dtype=np.float64, seed=0):
    return TransformerBlock(H, HEADS, HIDDEN, np.random.default_rng(seed), dtype=dtype,
                            dropout=dropout, seed=7)


def my_tokens(comm, x, sequence_parallel):
    """The rank's input: all of x, or its s/t tokens with sequence parallelism."""
    if not sequence_parallel:
        return x
    n = x.shape[1] // comm.world_size
    return x[:, comm.rank * n:(comm.rank + 1) * n]


def run_block(t, block, x, dy, sequence_parallel=False, sync=True, store_input_shard=True):
    """Forward and backward of the block split over t ranks: per rank (y, dx, grads, index)."""
    def program(comm, _):
        layer = ParallelTransformerBlock.from_block(block, comm, sequence_parallel,
                                                    store_input_shard=store_input_shard)
        y = layer.forward(my_tokens(comm, x, sequence_parallel))
        dx = layer.backward(my_tokens(comm, dy, sequence_parallel))
        if sync:
            layer.sync_sequence_parallel_grads()
        return y, dx, {k: v.copy() for k, v in layer.named_grads().items()}, layer.shard_index()
    return ringlab.run(program, [None] * t)


def whole(outputs, i, sequence_parallel):
    """Output i (y or dx) of the whole batch: the ranks' tokens put together."""
    if sequence_parallel:
        return np.concatenate([o[i] for o in outputs], axis=1)
    for o in outputs[1:]:
        assert np.array_equal(o[i], outputs[0][i])      # replicated: the same on every rank
    return outputs[0][i]


def check_against(outputs, y_ref, dx_ref, grads_ref, sequence_parallel):
    close(whole(outputs, 0, sequence_parallel), y_ref)
    close(whole(outputs, 1, sequence_parallel), dx_ref)
    for _, _, grads, index in outputs:
        assert list(grads) == list(grads_ref)             # the unsharded block's names
        for name, g in grads.items():
            close(g, grads_ref[name][index[name]])


# -- equal to the unsharded block --------------------------------------------------------

@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("t", DEGREES)
def test_block_matches_unsharded(t, sequence_parallel, dropout):
    block = make_block(dropout, seed=t)
    x, dy = data(B, S, H, seed=1), data(B, S, H, seed=2)
    res = run_block(t, block, x, dy, sequence_parallel)   # built first: the same masks next
    y_ref, dx_ref = block.forward(x), block.backward(dy)
    check_against(res.outputs, y_ref, dx_ref, block.named_grads(), sequence_parallel)


def test_block_without_gathered_input_storage_matches_too():
    block = make_block(0.2)
    x, dy = data(B, S, H, seed=1), data(B, S, H, seed=2)
    res = run_block(3, block, x, dy, True, store_input_shard=False)
    check_against(res.outputs, block.forward(x), block.backward(dy), block.named_grads(), True)


def torch_block(torch, params, x, masks, p):
    """The pre-LN block written with torch ops, dropout masks given."""
    F = torch.nn.functional
    b, s, h = x.shape
    hd = h // HEADS

    def ln(z, k):
        return F.layer_norm(z, (h,), params[f"{k}.weight"], params[f"{k}.bias"], eps=1e-5)

    def drop(z, mask):
        return z if mask is None else z * torch.tensor(mask) / (1 - p)

    qkv = ln(x, "ln1") @ params["attn.qkv.weight"] + params["attn.qkv.bias"]
    q, k, v = qkv.reshape(b, s, 3, HEADS, hd).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    future = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    out = (drop(probs, masks[0]) @ v).transpose(1, 2).reshape(b, s, h)
    x = x + drop(out @ params["attn.proj.weight"] + params["attn.proj.bias"], masks[1])
    m = F.gelu(ln(x, "ln2") @ params["mlp.fc.weight"] + params["mlp.fc.bias"], approximate="tanh")
    return x + drop(m @ params["mlp.proj.weight"] + params["mlp.proj.bias"], masks[2])


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("t", [2, 4])
def test_block_matches_torch_autograd(t, sequence_parallel):
    torch = pytest.importorskip("torch")
    p = 0.2
    block = make_block(p)
    x, dy = data(B, S, H, seed=1), data(B, S, H, seed=2)
    res = run_block(t, block, x, dy, sequence_parallel)
    block.forward(x)                         # only to read the masks torch must use
    masks = [block.attn.drop.mask, block.drop1.mask, block.drop2.mask]
    params = {k: torch.tensor(v, requires_grad=True) for k, v in block.named_parameters().items()}
    xt = torch.tensor(x, requires_grad=True)
    y = torch_block(torch, params, xt, masks, p)
    y.backward(torch.tensor(dy))
    check_against(res.outputs, y.detach().numpy(), xt.grad.numpy(),
                  {k: v.grad.numpy() for k, v in params.items()}, sequence_parallel)


# -- dropout -----------------------------------------------------------------------------

def test_dropout_is_deterministic_and_stores_a_bool_mask():
    x = np.ones((4, 1000))
    a, b = Dropout(0.25, seed=3), Dropout(0.25, seed=3)
    ya, yb = a.forward(x), b.forward(x)
    assert np.array_equal(ya, yb) and a.mask.dtype == np.bool_ and a.mask.nbytes == x.size
    assert set(np.unique(ya)) == {0.0, 1 / 0.75}           # inverted dropout: kept / (1 - p)
    assert abs(a.mask.mean() - 0.75) < 0.02
    assert np.array_equal(a.backward(x), ya)              # the same elements pass back
    assert not np.array_equal(a.forward(x), ya)           # the next call draws a new mask
    off = Dropout(0.0, seed=3)
    assert off.forward(x) is x and off.mask is None        # p = 0: identity, nothing stored


def test_dropout_is_off_by_default():
    block, x = make_block(), data(B, S, H, seed=1)
    y = block.forward(x)
    assert block.attn.drop.mask is None and block.drop1.mask is None
    assert block.attn.dropped is block.attn.probs
    ln1, ln2 = block.ln1.forward, block.ln2.forward
    h = x + block.attn.forward(ln1(x))
    assert np.array_equal(y, h + block.mlp.forward(ln2(h)))


# -- what the traces show ----------------------------------------------------------------

COLLECTIVES = ("ring_allreduce", "ring_allgather", "ring_reduce_scatter")


def calls(trace, phase):
    """The collective calls inside ``tp.block.<phase>``, in order: (path, bytes per rank)."""
    rows = [c for c in trace.collectives() if c["span"].startswith(f"tp.block.{phase}/")
            and c["span"].rsplit("/", 1)[-1] in COLLECTIVES]
    return [(c["span"].split("/", 1)[1], c["bytes"] // len(c["ranks"])) for c in rows]


def sent_per_rank(trace, span):
    sub = trace.filter(span=span)
    return [sum(e.nbytes for e in sub if e.src == r) for r in range(trace.world_size)]


@pytest.mark.parametrize("t", [2, 3, 4])
def test_block_has_two_allreduces_each_way(t):
    """Shoeybi et al. 2019 (Fig. 4), Narayanan et al. 2021 (3.3): 2 AllReduces of b*s*h
    forward and 2 backward per layer; each rank sends 2(t-1)/t of each: 8bsh(t-1)/t."""
    res = run_block(t, make_block(0.2), data(B, S, H, seed=1), data(B, S, H, seed=2))
    ring = 2 * (t - 1) * B * S * H * 8 // t              # one ring AllReduce, float64
    assert calls(res.trace, "forward") == [
        ("tp.attention.forward/ring_allreduce", ring), ("tp.mlp.forward/ring_allreduce", ring)]
    assert calls(res.trace, "backward") == [
        ("tp.mlp.backward/ring_allreduce", ring), ("tp.attention.backward/ring_allreduce", ring)]
    assert len(res.trace) == 4 * t * 2 * (t - 1)           # nothing else: 4 rings of 2t(t-1)
    per_rank = tp_bytes_per_layer(B, S, H, t, itemsize=8)
    assert per_rank == 8 * B * S * H * (t - 1) / t * 8     # Narayanan et al.'s 8bsh(t-1)/t
    assert res.trace.bytes_sent() == [per_rank] * t
    assert sent_per_rank(res.trace, "tp.block.forward") == [per_rank // 2] * t


def sp_calls(t, block_size, regather):
    """The collective calls sequence parallelism makes, in order, and their bytes per rank."""
    ring = (t - 1) * block_size // t                      # one AllGather or ReduceScatter
    fwd = [("tp.attention.forward/ring_allgather", ring),
           ("tp.attention.forward/ring_reduce_scatter", ring),
           ("tp.mlp.forward/ring_allgather", ring),
           ("tp.mlp.forward/ring_reduce_scatter", ring)]
    bwd = []
    for layer in ("mlp", "attention"):
        bwd.append((f"tp.{layer}.backward/ring_allgather", ring))          # g_bar's backward
        if regather:
            bwd.append((f"tp.{layer}.backward/regather_input/ring_allgather", ring))
        bwd.append((f"tp.{layer}.backward/ring_reduce_scatter", ring))     # g's backward
    return fwd, bwd


@pytest.mark.parametrize("t", [2, 3, 4])
def test_sequence_parallel_sends_what_the_allreduce_form_sends(t):
    """Keeping the gathered inputs: 2 AllGathers + 2 ReduceScatters forward, 2 ReduceScatters
    + 2 AllGathers backward, and every rank sends exactly the AllReduce form's bytes,
    forward and backward (RS + AG = AR)."""
    block, x, dy = make_block(0.2), data(B, S, H, seed=1), data(B, S, H, seed=2)
    ar = run_block(t, block, x, dy)
    sp = run_block(t, block, x, dy, sequence_parallel=True, sync=False, store_input_shard=False)
    fwd, bwd = sp_calls(t, B * S * H * 8, regather=False)
    assert calls(sp.trace, "forward") == fwd and calls(sp.trace, "backward") == bwd
    for phase in ("tp.block.forward", "tp.block.backward"):
        assert sent_per_rank(sp.trace, phase) == sent_per_rank(ar.trace, phase)
    assert sp.trace.bytes_sent() == ar.trace.bytes_sent() \
        == [tp_bytes_per_layer(B, S, H, t, 8)] * t
    assert sp.trace.steps == ar.trace.steps               # a ring RS + AG: the AR's 2(t-1) steps


@pytest.mark.parametrize("t", [2, 3, 4])
def test_sequence_parallel_storing_input_shards_regathers_in_backward(t):
    """Megatron's default (and ours): keep only my tokens of the QKV and fc inputs, AllGather
    them again in backward. Forward sends the AllReduce form's bytes; backward 3/2 of
    them (6 AllGather/ReduceScatter halves instead of 4); the layer 5/4."""
    block, x, dy = make_block(0.2), data(B, S, H, seed=1), data(B, S, H, seed=2)
    ar = run_block(t, block, x, dy)
    sp = run_block(t, block, x, dy, sequence_parallel=True, sync=False)
    fwd, bwd = sp_calls(t, B * S * H * 8, regather=True)
    assert calls(sp.trace, "forward") == fwd and calls(sp.trace, "backward") == bwd
    ar_f, ar_b = (sent_per_rank(ar.trace, p) for p in ("tp.block.forward", "tp.block.backward"))
    assert sent_per_rank(sp.trace, "tp.block.forward") == ar_f
    assert sent_per_rank(sp.trace, "tp.block.backward") == [3 * b // 2 for b in ar_b]
    assert sp.trace.bytes_sent() == [5 * tp_bytes_per_layer(B, S, H, t, 8) // 4] * t


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_layernorm_grads_are_partial_until_synced(t):
    block, x, dy = make_block(0.2), data(B, S, H, seed=1), data(B, S, H, seed=2)
    raw = run_block(t, block, x, dy, sequence_parallel=True, sync=False)
    synced = run_block(t, block, x, dy, sequence_parallel=True, sync=True)
    block.forward(x), block.backward(dy)
    ref = block.named_grads()
    ln = [k for k in ref if k.startswith(("ln1.", "ln2."))]
    for name in ln:
        parts = [grads[name] for _, _, grads, _ in raw.outputs]
        for part in parts:
            assert rel_err(part, ref[name]) > 0.01          # my s/t tokens' share only: wrong
        close(sum(parts), ref[name])                        # the partial sums add up
        for _, _, grads, _ in synced.outputs:
            close(grads[name], ref[name])
    for _, _, grads, index in raw.outputs:                  # everything else needs no sync
        for name in set(ref) - set(ln):
            close(grads[name], ref[name][index[name]])
    sync = [c for c in synced.trace.collectives() if c["span"].startswith("tp.sp.grad_sync/")]
    assert [c["span"] for c in sync] == ["tp.sp.grad_sync/ring_allreduce"]
    assert sync[0]["bytes"] == t * 2 * (t - 1) * (4 * H * 8) // t     # one ring AR of 4h
    assert len(synced.trace) - len(raw.trace) == 2 * t * (t - 1)


# -- activation memory: measured against Korthikanti et al. (2022) ------------------------

def held_after_forward(t, sequence_parallel, store_input_shard=True):
    """Bytes each rank's block holds for backward after a float16 forward, dropout on."""
    block = make_block(0.1, dtype=np.float16)
    x = data(B, S, H, seed=1).astype(np.float16)

    def program(comm, _):
        layer = ParallelTransformerBlock.from_block(block, comm, sequence_parallel,
                                                    store_input_shard=store_input_shard)
        y = layer.forward(my_tokens(comm, x, sequence_parallel))
        assert y.dtype == np.float16
        return activation_bytes(layer)
    if t == 1 and not sequence_parallel:
        block.forward(x)
        return [activation_bytes(block)]                   # the unsharded block itself
    return ringlab.run(program, [None] * t).outputs


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("t", DEGREES)
def test_activation_memory_is_the_papers_formula(t, sequence_parallel):
    """Exactly the paper's bytes plus LayerNorm's rstd (2 LayerNorms x one float16 per
    token: 4bs bytes, 4bs/t with sequence parallelism), which the paper neglects:
    34sbh + 5as^2b (t = 1); sbh(10 + 24/t + 5as/(ht)) (TP); (sbh/t)(34 + 5as/h) (TP+SP)."""
    s, b, h, a = S, B, H, HEADS
    sbh = s * b * h
    if sequence_parallel:
        paper = sbh * (34 * h + 5 * a * s) // (t * h)
    else:
        paper = sbh * (10 * t * h + 24 * h + 5 * a * s) // (t * h)
    assert paper == paper_activation_bytes(s, b, h, a, t, sequence_parallel)
    ln_stats = 2 * 2 * (b * s // t if sequence_parallel else b * s)
    assert layernorm_stats_bytes(s, b, t, sequence_parallel) == ln_stats
    assert held_after_forward(t, sequence_parallel) == [paper + ln_stats] * t


def test_activation_memory_numbers():
    """The numbers (bytes per rank, s=12, b=2, h=24, a=12, float16): what the book quotes."""
    assert held_after_forward(1, False) == [36864 + 96]
    assert held_after_forward(4, False)[0] == 13536 + 96
    assert held_after_forward(4, True)[0] == 9216 + 24          # = (36864 + 96) / 4


@pytest.mark.parametrize("t", [2, 3])
def test_keeping_gathered_inputs_costs_two_whole_inputs(t):
    """store_input_shard=False keeps the QKV and fc inputs whole: 2 * 2sbh(t-1)/t bytes more
    than the formula (and saves the 2 AllGathers in backward)."""
    kept = held_after_forward(t, True, store_input_shard=False)
    extra = 2 * 2 * S * B * H * (t - 1) // t
    assert kept == [paper_activation_bytes(S, B, H, HEADS, t, True)
                    + layernorm_stats_bytes(S, B, t, True) + extra] * t


# -- TP x DP on a 2-D mesh ---------------------------------------------------------------

@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("shape", [(2, 2), (2, 3)])
def test_tp_dp_step_equals_single_process_sgd(shape, sequence_parallel):
    """Dropout off: a dp row drawing masks for its b/dp sequences would draw other numbers
    than one process drawing them for all b."""
    dp, tp = shape
    block, lr = make_block(), 0.1
    x, dy = data(2 * B, S, H, seed=1), data(2 * B, S, H, seed=2)    # dp = 2 rows of B
    res = ringlab.run(tp_dp_sgd_step, [(block, x, dy, shape, lr, sequence_parallel)] * (dp * tp))
    block.forward(x), block.backward(dy)                           # the whole batch, one process
    want = {k: p - lr * block.named_grads()[k] for k, p in block.named_parameters().items()}
    for params, index in res.outputs:
        for name, p in params.items():
            close(p, want[name][index[name]])
    # Each collective in its own group: the block's in its row, the gradient sync in its column.
    groups = {"tp": [f"tp[{r // tp}]" for r in range(dp * tp)],
              "dp": [f"dp[{r % tp}]" for r in range(dp * tp)]}
    for e in res.trace:
        axis = "dp" if e.span.startswith("dp.grad_sync") else "tp"
        assert e.span.startswith(("tp.block.", "tp.sp.grad_sync", "dp.grad_sync"))
        assert e.group == groups[axis][e.src] == groups[axis][e.dst]
    assert res.trace.groups == [f"tp[{k}]" for k in range(dp)] + [f"dp[{j}]" for j in range(tp)]
    n_params = len(block.named_parameters())
    dp_sync = [c for c in res.trace.collectives() if c["span"] == "dp.grad_sync/ring_allreduce"]
    assert len(dp_sync) == n_params * tp                   # every shard, in each of tp columns
    sp_sync = [c for c in res.trace.collectives() if c["span"] == "tp.sp.grad_sync/ring_allreduce"]
    assert len(sp_sync) == (dp if sequence_parallel else 0)
