"""The simulator's fast path against the reference scheduler: random programs,
bit-identical traces.

``tests/support/reference_world.py`` is the scheduler as it was before the fast
path. Each example draws a program (a list of operations every rank walks
through in the same order: sends and receives between two ranks, blocking or
not, rings of ``sendrecv``, computes, spans, groups, works on the communication
stream, messages nobody receives), a mode, a network and whether payloads are
recorded, runs it on both, and wants the same of everything a run gives back:
every event (all fields, simulated times included), spans, computes, memory,
unreceived messages, outputs, recorded and handed payloads, and the run's time.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ringlab
import ringlab.sim
from ringlab.collectives import ring_allreduce
from ringlab.cost.alpha_beta import AlphaBeta, TwoLevel
from ringlab.errors import DeadlockError

from support import reference_world

DTYPES = ("float64", "float32", "int64")
FAST = ringlab.sim.World         # taken now: the tests below swap ringlab.sim.World


def _ring_work(comm, x, tag):
    n = comm.world_size
    return comm.sendrecv(x, (comm.rank + 1) % n, (comm.rank - 1) % n, chunk="w", tag=tag)


def program(comm, seed, ops):
    """Walk ``ops``; each rank does its part of each. Every operation involves
    ranks that reach it in the same order, so no program deadlocks except by
    design ("orphan": a message nobody receives)."""
    me, n = comm.rank, comm.world_size
    rng = np.random.default_rng(seed * 1000 + me)
    got, pending, works = [], [], []
    sub = None
    for op in ops:
        kind = op[0]
        if kind == "p2p":                      # a -> b, blocking or not, maybe out=
            _, a, b, length, dtype, tag, nonblocking, out = op
            a, b = a % n, b % n
            if a == b:
                continue
            if me == a:
                x = rng.standard_normal(length).astype(dtype)
                if nonblocking:
                    req = comm.isend(x, b, chunk=length, op="copy", tag=tag)
                    x[...] = 0                 # changed after the send: must not travel
                    pending.append(req)
                else:
                    comm.send(x, b, chunk=(a, b), tag=tag)
            elif me == b:
                if out:
                    buf = np.empty(length, dtype)
                    comm.recv(a, out=buf, tag=tag)
                    got.append(buf)
                elif nonblocking:
                    got.append(comm.irecv(a, tag=tag).wait())
                else:
                    got.append(comm.recv(a, shape=length, dtype=dtype, tag=tag))
        elif kind == "ring":                   # everyone sendrecvs one way round
            _, shift, length = op
            shift = shift % n or 1
            x = np.full(length, me, float)
            got.append(comm.sendrecv(x, (me + shift) % n, (me - shift) % n, op="reduce"))
        elif kind == "compute":
            _, who, seconds = op
            if me == who % n:
                comm.compute(seconds, "work", flops=int(seconds * 1e9))
        elif kind == "span":
            _, length = op
            with comm.span("outer"):
                got.append(ring_allreduce(comm, np.arange(length, dtype=float) + me))
        elif kind == "group":
            sub = comm.split(me % 2, name="half")
            if sub.world_size > 1:
                got.append(ring_allreduce(sub, np.full(3, float(me))))
        elif kind == "work":
            _, length, tag = op
            works.append(comm.start(_ring_work, np.full(length, float(me)), tag))
            comm.compute(1e-6 * (me + 1), "overlap")
        elif kind == "memory":
            comm.alloc("buf", 8 * (me + 1))
            comm.free("buf")
        elif kind == "layout" and n > 1:      # F-ordered and reversed views travel as they are
            _, rows = op
            x = np.asfortranarray(np.arange(rows * 3, dtype=float).reshape(rows, 3) + me)
            if me == 0:
                comm.send(x, 1)
                comm.send(x[::-1, ::2], 1, tag=1)
            elif me == 1:
                got += [comm.recv(0), comm.recv(0, tag=1)]
        elif kind == "orphan" and me == 0 and n > 1:
            comm.send(np.ones(2), 1, tag=99)
    for req in pending:
        req.wait()
    got += [w.wait() for w in works]
    return got


def ops():
    p2p = st.tuples(st.just("p2p"), st.integers(0, 7), st.integers(0, 7), st.integers(0, 40),
                    st.sampled_from(DTYPES), st.integers(0, 2), st.booleans(), st.booleans())
    return st.lists(st.one_of(
        p2p, p2p, p2p,
        st.tuples(st.just("ring"), st.integers(1, 7), st.integers(1, 9)),
        st.tuples(st.just("compute"), st.integers(0, 7), st.sampled_from([1e-6, 2.5e-6, 1e-3, 0.0])),
        st.tuples(st.just("span"), st.integers(1, 12)),
        st.just(("group",)),
        st.tuples(st.just("work"), st.integers(1, 5), st.integers(0, 1)),
        st.just(("memory",)),
        st.tuples(st.just("layout"), st.integers(1, 4)),
        st.just(("orphan",))), min_size=1, max_size=14)


NETWORKS = {
    "none": lambda: None,
    "alpha-beta": lambda: AlphaBeta(1e-6, 1e-9),
    "per link": lambda: AlphaBeta(2e-6, 3e-10, ports="link"),
    "two-level": lambda: TwoLevel(AlphaBeta(1e-6, 1e-11), AlphaBeta(5e-6, 1e-10), gpus_per_node=2),
}


def outcome(world_class, monkeypatch, n, seed, prog, mode, network, record):
    """Everything a run gives back, as plain comparable values."""
    monkeypatch.setattr(ringlab.sim, "World", world_class)
    try:
        res = ringlab.sim.run(program, [seed] * n, args=(prog,), mode=mode, timeout=None,
                              check_unreceived=False, record_payloads=record,
                              network=NETWORKS[network]())
    except DeadlockError as e:                 # rendezvous: the orphan send never returns
        t = e.trace
        return ("deadlock", str(e), [tuple(ev) for ev in t.events], t.spans)
    t = res.trace
    arrays = lambda xs: [(a.shape, a.dtype.str, a.strides, a.flags.c_contiguous, a.tobytes())
                         for a in xs]
    return ([tuple(e) for e in t.events], t.spans, t.computes, t.memory,
            [tuple(e) for e in t.unreceived], t.group_ranks, res.time,
            [arrays(out) for out in res.outputs],
            None if res.payloads is None else {k: arrays([v]) for k, v in res.payloads.items()},
            None if res.handed is None else [(tuple(e), arrays([a])) for e, a in res.handed])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 6), seed=st.integers(0, 3), prog=ops(),
       mode=st.sampled_from(ringlab.sim.MODES), network=st.sampled_from(sorted(NETWORKS)),
       record=st.booleans())
def test_fast_path_traces_match_reference(monkeypatch, n, seed, prog, mode, network, record):
    fast = outcome(FAST, monkeypatch, n, seed, prog, mode, network, record)
    ref = outcome(reference_world.World, monkeypatch, n, seed, prog, mode, network, record)
    assert fast == ref


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_ring_allreduce_matches_reference(monkeypatch, network):
    """The bench's shape, small: a ring AllReduce's whole trace, on every network."""
    xs = [np.arange(40, dtype=float) * r for r in range(8)]
    runs = []
    for world in (FAST, reference_world.World):
        monkeypatch.setattr(ringlab.sim, "World", world)
        res = ringlab.sim.run(ring_allreduce, xs, network=NETWORKS[network](), record_payloads=True)
        runs.append(([tuple(e) for e in res.trace.events], res.trace.spans, res.time,
                     [o.tobytes() for o in res.outputs],
                     {k: v.tobytes() for k, v in res.payloads.items()}))
    assert runs[0] == runs[1]
