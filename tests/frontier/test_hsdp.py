"""Hybrid sharding (ringlab.frontier.hsdp) against data-parallel Adam over all ranks and
against PyTorch's FSDP2 fully_shard on a 2-D mesh; which collective runs in which
group; bytes inside and across nodes from the trace and in closed form, against
ZeRO-3 over all ranks; one unit gathered at a time."""

import numpy as np
import pytest

import ringlab
from ringlab.frontier.hsdp import hsdp_adam, hsdp_bytes, hsdp_step, zero3_cross_node_bytes
from ringlab.frontier.nodes import cross_node_bytes
from ringlab.nn import Adam, mlp_model
from ringlab.zero import ShardedModel, data_parallel_adam, single_process_adam, zero3_adam

SIZES = [4, 7, 6, 2]                        # Linear units of 35, 48 and 14 parameters
NUMELS = [35, 48, 14]
KW = dict(sizes=SIZES, seed=0, lr=0.01, weight_decay=0.01)
DATA = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2, seed=1)
BATCHES = [b for _, b in zip(range(3), DATA.batches(12, seed=2))]
STEPS = len(BATCHES)


def steps_only(trace):
    """The training steps' messages, without the final gather of the parameters."""
    return ringlab.Trace([e for e in trace if not e.span.startswith("full_parameters")],
                         trace.world_size)


