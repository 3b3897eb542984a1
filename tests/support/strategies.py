"""Small runs of each part's strategy, as the book's chapters make them, for the
player's views (tests/show/test_player_views.py and test_browser.py), and a
learner's own FSDP loop written without any of the library's strategy code."""

import numpy as np

import ringlab
from ringlab.collectives import ring_allgather, ring_reduce_scatter
from ringlab.nn import Adam, mlp_model

BATCH = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2, seed=1)


def zero3(P=4):
    """book/zero/zero3.md's "The trace": one step of the 2-unit model (40 and 18
    parameters) with prefetching. Units padded to 40 and 20 numbers: rank r holds
    10 and 5; a gathered unit is 320 or 160 bytes of float64."""
    from ringlab.data_parallel.sync_sgd import shard
    from ringlab.zero import ShardedModel, zero3_step
    x, y = next(iter(BATCH.batches(max(8, 2 * P), seed=2)))    # the book's 8 rows for P = 4

    def one_step(comm, batch):
        model = ShardedModel(mlp_model([4, 8, 2], np.random.default_rng(0)), comm.rank, comm.world_size)
        opt = Adam(model.shards(), lr=0.01)
        r, p = comm.rank, comm.world_size
        return zero3_step(comm, model, opt, shard(x, r, p), shard(y, r, p), len(x))
    return ringlab.run(one_step, [None] * P).trace


def zero3_timed():
    """zero3_adam for one batch on a network with compute times: every memory event
    at its own simulated second, so memory_by_label(rank, time) can be compared."""
    from ringlab.zero import zero3_adam
    batches = [next(iter(BATCH.batches(8, seed=2)))]
    return ringlab.run(zero3_adam, [batches] * 4, network=ringlab.AlphaBeta(alpha=1e-6, beta=1e-9),
                       kwargs=dict(sizes=[4, 8, 2], seed=0, lr=0.01, compute_time=1e-4)).trace


def gpipe(p=4, m=8):
    """book/pipeline/gpipe.md's run: GPipe, p = 4, m = 8, F 1 s, B 2 s."""
    from ringlab.pipeline import gpipe as schedule, run_pipeline
    model = mlp_model([4] * (p + 1), np.random.default_rng(0))
    rng = np.random.default_rng(1)
    batch = rng.normal(size=(16, 4)), rng.normal(size=(16, 4))
    return run_pipeline(model, batch, schedule(p, m), t_f=1, t_b=2, t_w=0).trace


LAYERS, WIDTH = 6, 64


def ddp(P=4):
    """book/data_parallel/ddp_buckets.md's DDP step, smaller: 6 layers of 64 x 64
    float32 (16 kB of weight, 256 B of bias); a cap of two weights closes a bucket
    at every second layer's weight (bias, weight, bias, weight = 33280 B >= 32768):
    3 buckets, the last two layers in bucket 0."""
    from ringlab.data_parallel.buckets import ddp_sync, training_step
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((16, WIDTH)).astype(np.float32),
             rng.standard_normal((16, WIDTH)).astype(np.float32)) for _ in range(P)]
    cap = 2 * WIDTH * WIDTH * 4
    return ringlab.run(training_step, data, network=ringlab.AlphaBeta(alpha=10e-6, beta=1 / 50e9),
                       kwargs=dict(model_fn=lambda: mlp_model([WIDTH] * (LAYERS + 1), np.random.default_rng(0),
                                                              dtype=np.float32),
                                   sync=ddp_sync, flops_per_second=1e10, cap_bytes=cap,
                                   first_bucket_bytes=cap)).trace


def tp_attention(t=2):
    """book/tensor_parallel/attention.md's run: 4 heads of 2 on t = 2 ranks, forward
    and backward; returns (trace, parts): parts = each rank's heads and qkv columns."""
    from ringlab.nn import CausalSelfAttention
    from ringlab.tensor_parallel import ParallelAttention
    attn = CausalSelfAttention(dim=8, n_heads=4, rng=np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, 3, 8))
    dy = np.random.default_rng(2).standard_normal((2, 3, 8))

    def step(comm, x, dy):
        layer = ParallelAttention.from_attention(attn, comm)
        layer.forward(x)
        layer.backward(dy)
        return {"heads": layer.heads, "qkv columns": layer.qkv.columns}
    res = ringlab.run(step, [x] * t, args=(dy,))
    return res.trace, res.outputs


def learner_fsdp(comm, w, layers=2):
    """A learner's FSDP loop, as one writes it first: each layer's weights are a
    shard w; forward gathers, computes and frees; backward gathers again, makes a
    full gradient, reduce-scatters it and frees both. Regions named with comm.span."""
    full_bytes = w.nbytes * comm.world_size
    for layer in range(layers):
        with comm.span(f"layer{layer}.forward"):
            comm.alloc("params.full", full_bytes)
            ring_allgather(comm, w)
            comm.compute(1e-3, "forward")
            comm.free("params.full", full_bytes)
    grads = []
    for layer in reversed(range(layers)):
        with comm.span(f"layer{layer}.backward"):
            comm.alloc("params.full", full_bytes)
            full = ring_allgather(comm, w)
            comm.compute(2e-3, "backward")
            comm.alloc("grads.full", full_bytes)
            grads.append(ring_reduce_scatter(comm, full))
            comm.free("params.full", full_bytes)
            comm.free("grads.full", full_bytes)
    return grads


def learner(P=4):
    """learner_fsdp on P ranks, shards of 2 float64 each (16 B; a full layer 64 B)."""
    return ringlab.run(learner_fsdp, [np.arange(2.0) + r for r in range(P)]).trace


def learner_gpipe(comm, x, m=4):
    """A learner's GPipe, by hand: every forward, then every backward, each microbatch's
    activation sent on and its gradient sent back (labelled chunk=microbatch), each
    compute told its microbatch (mb=). Forward 1 s, backward 2 s."""
    r, p = comm.rank, comm.world_size
    for mb in range(m):
        h = x if r == 0 else comm.recv(r - 1)
        comm.compute(1.0, "forward", mb=mb)
        if r < p - 1:
            comm.send(h, r + 1, chunk=mb)
    for mb in range(m):
        g = x if r == p - 1 else comm.recv(r + 1)
        comm.compute(2.0, "backward", mb=mb)
        if r > 0:
            comm.send(g, r - 1, chunk=mb)
    return x


def learner_pipeline(p=3):
    return ringlab.run(learner_gpipe, [np.ones(2)] * p).trace
