"""ZeRO-3 / FSDP (ringlab.zero.zero3) against plain data-parallel Adam and one process.

The parameter counts of the units (35, 48 and 14 numbers; 97 in all) do not
divide by most world sizes, so padding is exercised; the batch of 10 does
not divide by 3, 4 or 8, so the shard weighting is too."""

import math

import numpy as np
import pytest

import ringlab
from ringlab import AlphaBeta
from ringlab.nn import GeLU, Linear, Sequential, flatten, mlp_model
from ringlab.zero import ShardedModel, data_parallel_adam, single_process_adam, zero3_adam, zero3_step

SIZES = [4, 7, 6, 2]                     # Linear units of 35, 48 and 14 parameters
NUMELS = [4 * 7 + 7, 7 * 6 + 6, 6 * 2 + 2]
KW = dict(sizes=SIZES, seed=0, lr=0.01, weight_decay=0.01)
DATA = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2, seed=1)
BATCHES = [b for _, b in zip(range(3), DATA.batches(10, seed=2))]   # k = 3 steps
L, K = len(NUMELS), len(BATCHES)
MODES = {"full_shard": dict(prefetch=True),
         "full_shard_no_prefetch": dict(prefetch=False),
         "shard_grad_op": dict(reshard_after_forward=False)}
NET = AlphaBeta(alpha=1e-5, beta=1e-8)
T = 1e-4                                 # seconds per unit forward (backward: 2T)


def padded(n):
    return [math.ceil(m / n) * n for m in NUMELS]


def run(n, mode, **kw):
    return ringlab.run(zero3_adam, [BATCHES] * n, kwargs=dict(KW, **MODES[mode], **kw))


def step_spans(res, rank=0, name=None):
    """The rank's collective spans of the training steps (not the final gather)."""
    return [s for s in res.trace.spans if s.rank == rank
            and not s.path.startswith("full_parameters") and (name is None or s.name == name)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_params_equal_data_parallel_and_one_process(n, mode):
    res = run(n, mode)
    dp = ringlab.run(data_parallel_adam, [BATCHES] * n, kwargs=KW).outputs[0]
    one = single_process_adam(BATCHES, **KW)
    start = single_process_adam([], **KW)[1]
    params = res.outputs[0][1]
    assert all(np.array_equal(out[1], params) for out in res.outputs)   # every rank: the same
    assert params.shape == (sum(NUMELS),) and np.abs(params - start).max() > 1e-2  # it trained
    assert np.allclose(params, dp[1], rtol=0, atol=1e-12)
    assert np.allclose(params, one[1], rtol=0, atol=1e-12)
    assert np.allclose(res.outputs[0][0], dp[0], rtol=0, atol=1e-12)   # rank 0's shard losses


@pytest.mark.parametrize("n", [1, 3, 8])
def test_each_rank_stores_one_padded_shard_of_each_unit(n):
    model = mlp_model(SIZES, np.random.default_rng(0))
    full = flatten(model.named_parameters()).data
    units = [ShardedModel(mlp_model(SIZES, np.random.default_rng(0)), r, n).units
             for r in range(n)]
    assert [(u.numel, u.padded) for u in units[0]] == list(zip(NUMELS, padded(n)))
    # Shard r of each unit, concatenated over r, is the unit's parameters and zeros.
    joined = [np.concatenate([units[r][i].shard for r in range(n)]) for i in range(L)]
    assert all(len(u.shard) == p // n for u, p in zip(units[0], padded(n)))
    assert np.array_equal(np.concatenate([j[:m] for j, m in zip(joined, NUMELS)]), full)
    assert all(not j[m:].any() for j, m in zip(joined, NUMELS))
    # The layers hold no full parameters or gradients: only the shards exist.
    assert all(p is None for u in units[0] for p in [*u.layer.params.values(),
                                                      *u.layer.grads.values()])


def test_after_a_step_only_the_shards_are_held():
    def prog(comm, batch):
        model = ShardedModel(mlp_model(SIZES, np.random.default_rng(0)), comm.rank,
                             comm.world_size)
        opt = ringlab.nn.Adam(model.shards(), 0.01)
        zero3_step(comm, model, opt, *batch, 10)
        return [(u.full, u.full_grad, *u.layer.params.values(), *u.layer.grads.values())
                for u in model.units]
    x, y = BATCHES[0]
    res = ringlab.run(prog, [(x[:5], y[:5]), (x[5:], y[5:])])
    assert all(v is None for out in res.outputs for unit in out for v in unit)


def test_a_model_must_start_with_a_layer_that_has_parameters():
    with pytest.raises(ValueError, match="rank 2: layer 0 .GeLU. has no parameters"):
        ShardedModel(Sequential(GeLU(), Linear(2, 2, np.random.default_rng(0))), 2, 4)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 4, 8])