@pytest.mark.parametrize("shape", [(1, 4), (2, 2), (4, 1), (2, 3), (3, 2), (2, 4)])
def test_hsdp_equals_data_parallel_adam(shape):
    n = shape[0] * shape[1]
    res = ringlab.run(hsdp_adam, [BATCHES] * n, kwargs=dict(KW, shape=shape))
    dp = ringlab.run(data_parallel_adam, [BATCHES] * n, kwargs=KW).outputs[0]
    one = single_process_adam(BATCHES, **KW)
    start = single_process_adam([], **KW)[1]
    params = res.outputs[0][1]
    assert all(np.array_equal(out[1], params) for out in res.outputs)
    assert np.abs(params - start).max() > 1e-2
    np.testing.assert_allclose(params, dp[1], rtol=0, atol=1e-10)
    np.testing.assert_allclose(params, one[1], rtol=0, atol=1e-10)
    for r in range(n):                                  # every rank's losses on its samples
        np.testing.assert_allclose(res.outputs[r][0],
                                   ringlab.run(data_parallel_adam, [BATCHES] * n,
                                               kwargs=KW).outputs[r][0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("R,S", [(2, 2), (2, 3), (3, 2), (2, 4)])
def test_collectives_in_their_groups_and_bytes_against_closed_forms(R, S):
    res = ringlab.run(hsdp_adam, [BATCHES] * (R * S), kwargs=dict(KW, shape=(R, S)))
    L = len(NUMELS)
    spans = [s for s in res.trace.spans if not s.path.startswith("full_parameters")]
    for rank in range(R * S):
        mine = [(s.name, str(s.group).split("[")[0]) for s in spans if s.rank == rank]
        assert mine.count(("ring_allgather", "shard")) == STEPS * 2 * L
        assert mine.count(("ring_reduce_scatter", "shard")) == STEPS * L
        assert mine.count(("ring_allreduce", "replicate")) == STEPS * L
        assert len(mine) == STEPS * 4 * L                # and nothing else, in no other group
    # Every backward unit: ReduceScatter in the shard group, then its AllReduce across.
    order = [s.name for s in sorted((s for s in spans if s.rank == 0 and s.stream == 0),
                                    key=lambda s: s.start)]
    rs = [i for i, name in enumerate(order) if name == "ring_reduce_scatter"]
    assert all(order[i + 1] == "ring_allreduce" for i in rs)
    want = hsdp_bytes(NUMELS, R, S)
    steps = steps_only(res.trace)
    shard_sent = [0] * (R * S)
    rep_sent = [0] * (R * S)
    for e in steps:
        (shard_sent if str(e.group).startswith("shard") else rep_sent)[e.src] += e.nbytes
    assert shard_sent == [STEPS * want["shard_per_rank"]] * (R * S)
    assert cross_node_bytes(steps, ranks_per_node=S) == STEPS * want["cross_node_total"]
    assert sum(rep_sent) == STEPS * want["cross_node_total"]   # only the replicate group leaves
    if all((n + (-n) % S) // S % R == 0 for n in NUMELS):      # equal ring chunks
        assert rep_sent == [STEPS * want["replicate_per_rank"]] * (R * S)
    # ZeRO-3 over all R*S ranks, node-major: many more bytes cross the nodes.
    z3 = ringlab.run(zero3_adam, [BATCHES] * (R * S), kwargs=KW)
    z3_cross = cross_node_bytes(steps_only(z3.trace), ranks_per_node=S)
    assert z3_cross == STEPS * zero3_cross_node_bytes(NUMELS, R, S)
    assert z3_cross > 1.5 * cross_node_bytes(steps, ranks_per_node=S)   # 3R(N-1)/N vs 2(R-1)


def test_one_unit_gathered_at_a_time_and_shards_of_one_over_s():
    R, S = 2, 3
    for prefetch, units_full in ((False, 1), (True, 2)):
        res = ringlab.run(hsdp_adam, [BATCHES] * (R * S),
                          kwargs=dict(KW, shape=(R, S), prefetch=prefetch))
        padded = [n + (-n) % S for n in NUMELS]
        peak = res.trace.memory_by_label(0)
        # The largest full units at once: one without prefetch, two (this and the next) with.
        biggest = max(padded[i] + (padded[i + 1] if units_full == 2 and i + 1 < len(padded)
                                   else 0) for i in range(len(padded)))
        assert peak["params.full"] <= 8 * biggest
        if units_full == 1:
            assert peak["params.full"] == 8 * max(padded)
        held = res.trace.memory_by_label(0, time=0.0)
        assert held["params"] == 8 * sum(p // S for p in padded)   # 1/S, not 1/(R*S)


def test_hsdp_step_signature_with_a_mesh():
    """The exercise's call: hsdp_step(comm, mesh, model, opt, x, y, batch_size)."""
    R, S = 2, 2
    x, y = BATCHES[0]

    def program(comm, _):
        mesh = ringlab.DeviceMesh(comm, (R, S), ("replicate", "shard"))
        model = ShardedModel(mlp_model(SIZES, np.random.default_rng(0)), mesh.coord("shard"), S)
        opt = Adam(model.masters(), 0.01)
        xs, ys = np.array_split(x, R * S)[comm.rank], np.array_split(y, R * S)[comm.rank]
        loss = hsdp_step(comm, mesh, model, opt, xs, ys, len(x))
        return loss, model.full_parameters(mesh.group("shard"))

    res = ringlab.run(program, [None] * (R * S))
    ref = single_process_adam(BATCHES[:1], sizes=SIZES, seed=0, lr=0.01)
    np.testing.assert_allclose(res.outputs[0][1], ref[1], rtol=0, atol=1e-12)


def test_fully_shard_on_a_2d_mesh_agrees():
    """PyTorch FSDP2's fully_shard on a (replicate, shard) DeviceMesh, gloo, float64."""
    pytest.importorskip("torch")
    from ringlab.frontier.torch_hsdp import train_fsdp2

    shape = (2, 2)
    kw = dict(sizes=SIZES, seed=0, lr=0.01)
    torch_params = train_fsdp2(shape, BATCHES, **kw)
    ours = ringlab.run(hsdp_adam, [BATCHES] * 4, kwargs=dict(kw, shape=shape)).outputs[0][1]
    start = single_process_adam([], **kw)[1]
    assert np.abs(ours - start).max() > 1e-2
    np.testing.assert_allclose(torch_params, ours, rtol=0, atol=1e-10)


def test_runs_are_deterministic():
    a, b = (ringlab.run(hsdp_adam, [BATCHES] * 6, kwargs=dict(KW, shape=(2, 3)))
            for _ in range(2))
    assert a.trace == b.trace and np.array_equal(a.outputs[0][1], b.outputs[0][1])
