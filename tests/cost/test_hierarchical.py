"""hierarchical_allreduce and bidirectional_ring_allreduce: the sum numpy gives,
the same outputs as ring_allreduce, and only 1/G of the data crossing nodes."""

import numpy as np
import pytest

import ringlab
from ringlab import collectives as C
from ringlab.cost.hierarchical import hierarchical_allreduce

MESHES = [(1, 1), (1, 3), (3, 1), (2, 2), (2, 3), (3, 2), (2, 4), (4, 4), (3, 5)]


def inputs(n, length, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 50, size=length).astype(float) for _ in range(n)]


@pytest.mark.parametrize("nodes,gpus", MESHES)
@pytest.mark.parametrize("length", [1, 7, 24, 61])
def test_hierarchical_sums_like_the_ring(nodes, gpus, length):
    n = nodes * gpus
    xs = inputs(n, length, seed=n * 100 + length)
    res = ringlab.run(hierarchical_allreduce, xs, args=((nodes, gpus),))
    ring = ringlab.run(C.ring_allreduce, xs).outputs
    total = np.sum(xs, axis=0)
    for r in range(n):
        assert np.array_equal(res.outputs[r], total), r     # integers: exact in any order
        assert np.array_equal(res.outputs[r], ring[r])
    for x, original in zip(xs, inputs(n, length, seed=n * 100 + length)):
        assert np.array_equal(x, original)                   # inputs untouched


def test_a_device_mesh_works_too_and_names_its_axes():
    def program(comm, x):
        mesh = ringlab.DeviceMesh(comm, (2, 4), ("host", "local"))
        return hierarchical_allreduce(comm, x, mesh)
    xs = inputs(8, 10)
    res = ringlab.run(program, xs)
    assert all(np.array_equal(o, np.sum(xs, axis=0)) for o in res.outputs)
    assert {e.group for e in res.trace} == {f"local[{k}]" for k in range(2)} | \
        {f"host[{g}]" for g in range(4)}


@pytest.mark.parametrize("nodes,gpus", [(2, 2), (2, 4), (4, 2), (3, 4), (4, 4)])
def test_only_one_gputh_of_the_data_crosses_nodes(nodes, gpus):
    n, length = nodes * gpus, 8 * nodes * gpus
    xs = inputs(n, length)
    nbytes = xs[0].nbytes
    node = lambda r: r // gpus
    hier = ringlab.run(hierarchical_allreduce, xs, args=((nodes, gpus),)).trace
    ring = ringlab.run(C.ring_allreduce, xs).trace
    crossing = [e for e in hier if node(e.src) != node(e.dst)]
    # Inter-node messages only in the column groups, among same-index GPUs.
    assert all(e.group.startswith("node[") and e.src % gpus == e.dst % gpus for e in crossing)
    for r in range(n):
        sent = sum(e.nbytes for e in crossing if e.src == r)
        # a ring AllReduce of n/G bytes over M nodes: 2(M-1)/M of n/G
        assert sent * nodes * gpus == 2 * (nodes - 1) * nbytes
    # The flat ring sends 2(N-1)/N of the whole vector over each node boundary it crosses.
    ring_crossing = [e for e in ring if node(e.src) != node(e.dst)]
    per_link = sum(e.nbytes for e in ring_crossing if e.src == gpus - 1)
    assert per_link * n == 2 * (n - 1) * nbytes
    hier_sent = 2 * (nodes - 1) * nbytes // n
    assert per_link * (nodes - 1) == hier_sent * (n - 1)      # (N-1)/(M-1) times as much


def test_hierarchical_rejects_a_mesh_that_does_not_fit():
    with pytest.raises(ringlab.RankError, match="3 places"):
        ringlab.run(hierarchical_allreduce, inputs(4, 4), args=((1, 3),))


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("length", [1, 5, 36])
def test_bidirectional_sums_like_the_ring(n, length):
    xs = inputs(n, length, seed=n + length)
    res = ringlab.run(C.bidirectional_ring_allreduce, xs)
    ring = ringlab.run(C.ring_allreduce, xs).outputs
    for r in range(n):
        assert np.array_equal(res.outputs[r], ring[r])
    # Two rings: half the messages go right, half go left, each 1/(2N) of the vector.
    if n > 2 and length % (2 * n) == 0:
        right = [e for e in res.trace if e.dst == (e.src + 1) % n]
        assert len(right) * 2 == len(res.trace) == 4 * n * (n - 1)
        assert {e.nbytes for e in res.trace} == {xs[0].nbytes // (2 * n)}
