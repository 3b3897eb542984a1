"""ZeRO-1 and ZeRO-2 train exactly like data-parallel Adam, with their own collectives.

The references are independent of the code under test: plain data parallelism
(a full replica and one AllReduce per step) and one process on whole batches.
The model has 59 parameters (4*7 + 7 + 7*3 + 3), a prime, so it divides by
none of the world sizes above 1 and the padding is always exercised."""

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allreduce
from ringlab.data_parallel.sync_sgd import local_gradient, shard
from ringlab.nn import Adam, flatten, mlp_model
from ringlab.zero import BucketShards, data_parallel_adam, single_process_adam, zero1_adam, zero1_step, zero2_adam
from ringlab.zero.accounting import GB, elements_sent_per_device, memory_per_device, table
from ringlab.zero.sharding import load_flat, master_shard, padded_size, shard_range

SIZES = [4, 7, 3]
NUMEL = 4 * 7 + 7 + 7 * 3 + 3                  # 59
KW = dict(sizes=SIZES, seed=0, lr=0.01, betas=(0.8, 0.99), weight_decay=0.01)
DATA = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=3, seed=1)
BATCHES = [b for _, b in zip(range(3), DATA.batches(10, seed=2))]   # 10: unequal shards
CAP = 100            # bytes: two buckets, [2.bias, 2.weight] (24 numbers) and [0.*] (35)
STAGES = {"zero1": (zero1_adam, {}), "zero2": (zero2_adam, dict(cap_bytes=CAP))}


def run(stage, world_size, batches=BATCHES, backend="sim", **kw):
    fn, extra = STAGES[stage]
    return ringlab.run(fn, [batches] * world_size, kwargs=dict(KW, **extra, **kw),
                       backend=backend)


def padded_numel(stage, world_size):
    """What one step's ReduceScatters (and AllGathers) move: the padded buffer(s)."""
    if stage == "zero1":
        return padded_size(NUMEL, world_size)
    params = mlp_model(SIZES, np.random.default_rng(0)).named_parameters()
    return BucketShards(params, world_size, cap_bytes=CAP).padded_numel


def test_the_model_has_59_parameters():
    assert flatten(mlp_model(SIZES, np.random.default_rng(0)).named_parameters()).numel == NUMEL
    assert all(NUMEL % n for n in (2, 3, 4, 8))


