"""Groups, the communication stream, recv_any, barrier/split and compute on
real processes: the same outputs and trace as the simulator (see
test_torch_backend.py for the plain point-to-point calls)."""

import importlib.util
import time

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allreduce
from ringlab.errors import RankError

from support.both_backends import assert_same_run, same

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="backend='torch' needs PyTorch: pip install 'ringlab[torch]'")


@pytest.fixture(scope="module", autouse=True)
def pool():
    yield
    from ringlab.backends.torch import pool
    pool.shutdown()


def mesh_allreduce(comm, x):
    mesh = ringlab.DeviceMesh(comm, (2, 2), ("dp", "tp"))
    row = ring_allreduce(mesh.group("tp"), x)
    return ring_allreduce(mesh.group("dp"), row), mesh.group("tp").rank, comm.step


def test_device_mesh_allreduce_over_each_axis():
    xs = [np.arange(6.0) * (r + 1) for r in range(4)]
    sim, real = assert_same_run(mesh_allreduce, xs)
    assert all(np.array_equal(out, np.sum(xs, axis=0)) for out, _, _ in real.outputs)
    assert real.trace.groups == ["tp[0]", "tp[1]", "dp[0]", "dp[1]"]
    # every event keeps its group and its place on its channel
    assert {(e.group, e.stream) for e in real.trace} == {(g, 0) for g in real.trace.groups}


def unnamed_groups_and_repeats(comm, x):
    a = comm.new_group([0, 1])
    b = comm.new_group([0, 1])                 # the same ranks again: label "(0, 1)#..."
    c = comm.new_group([2, 1], name="pair")    # group rank order is the order given
    out = []
    for g in (a, b, c):
        if g is not None:
            out.append((g.group.label, g.rank, g.world_size))
            g.send(x + g.rank, (g.rank + 1) % g.world_size)
            out.append(g.recv((g.rank - 1) % g.world_size))
    return out


def test_group_labels_and_rank_order_are_the_simulators():
    sim, real = assert_same_run(unnamed_groups_and_repeats, [np.full(2, float(r)) for r in range(3)])
    assert [g for g in real.trace.groups] == [(0, 1), "(0, 1)#2", "pair"]


def split_and_barrier(comm, x):
    half = comm.split(comm.rank % 2, key=-comm.rank, name="half")
    comm.barrier()
    total = ring_allreduce(half, x)
    half.barrier()
    none = comm.split(None if comm.rank == 0 else 1)
    return total, half.rank, half.group.label, none is None, comm.step


def test_split_and_barrier():
    xs = [np.arange(4.0) + 10 * r for r in range(4)]
    sim, real = assert_same_run(split_and_barrier, xs)
    assert real.outputs[0][1:4] == (1, "half[0]", True)    # key=-rank: rank 2 comes first


def overlapped(comm, x):
    work = comm.start(ring_allreduce, x)              # on the communication stream
    comm.compute(0.5, "forward", layer=1)             # meanwhile, the program computes
    local = ring_allreduce(comm, x * 2)               # and talks on its own stream
    second = comm.start(ring_allreduce, x + 1)        # runs after the first
    # (Not comm.step: a live clock on real processes can't see the one-port
    # contention between the two streams; the trace's steps are replayed.)
    return work.wait(), local, second.wait()


def test_comm_start_overlaps_and_wait_returns_the_result():
    xs = [np.arange(5.0) * (r + 1) for r in range(3)]
    sim, real = assert_same_run(overlapped, xs)
    assert np.array_equal(real.outputs[0][0], np.sum(xs, axis=0))
    assert {e.stream for e in real.trace} == {0, 1}
    assert all(e.start is None and e.end is None for e in real.trace)
    # compute is recorded (in real seconds: no simulated time here), not compared
    assert [(c.label, c.get("layer"), c.stream) for c in real.trace.computes] == [("forward", 1, 0)] * 3
    assert all(c.start == c.end for c in real.trace.computes)


def start_on_a_group(comm, x):
    mesh = ringlab.DeviceMesh(comm, (2, 2), ("dp", "tp"))
    works = [mesh.group(axis).start(ring_allreduce, x) for axis in ("tp", "dp")]
    mesh.group("tp").barrier()
    return [w.wait() for w in works] + [works[0].is_completed()]


