"""The closed-form cost table against the simulator's traces, hand-derived values
and the formulas of the cited sources."""

import math

import numpy as np
import pytest

import ringlab
from ringlab import collectives as C, cost


def measure(program, inputs, **kw):
    t = ringlab.run(program, inputs, **kw).trace
    if not len(t):
        return cost.Cost(0, 0, 0, 0, 0)
    return cost.Cost(t.steps, len(t), max(t.bytes_sent()), max(t.bytes_received()), t.total_bytes)


def runs(n, block=3):
    """(name, program, inputs, kwargs, nbytes) for every reference algorithm on n ranks,
    float64 data that splits evenly: nbytes as the cost module defines it."""
    vec = [np.zeros(n * block)] * n                       # one rank's vector: n * block elements
    own = [np.zeros(block)] * n                           # allgather: each rank's block
    bcast = [np.zeros(n * block)] + [None] * (n - 1)
    buffers = [[np.zeros(block)] * n] * n
    nbytes = n * block * 8
    out = [("ring_allgather", C.ring_allgather, own, {}), ("naive_allgather", C.naive_allgather, own, {}),
           ("ring_reduce_scatter", C.ring_reduce_scatter, vec, {}),
           ("flat_broadcast", C.flat_broadcast, bcast, {}), ("tree_broadcast", C.tree_broadcast, bcast, {}),
           ("binomial_broadcast", C.binomial_broadcast, bcast, {}),
           ("binomial_reduce", C.binomial_reduce, vec, {}),
           ("ring_allreduce", C.ring_allreduce, vec, {}), ("tree_allreduce", C.tree_allreduce, vec, {}),
           ("alltoall", C.alltoall, buffers, {}), ("pairwise_alltoall", C.pairwise_alltoall, buffers, {}),
           ("ring_alltoall", C.ring_alltoall, buffers, {})]
    if n & (n - 1) == 0:
        out.append(("recursive_doubling_allgather", C.recursive_doubling_allgather, own, {}))
    return [(name, prog, inputs, kw, nbytes) for name, prog, inputs, kw in out]


@pytest.mark.parametrize("n", range(1, 17))
def test_every_formula_matches_the_trace(n):
    for name, program, inputs, kwargs, nbytes in runs(n):
        assert measure(program, inputs, kwargs=kwargs) == getattr(cost, name)(n, nbytes), name


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("segments", [1, 2, 3, 7])
def test_chain_broadcast_formula_matches_the_trace(n, segments):
    x = np.zeros(segments * 5)
    got = measure(C.chain_broadcast, [x] + [None] * (n - 1), kwargs={"segments": segments})
    assert got == cost.chain_broadcast(n, x.nbytes, segments)


# Worked by hand for N = 8 ranks and 8000 bytes (blocks of 1000), from the algorithms' descriptions:
# (steps, messages, busiest rank's bytes sent, busiest rank's bytes received, total bytes).
BY_HAND_8 = {
    "ring_allgather": (7, 56, 7000, 7000, 56000),            # 7 steps x 8 ranks x 1 block
    "naive_allgather": (14, 14, 56000, 8000, 63000),         # 7 blocks in, then 7 whole results out
    "recursive_doubling_allgather": (3, 24, 7000, 7000, 56000),   # 1 + 2 + 4 blocks per rank
    "ring_reduce_scatter": (7, 56, 7000, 7000, 56000),
    "flat_broadcast": (7, 7, 56000, 8000, 56000),
    "tree_broadcast": (4, 7, 16000, 8000, 56000),             # position 6: right, right = 2 + 2 steps
    "binomial_broadcast": (3, 7, 24000, 8000, 56000),
    "binomial_reduce": (3, 7, 8000, 24000, 56000),
    "ring_allreduce": (14, 112, 14000, 14000, 112000),
    "tree_allreduce": (6, 14, 24000, 24000, 112000),
    "alltoall": (7, 56, 7000, 7000, 56000),
    "pairwise_alltoall": (7, 56, 7000, 7000, 56000),
    "ring_alltoall": (7, 56, 28000, 28000, 224000),           # 7 + 6 + ... + 1 = 28 blocks per rank
}


@pytest.mark.parametrize("name", sorted(BY_HAND_8))
def test_hand_worked_values_for_eight_ranks(name):
    assert tuple(getattr(cost, name)(8, 8000)) == BY_HAND_8[name]
    assert tuple(cost.chain_broadcast(8, 8000, segments=4)) == (10, 28, 8000, 8000, 56000)


