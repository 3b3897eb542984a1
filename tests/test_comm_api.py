"""One program that uses the whole public ``Comm`` API, run in every mode.

A rank sees one ``Comm`` class whatever runs it: the simulator
(``ringlab.run``), an isolated process per rank talking to the grader's
simulator (``ringlab grade``), or real processes over torch.distributed
(``backend="torch"``). The same program must give the same outputs and the
same trace (messages, spans, memory events, computes) in all three.
"""

import numpy as np
import pytest

import ringlab
from ringlab.comm import Comm
from ringlab.backends.isolated import run_isolated


def ring_sum(comm, x):
    """A ring AllReduce written inline (n - 1 steps of pass-and-add, then the total)."""
    n, r = comm.world_size, comm.rank
    total, piece = x.copy(), x.copy()
    for _ in range(n - 1):
        piece = comm.sendrecv(piece, (r + 1) % n, (r - 1) % n, op="sum")
        total += piece
    return total


def everything(comm, x):
    """Every public method of Comm, with answers that depend on no timing."""
    assert type(comm) is Comm
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    comm.alloc("x", x)
    with comm.span("p2p"):
        comm.send(x, right, chunk=0, op="copy")
        a = comm.recv(left)
        buf = np.empty_like(x)
        req = comm.irecv(left, out=buf, tag=1)
        comm.isend(x * 2, right, tag=1).wait()
        b = req.wait()
        assert b is buf and req.is_completed()
        c = comm.sendrecv(x + 1, right, left, tag=2)
        into = np.zeros_like(x)
        comm.isend(x * 3, left, tag=4)
        d = comm.recv(right, out=into, tag=4)
        assert d is into
        e = comm.irecv(right, shape=x.shape, dtype=x.dtype, tag=6)
        comm.send(x - 1, left, tag=6)
        e = e.wait()
    comm.compute(0.001 * (r + 1), "forward", layer=r)
    with comm.span("overlap"):
        work = comm.start(ring_sum, x)
        comm.alloc("grads", 16)
        comm.compute(0.002, "backward")
        total = work.wait()
        assert work.is_completed()
    comm.free("grads")
    half = comm.split(r % 2, key=-r, name="half")
    pair = comm.new_group([0, 1], name="pair")
    comm.barrier()
    h = ring_sum(half, x) if half.world_size > 1 else x
    p = ring_sum(pair, x) if pair is not None else np.zeros_like(x)
    # recv_any, made independent of timing: rank 0 lets one sender go at a time.
    if r == 0:
        order = []
        for s in range(1, n):
            comm.send(np.array([float(s)]), s, tag=5)
            src, got = comm.recv_any(tag=5)
            order.append(src * 100 + got[0])
        q = np.array(order)
    else:
        comm.recv(0, tag=5)
        comm.send(x[:1] + r, 0, tag=5)
        q = np.zeros(n - 1)
    comm.free("x")
    return np.concatenate([a, b, c, d, e, total, h, p, q,
                           [comm.step, comm.time, comm.rank, comm.global_rank]])


INPUTS = [np.arange(4.0) * (r + 1) for r in range(4)]


def _same_runs(a, b, times=True):
    for x, y in zip(a.outputs, b.outputs):
        np.testing.assert_array_equal(x[:-3] if not times else x, y[:-3] if not times else y)
    assert a.trace == b.trace, a.trace.diff(b.trace)
    steps = lambda t: [(s.rank, s.path, s.start, s.end, s.group, s.stream) for s in t.spans]  # noqa: E731
    assert steps(a.trace) == steps(b.trace)
    assert a.trace.spans == b.trace.spans or not times
    assert a.trace.memory == b.trace.memory
    assert a.trace.unreceived == b.trace.unreceived
    key = (lambda c: (c.rank, c.label, c.meta, c.start, c.end)) if times else (
        lambda c: (c.rank, c.label, c.meta))
    assert sorted(map(key, a.trace.computes)) == sorted(map(key, b.trace.computes))


@pytest.fixture(scope="module")
def simulated():
    return ringlab.run(everything, INPUTS)


def test_the_program_uses_what_it_says(simulated):
    t = simulated.trace
    assert {e.group for e in t} == {None, "half[0]", "half[1]", "pair"}
    assert {e.stream for e in t} == {0, 1}
    assert {s.path for s in t.spans} >= {"p2p", "overlap"}
    assert [m.label for m in t.memory if m.rank == 0] == ["x", "grads", "grads", "x"]
    out = simulated.outputs[0]
    # The work's ring sum and the halves' and pair's sums are the sums of the inputs.
    np.testing.assert_array_equal(out[20:24], sum(INPUTS))
    np.testing.assert_array_equal(out[24:28], INPUTS[0] + INPUTS[2])
    np.testing.assert_array_equal(out[28:32], INPUTS[0] + INPUTS[1])
    np.testing.assert_array_equal(out[32:35], [101, 202, 303])     # src * 100 + src


def test_isolated_processes_give_the_same_run(simulated):
    _same_runs(simulated, run_isolated(everything, INPUTS))


def test_real_processes_give_the_same_run(simulated):
    pytest.importorskip("torch")
    try:
        real = ringlab.run(everything, INPUTS, backend="torch")
    finally:
        from ringlab.backends.torch import pool
        pool.shutdown()
    # Real processes do not simulate time: computes are at real seconds, and
    # comm.time is 0 there; everything else is the simulator's, step for step.
    _same_runs(simulated, real, times=False)


def test_one_communicator_class():
    """Every backend hands the program ringlab.comm.Comm itself, no subclass or stand-in."""
    import ringlab.backends.torch.world as torch_side
    import ringlab.backends.isolated as isolated
    import ringlab.sim.world as sim_side
    for module in (torch_side, isolated, sim_side):
        classes = [v for v in vars(module).values() if isinstance(v, type)]
        assert not [c for c in classes if c is not Comm and issubclass(c, Comm)], module
        assert not [c for c in classes if c.__name__.endswith("Comm") and c is not Comm], module