def test_works_on_groups():
    assert_same_run(start_on_a_group, [np.arange(3.0) + r for r in range(4)])


def failing_work(comm, x):
    def boom(c):
        raise ValueError("the work gives up")
    work = comm.start(boom)
    if comm.rank == 1:
        work.wait()
    return x


def test_an_error_in_a_work_fails_the_rank():
    for backend in ("sim", "torch"):
        with pytest.raises(RankError) as err:
            ringlab.run(failing_work, [np.ones(1)] * 2, backend=backend)
        assert "the work gives up" in str(err.value), backend


def parameter_server(comm, x):
    # Rank 0 serves: it takes each worker's gradient in whatever order they come.
    if comm.rank == 0:
        got = {}
        for _ in range(comm.world_size - 1):
            src, grad = comm.recv_any(tag=7)
            got[src] = grad
        return sorted((src, g.tolist()) for src, g in got.items())
    comm.send(x * comm.rank, 0, tag=7)
    return None


def test_recv_any_parameter_server():
    # Which message comes first depends on real timing: compare sets, not order.
    xs = [np.arange(3.0)] * 4
    sim = ringlab.run(parameter_server, xs)
    real = ringlab.run(parameter_server, xs, backend="torch")
    assert real.outputs == sim.outputs == [[(r, (np.arange(3.0) * r).tolist()) for r in (1, 2, 3)],
                                           None, None, None]
    def key(e):
        return (e.src, e.dst, e.tag, e.seq, e.nbytes, e.group, e.stream)
    assert sorted(map(key, real.trace)) == sorted(map(key, sim.trace))
    # the steps are the replay of what really happened: rank 0 receives one per step
    assert sorted(e.step for e in real.trace) == [1, 2, 3]


def mismatched_groups(comm, x):
    g = comm.new_group([0, 1] if comm.rank != 2 else [0, 2])
    return g is not None


def mismatched_calls(comm, x):
    if comm.rank == 0:
        comm.barrier()
    else:
        comm.split(1)
    return x


@pytest.mark.parametrize("program, words", [
    (mismatched_groups, "every rank must create the same groups in the same order"),
    (mismatched_calls, "every rank must make the same calls in the same order")])
def test_a_bad_group_call_is_a_clear_error_not_a_hang(program, words):
    t0 = time.monotonic()
    with pytest.raises(RankError) as real:
        ringlab.run(program, [np.ones(1)] * 3, backend="torch", timeout=20)
    assert words in str(real.value)
    assert time.monotonic() - t0 < 15
    with pytest.raises(RankError) as sim:
        ringlab.run(program, [np.ones(1)] * 3)
    assert words in str(sim.value)


def nested_group(comm, x):
    row = comm.new_group([0, 1]) if comm.rank < 2 else comm.new_group([0, 1])
    return row.new_group([0]) if row is not None else None


def test_groups_of_groups_are_refused_with_a_reason():
    with pytest.raises(RankError, match="make groups from the whole world's comm"):
        ringlab.run(nested_group, [None] * 3, backend="torch")


def test_group_deadlock_is_found_and_names_global_ranks():
    def both_receive(comm, x):
        pair = comm.new_group([1, 2])
        if pair is not None:
            return pair.recv(1 - pair.rank)
        return x
    for backend in ("sim", "torch"):
        with pytest.raises(ringlab.DeadlockError) as err:
            ringlab.run(both_receive, [np.ones(1)] * 3, backend=backend, timeout=20)
        assert sorted(err.value.waiting) == [1, 2], backend


def test_gpu_framing_in_groups():
    # The NCCL code path of wire.py (header, then exact payload; sendrecv as
    # batch_isend_irecv), on the CPU, over the groups' process groups.
    def framed(comm, x):
        import torch
        from ringlab.backends.torch import framing as wire, world as protocol
        world = protocol.current_world
        world.device = torch.device("cpu")
        world.wire = wire.Wire(device=world.device)
        return mesh_allreduce(comm, x)[:2]
    xs = [np.arange(4.0) * (r + 1) for r in range(4)]
    sim = ringlab.run(mesh_allreduce, xs)
    real = ringlab.run(framed, xs, backend="torch")
    assert all(same(a[:2], b) for a, b in zip(sim.outputs, real.outputs))
    assert real.trace == sim.trace