# -- sharding ---------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_shards_cover_the_padded_buffer(world_size):
    params = mlp_model(SIZES, np.random.default_rng(0)).named_parameters()
    flat = flatten(params).data
    ranges = [shard_range(NUMEL, r, world_size) for r in range(world_size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == padded_size(NUMEL, world_size)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert padded_size(NUMEL, world_size) - NUMEL < world_size
    whole = np.concatenate([master_shard(params, r, world_size) for r in range(world_size)])
    assert np.array_equal(whole[:NUMEL], flat) and not whole[NUMEL:].any()   # zeros at the end
    # ZeRO-2's pieces, bucket by bucket, put back together are the parameters too.
    layout = BucketShards(params, world_size, cap_bytes=CAP)
    pieces = [layout.pieces(layout.master_shard(params, r)) for r in range(world_size)]
    for b, names in enumerate(layout.names):
        bucket = np.concatenate([pieces[r][b] for r in range(world_size)])
        assert np.array_equal(bucket[:layout.numels[b]],
                              np.concatenate([params[n].ravel() for n in names]))
        assert len(bucket) == layout.padded[b] and not bucket[layout.numels[b]:].any()


def test_load_flat_ignores_padding_and_rejects_short_vectors():
    params = {"w": np.zeros((2, 2)), "b": np.zeros(1)}
    load_flat(params, np.arange(6.0))
    assert params["w"].tolist() == [[0, 1], [2, 3]] and params["b"].tolist() == [4]
    with pytest.raises(ValueError, match="4 numbers, the parameters need 5"):
        load_flat(params, np.arange(4.0))


# -- the same training as data parallelism ------------------------------------------------

@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_zero_equals_data_parallel_and_one_process(stage, world_size):
    res = run(stage, world_size)
    dp = ringlab.run(data_parallel_adam, [BATCHES] * world_size, kwargs=KW).outputs
    one = single_process_adam(BATCHES, **KW)
    start = single_process_adam([], **KW)[1]
    params = res.outputs[0][1]
    assert all(np.array_equal(out[1], params) for out in res.outputs)   # replicas agree
    assert np.abs(params - start).max() > 0.01                           # training moved them
    assert np.allclose(params, dp[0][1], rtol=0, atol=1e-12)
    assert np.allclose(params, one[1], rtol=0, atol=1e-12)
    for ours, theirs in zip(res.outputs, dp):                            # the same losses
        assert np.allclose(ours[0], theirs[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_collectives_and_bytes(stage, world_size):
    trace = run(stage, world_size).trace
    names = {s.name for s in trace.spans}
    assert names == {"ring_reduce_scatter", "ring_allgather"}
    assert not any("allreduce" in s.path for s in trace.spans)
    assert not any("allreduce" in e.span for e in trace)
    # Per rank and step: a ReduceScatter and an AllGather, each (N-1)/N of the
    # padded buffer, 8 bytes a number.
    n, k = world_size, len(BATCHES)
    want = 2 * padded_numel(stage, n) * (n - 1) // n * 8
    assert trace.bytes_sent() == [k * want] * n
    assert want == elements_sent_per_device(stage, padded_numel(stage, n), n) * 8
    calls = [c["span"] for c in trace.collectives()]
    buckets = 1 if stage == "zero1" else 2
    assert calls.count("ring_reduce_scatter") == calls.count("ring_allgather") == k * buckets


def test_zero2_reduce_scatters_on_the_comm_stream_during_backward():
    data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=16, out=4, seed=1)
    batches = [b for _, b in zip(range(2), data.batches(32, seed=2))]
    kw = dict(sizes=[16, 32, 32, 32, 4], seed=0, lr=0.01, cap_bytes=2048,
              flops_per_second=1e9)
    res = ringlab.run(zero2_adam, [batches] * 4, kwargs=kw,
                      network=ringlab.AlphaBeta(alpha=1e-6, beta=1e-9))
    trace = res.trace
    rs = [s for s in trace.spans if s.name == "ring_reduce_scatter"]
    assert len({s.path for s in rs}) == 1 and all(s.stream != 0 for s in rs)
    assert all(s.stream == 0 for s in trace.spans if s.name == "ring_allgather")
    for rank in range(4):
        backward = [c for c in trace.computes if c.rank == rank and c.label == "backward"]
        first_step_end = max(c.end for c in backward[:4])        # 4 Linear layers a step
        first_rs = min(s.t_start for s in rs if s.rank == rank)
        assert first_rs < first_step_end         # overlap: started before backward ended
    # And the arithmetic is still data parallelism's.
    dp = ringlab.run(data_parallel_adam, [batches] * 4,
                     kwargs=dict(sizes=kw["sizes"], seed=0, lr=0.01)).outputs[0][1]
    assert np.allclose(res.outputs[0][1], dp, rtol=0, atol=1e-12)


def test_a_shard_for_another_world_size_is_a_clear_error():
    def program(comm, batch):
        model = mlp_model(SIZES, np.random.default_rng(0))
        opt = Adam(master_shard(model.named_parameters(), comm.rank, 3), lr=0.01)
        x, y = batch
        return zero1_step(comm, model, opt, shard(x, comm.rank, 2), shard(y, comm.rank, 2),
                          len(x))
    with pytest.raises(Exception, match=r"rank \d, step \d+: the optimizer holds 20 master"):
        ringlab.run(program, [BATCHES[0]] * 2)


# -- mixed precision ------------------------------------------------------------------------

def data_parallel_mixed_adam(comm, batches, *, sizes, seed, lr, **adam):
    """The reference in the paper's mixed precision: fp16 model, gradients and
    AllReduce; fp32 master weights and Adam on every rank (no sharding)."""
    model = mlp_model(sizes, np.random.default_rng(seed), dtype=np.float16)
    master = flatten(model.named_parameters()).data.astype(np.float32)
    opt = Adam(master, lr, **adam)
    for x, y in batches:
        p, r = comm.world_size, comm.rank
        xs, ys = shard(x, r, p).astype(np.float16), shard(y, r, p).astype(np.float16)
        local_gradient(model, xs, ys)
        g = flatten(model.named_grads()).data
        g *= len(xs) / len(x)
        ring_allreduce(comm, g, out=g)
        opt.step(g.astype(np.float32))
        offset = 0
        for w in model.named_parameters().values():
            w[...] = master[offset:offset + w.size].reshape(w.shape)
            offset += w.size
    return flatten(model.named_parameters()).data


@pytest.mark.parametrize("stage", list(STAGES))
def test_mixed_precision_matches_data_parallel_to_float16(stage):
    n = 3
    res = run(stage, n, dtype=np.float16, master_dtype=np.float32)
    params = res.outputs[0][1]
    ref = ringlab.run(data_parallel_mixed_adam, [BATCHES] * n, kwargs=KW).outputs[0]
    exact = single_process_adam(BATCHES, **KW)[1]
    assert params.dtype == np.float16
    # Two float16 ulps (eps = 2**-10): the summation order of the float16 sums differs.
    assert np.allclose(params, ref, rtol=2**-9, atol=2**-14)
    assert np.abs(params - exact).max() < 1e-2                    # and near the float64 run
    # The messages are float16: 2 bytes a number, half of the float64 run's.
    want = 2 * padded_numel(stage, n) * (n - 1) // n * 2 * len(BATCHES)
    assert res.trace.bytes_sent() == [want] * n


# -- the paper's numbers ------------------------------------------------------------------

def test_figure_1_memory_per_device():
    rows = table(psi=7.5e9, n_d=64)
    assert [name for name, _ in rows] == ["DP", "P_os", "P_os+g", "P_os+g+p"]
    assert [b for _, b in rows] == [120e9, 31.40625e9, 16.640625e9, 1.875e9]
    assert [round(b / GB, 1) for _, b in rows] == [120.0, 31.4, 16.6, 1.9]
    # GiB would not reproduce the figure: 120e9 bytes are 111.8 GiB.
    assert round(rows[0][1] / 2**30, 1) == 111.8
    # Closed forms, stage by stage (K = 12, 2-byte parameters and gradients).
    psi, n = 1000.0, 10
    assert memory_per_device("dp", psi, n) == 16 * psi
    assert memory_per_device("zero1", psi, n) == 4 * psi + 12 * psi / n
    assert memory_per_device("zero2", psi, n) == 2 * psi + 14 * psi / n
    assert memory_per_device("zero3", psi, n) == 16 * psi / n


def test_communication_volume():
    assert [elements_sent_per_device(s, 100, 4, exact=False)
            for s in ("dp", "zero1", "zero2", "zero3")] == [200, 200, 200, 300]
    assert elements_sent_per_device("zero2", 100, 4) == 150.0     # 2 x (N-1)/N x Ψ
    with pytest.raises(ValueError, match="stage must be one of"):
        memory_per_device("zero4", 1, 1)


# -- real processes -----------------------------------------------------------------------

@pytest.mark.parametrize("stage", list(STAGES))
def test_zero_runs_unchanged_on_torch(stage):
    pytest.importorskip("torch")
    sim, real = run(stage, 2, BATCHES[:2]), run(stage, 2, BATCHES[:2], backend="torch")
    assert real.trace == sim.trace
    for a, b in zip(sim.outputs, real.outputs):
        assert a[0] == b[0] and np.array_equal(a[1], b[1])


def test_torch_zero_redundancy_optimizer_matches_zero1_on_gloo_processes():
    """2 gloo processes of the torch backend (torch_ddp.py says why those)."""
    pytest.importorskip("torch")
    from ringlab.zero.torch_zero import train_zero
    batches = [b for _, b in zip(range(10), DATA.batches(8, seed=3))]
    kw = dict(sizes=SIZES, seed=0, lr=0.01)
    ours = ringlab.run(zero1_adam, [batches] * 2, kwargs=kw).outputs[0][1]
    theirs = train_zero(2, batches, **kw, timeout=60.0)
    start = single_process_adam([], **kw)[1]
    assert np.abs(ours - start).max() > 0.05                 # training moved the parameters
    assert np.allclose(theirs, ours, rtol=1e-5, atol=1e-6)   # float32 rounding (5.6e-8 seen)