def test_collectives_per_step_and_bytes_are_exact(n, mode):
    res = run(n, mode)
    gathers_per_step = L if mode == "shard_grad_op" else 2 * L
    for r in range(n):
        assert len(step_spans(res, r, "ring_allgather")) == K * gathers_per_step
        assert len(step_spans(res, r, "ring_reduce_scatter")) == K * L
        assert {s.name for s in step_spans(res, r)} == {"ring_allgather", "ring_reduce_scatter"}
    assert not res.trace.filter(span="ring_allreduce").events
    # 3 Psi per step for FULL_SHARD (2 Psi for SHARD_GRAD_OP), Psi = (N-1)/N padded bytes.
    psi = sum(padded(n)) * (n - 1) // n * 8
    per_step = (3 if gathers_per_step == 2 * L else 2) * psi
    sent = [0] * n
    for e in res.trace:
        if not e.span.startswith("full_parameters"):
            sent[e.src] += e.nbytes
    assert sent == [K * per_step] * n
    assert res.trace.total_bytes == n * (K * per_step + psi)    # + the final gather


def timeline(res, rank=0):
    """Rank's forward/backward computes of each step and its AllGathers and
    ReduceScatters, each list in the order they started."""
    computes = [c for c in res.trace.computes if c.rank == rank]
    order = lambda s: (s.t_start, s.start)   # noqa: E731 - the start time, then the step clock
    gathers = sorted(step_spans(res, rank, "ring_allgather"), key=order)
    scatters = sorted(step_spans(res, rank, "ring_reduce_scatter"), key=order)
    return computes, gathers, scatters


@pytest.mark.parametrize("mode", MODES)
def test_each_unit_is_gathered_before_it_computes_and_scattered_after_backward(mode):
    n = 4
    res = ringlab.run(zero3_adam, [BATCHES] * n, network=NET,
                      kwargs=dict(KW, **MODES[mode], compute_time=T))
    computes, gathers, scatters = timeline(res)
    units = ["0", "2", "4"]                          # the Linear layers' names in the Sequential
    fwd = [("forward", u) for u in units]
    bwd = [("backward", u) for u in reversed(units)]
    assert [(c.label, c.get("layer")) for c in computes] == K * (fwd + bwd)
    assert all(c.duration == pytest.approx(T if c.label == "forward" else 2 * T) for c in computes)
    # Which compute each gather serves: every unit's forward, and (FULL_SHARD) its backward.
    served = [c for c in computes if c.label == "forward" or mode != "shard_grad_op"]
    assert len(gathers) == len(served)
    for i, (g, c) in enumerate(zip(gathers, served)):
        assert g.t_end <= c.start + 1e-15            # the parameters are there in time
        if i > 0:                                    # and not gathered before the compute
            assert g.t_start >= served[i - 1].start - 1e-15   # ahead of them: one unit at most
        if mode == "full_shard_no_prefetch":         # no prefetch: the gather just before
            assert g.stream == 0 and (i == 0 or g.t_start >= served[i - 1].end - 1e-15)
    backwards = [c for c in computes if c.label == "backward"]
    assert len(scatters) == len(backwards) == K * L
    for i, (s, b) in enumerate(zip(scatters, backwards)):
        assert s.t_start >= b.end - 1e-15 and s.stream == 0   # right after its backward
        if (i + 1) % L:                                        # before the next unit's backward
            assert s.t_end <= backwards[i + 1].start + 1e-15


def test_prefetch_overlaps_gathers_with_compute_and_saves_time():
    n = 4
    runs = {mode: ringlab.run(zero3_adam, [BATCHES] * n, network=NET,
                              kwargs=dict(KW, **MODES[mode], compute_time=T))
            for mode in MODES}
    for mode, res in runs.items():
        computes, gathers, _ = timeline(res)
        overlapped = {g for g in gathers for c in computes
                      if g.stream != 0 and g.t_start < c.end and c.start < g.t_end}
        # Prefetched: every gather but the first of forward and the first of backward.
        expected = {"full_shard": 2 * L - 2, "full_shard_no_prefetch": 0, "shard_grad_op": L - 1}
        assert len(overlapped) == K * expected[mode], mode
    # The same numbers, less time: prefetch hides most gathers behind compute.
    a, b = runs["full_shard"], runs["full_shard_no_prefetch"]
    assert np.array_equal(a.outputs[0][1], b.outputs[0][1])
    assert a.time < b.time and runs["shard_grad_op"].time < b.time


def test_zero3_runs_unchanged_on_torch():
    pytest.importorskip("torch")
    inputs = [BATCHES[:2]] * 2
    sim = ringlab.run(zero3_adam, inputs, kwargs=KW)
    real = ringlab.run(zero3_adam, inputs, kwargs=KW, backend="torch")
    assert real.trace == sim.trace, sim.trace.diff(real.trace)
    assert {e.stream for e in real.trace} == {0, 1}          # the prefetches ran as works
    for a, b in zip(sim.outputs, real.outputs):
        assert a[0] == b[0] and np.array_equal(a[1], b[1])


def test_compute_time_per_unit():
    res = ringlab.run(zero3_adam, [BATCHES[:1]] * 2, kwargs=dict(KW, compute_time=[1, 2, 3]))
    assert [(c.label, c.get("layer"), c.duration) for c in res.trace.computes if c.rank == 0] == [
        ("forward", "0", 1), ("forward", "2", 2), ("forward", "4", 3),
        ("backward", "4", 6), ("backward", "2", 4), ("backward", "0", 2)]
    with pytest.raises(ValueError, match="rank 0: compute_time has 2 entries, expected one "
                                         "per unit: 3"):
        ShardedModel(mlp_model(SIZES, np.random.default_rng(0)), 0, 2, compute_time=[1, 2])