@pytest.mark.parametrize("p", [2, 4, 8, 16, 64, 1024])
def test_agrees_with_the_cited_alpha_beta_formulas(p):
    n = 1024 * p     # bytes
    lg = int(math.log2(p))
    # Thakur, Rabenseifner & Gropp 2005 / MPICH: ring allgather (p-1) alpha + (p-1)/p n beta;
    # recursive doubling lg p alpha + (p-1)/p n beta (n = data gathered on each process).
    assert cost.ring_allgather(p, n)[:1] + cost.ring_allgather(p, n)[2:3] == (p - 1, (p - 1) * n // p)
    rd = cost.recursive_doubling_allgather(p, n)
    assert (rd.steps, rd.max_bytes_sent) == (lg, (p - 1) * n // p)
    # Binomial broadcast: lg p (alpha + n beta): the root sends lg p whole messages, one per step.
    bb = cost.binomial_broadcast(p, n)
    assert (bb.steps, bb.max_bytes_sent) == (lg, lg * n)
    # Pairwise-exchange alltoall: (p-1) alpha + n' beta, n' = what a process sends to all others.
    pw = cost.pairwise_alltoall(p, n)
    assert (pw.steps, pw.max_bytes_sent) == (p - 1, n * (p - 1) // p)
    # Reduce-scatter (pairwise/ring): (p-1) alpha + (p-1)/p n beta.
    rs = cost.ring_reduce_scatter(p, n)
    assert (rs.steps, rs.max_bytes_sent) == (p - 1, (p - 1) * n // p)
    # Patarasuk & Yuan 2009: ring allreduce sends 2(p-1)/p n per process, in 2(p-1) steps.
    ra = cost.ring_allreduce(p, n)
    assert (ra.steps, ra.max_bytes_sent) == (2 * (p - 1), 2 * (p - 1) * n // p)
    # Chan et al. 2007 lower bounds: every rank must receive (p-1)/p n in an allgather, n in a broadcast.
    assert cost.ring_allgather(p, n).max_bytes_received >= (p - 1) * n // p
    assert cost.binomial_broadcast(p, n).max_bytes_received >= n


def brute_binary_steps(n):
    """Walk the heap: a node's left child receives one step after it, its right child two."""
    when = [0] * n
    for i in range(1, n):
        parent = (i - 1) // 2
        when[i] = when[parent] + (1 if i == 2 * parent + 1 else 2)
    return max(when)


def test_binary_tree_steps_closed_form():
    assert [cost.binary_tree_steps(n) for n in range(1, 17)] == [0, 1, 2, 2, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6]
    as_fast_as_binomial = []
    for n in range(1, 600):
        t = cost.binary_tree_steps(n)
        assert t == brute_binary_steps(n)
        if n > 1:   # about twice the binomial tree's ceil(log2 n)
            d = int(math.log2(n))
            assert 2 * d - 2 <= t <= 2 * d and t >= cost.ceil_log2(n)
            if t == cost.ceil_log2(n):
                as_fast_as_binomial.append(n)
    # The claim "a binary tree broadcasts in ceil(log2 N) steps" holds for these N only
    # (from the table above: 2..6, 9 and 10; from 16 on, 2d - 2 > d + 1 >= ceil(log2 N)).
    assert as_fast_as_binomial == [2, 3, 4, 5, 6, 9, 10]


def test_helpers_against_brute_force():
    for k in range(0, 300):
        assert cost.max_popcount(k) == max(bin(i).count("1") for i in range(k + 1))
    for n in range(1, 300):
        assert cost.ceil_log2(n) == math.ceil(math.log2(n))
        # One receive per step: the root takes its ceil(log2 N) children one by one.
        assert cost.binomial_reduce_steps(n) == (math.ceil(math.log2(n)) if n > 1 else 0)
    assert [cost.binomial_reduce_steps(2 ** k) for k in range(6)] == [0, 1, 2, 3, 4, 5]
    assert cost.binomial_reduce_steps(3) == 2     # both children reach the root, one step each


def test_table_lists_every_algorithm_that_fits_the_world():
    rows = cost.table(6, 6000)
    names = [r["algorithm"] for r in rows]
    assert "recursive_doubling_allgather" not in names
    assert len(names) == sum(len(v) for v in cost.ALGORITHMS.values()) - 1
    for r in rows:
        fn = getattr(cost, r["algorithm"])
        want = fn(6, 6000, 4) if r["algorithm"] == "chain_broadcast" else fn(6, 6000)
        assert tuple(r[k] for k in cost.Cost._fields) == tuple(want)
    assert {r["collective"] for r in cost.table(8, 800, collective="AlltoAll")} == {"AlltoAll"}
    assert "recursive_doubling_allgather" in [r["algorithm"] for r in cost.table(8, 800)]
    assert set(cost.ALGORITHMS) == {"AllGather", "ReduceScatter", "Broadcast", "Reduce", "AllReduce", "AlltoAll"}
    for names in cost.ALGORITHMS.values():      # every algorithm in the table has a reference program
        assert all(hasattr(C, name) for name in names)


def test_uneven_sizes_give_exact_averages_and_powers_of_two_are_enforced():
    assert cost.ring_allgather(3, 100).max_bytes_sent == pytest.approx(200 / 3)
    assert isinstance(cost.ring_allgather(4, 100).max_bytes_sent, int)
    with pytest.raises(ValueError, match="power-of-two"):
        cost.recursive_doubling_allgather(6, 600)
