"""The closed forms of ``ringlab.cost.timing`` against the simulated time of the
reference implementations under ``network=AlphaBeta(...)``, against the cited
formulas, and the crossovers and interconnect table built on them."""

import math
from fractions import Fraction

import numpy as np
import pytest

import ringlab
from ringlab import collectives as C, cost
from ringlab.cost import timing
from ringlab.cost.alpha_beta import AlphaBeta, TwoLevel
from ringlab.cost.hierarchical import hierarchical_allreduce
from ringlab.cost.interconnects import INTERCONNECTS

import programs.reduction_variants as V

NETS = [(1e-6, 1e-9), (3e-5, 2e-12), (0.0, 1e-9), (1e-6, 0.0)]


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def programs(n, block):
    """(name, program, inputs, kwargs, extra terms params, nbytes) for every algorithm."""
    vec = [np.arange(n * block, dtype=float)] * n
    own = [np.zeros(block)] * n
    bcast = [np.zeros(n * block)] + [None] * (n - 1)
    bufs = [[np.zeros(block)] * n] * n
    out = [("ring_allgather", own, {}, {}), ("naive_allgather", own, {}, {}),
           ("ring_reduce_scatter", vec, {}, {}), ("flat_broadcast", bcast, {}, {}),
           ("tree_broadcast", bcast, {}, {}), ("binomial_broadcast", bcast, {}, {}),
           ("binomial_reduce", vec, {}, {}), ("ring_allreduce", vec, {}, {}),
           ("tree_allreduce", vec, {}, {}), ("bidirectional_ring_allreduce", vec, {}, {}),
           ("alltoall", bufs, {}, {}), ("pairwise_alltoall", bufs, {}, {}),
           ("ring_alltoall", bufs, {}, {})]
    for s in (1, 3):
        out.append(("chain_broadcast", [np.zeros(s * block * n)] + [None] * (n - 1),
                    {"segments": s}, {"segments": s}))
    if n & (n - 1) == 0:
        out.append(("recursive_doubling_allgather", own, {}, {}))
    for g in range(1, n + 1):
        if n % g == 0:
            out.append(("hierarchical_allreduce", vec, {"mesh": (n // g, g)}, {"gpus_per_node": g}))
    return [(name, ALGORITHMS[name], inputs, kw, params,
             inputs[0].nbytes if name == "chain_broadcast" else n * block * 8)
            for name, inputs, kw, params in out]


# Every collective of the library: Part 1's, and Part 6's two-level AllReduce.
ALGORITHMS = {**{name: getattr(C, name) for name in C.__all__},
              "hierarchical_allreduce": hierarchical_allreduce}


def test_every_algorithm_in_the_library_has_a_closed_form():
    assert set(ALGORITHMS) == set(timing.ALGORITHMS)


@pytest.mark.parametrize("n", range(1, 17))
def test_every_formula_is_the_simulated_time(n):
    for block in (2, 6):         # the vector: 2N or 6N float64 (halves split evenly too)
        for alpha, beta in NETS[:2] if block == 6 else NETS:
            net = AlphaBeta(alpha, beta)
            for name, program, inputs, kw, params, nbytes in programs(n, block):
                got = ringlab.run(program, inputs, kwargs=kw, network=net).time
                want = cost.time(name, n, nbytes, alpha, beta, **params)
                assert close(got, want), (name, n, block, alpha, beta, params, got, want)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 11, 16])
def test_one_port_per_link_changes_only_the_bidirectional_ring(n):
    x = [np.arange(4.0 * n)] * n
    a, b = 2e-6, 1e-9
    link = AlphaBeta(a, b, ports="link")
    bi = ringlab.run(C.bidirectional_ring_allreduce, x, network=link).time
    assert close(bi, cost.time("bidirectional_ring_allreduce", n, 32 * n, a, b, ports="link"))
    ring = ringlab.run(C.ring_allreduce, x, network=link).time
    assert close(ring, cost.time("ring_allreduce", n, 32 * n, a, b))
    one_port = cost.time("bidirectional_ring_allreduce", n, 32 * n, a, b)
    # What the second ring buys: with one send port, 2(N-1) more alphas and nothing else...
    assert close(one_port - ring, 2 * (n - 1) * a)
    # ... with a port per link (N > 2), half of the ring's beta term.
    if n > 2:
        assert close(ring - bi, (n - 1) / n * 32 * n * b)
    outs = ringlab.run(C.bidirectional_ring_allreduce, x).outputs
    assert all(np.array_equal(o, n * x[0]) for o in outs)


@pytest.mark.parametrize("n", range(1, 17))
def test_gamma_terms_against_timed_reductions(n):
    alpha, beta, gamma = 1e-6, 1e-9, 3e-10
    net = AlphaBeta(alpha, beta)
    x = [np.arange(6.0 * n)] * n
    nbytes = 48 * n
    for name in ("ring_reduce_scatter", "ring_allreduce"):
        got = ringlab.run(getattr(V, name), x, args=(gamma,), network=net).time
        assert close(got, cost.time(name, n, nbytes, alpha, beta, gamma)), name
    lg = cost.ceil_log2(n)
    for name in ("binomial_reduce", "tree_allreduce"):
        got = ringlab.run(getattr(V, name), x, args=(gamma,), network=net).time
        upper = cost.time(name, n, nbytes, alpha, beta, gamma)
        if n & (n - 1) == 0:
            assert close(got, upper), name              # Thakur et al.'s lg p (a + nb + ng)
        else:
            lower = cost.time(name, n, nbytes, alpha, beta) + (nbytes * gamma if lg else 0)
            assert lower - 1e-15 <= got <= upper + 1e-15, (name, lower, got, upper)
    for g in (d for d in range(1, n + 1) if n % d == 0):
        got = ringlab.run(V.hierarchical_allreduce, x, args=((n // g, g), gamma), network=net).time
        want = cost.time("hierarchical_allreduce", n, nbytes, alpha, beta, gamma, gpus_per_node=g)
        assert close(got, want), g


@pytest.mark.parametrize("nodes,gpus", [(1, 4), (4, 1), (2, 2), (2, 3), (3, 4), (2, 8), (4, 4)])
@pytest.mark.parametrize("gamma", [0.0, 1e-11])
def test_two_level_network(nodes, gpus, gamma):
    intra, inter = AlphaBeta(1e-6, 1 / 450e9), AlphaBeta(5e-6, 1 / 50e9)
    net = TwoLevel(intra, inter, gpus)
    n = nodes * gpus
    x = [np.arange(64.0 * n) + r for r in range(n)]
    nbytes = x[0].nbytes
    ring = ringlab.run(V.ring_allreduce, x, args=(gamma,), network=net)
    hier = ringlab.run(V.hierarchical_allreduce, x, args=((nodes, gpus), gamma), network=net)
    assert close(ring.time, cost.two_level_time("ring_allreduce", nodes, gpus, nbytes, intra, inter,
                                                gamma))
    assert close(hier.time, cost.two_level_time("hierarchical_allreduce", nodes, gpus, nbytes,
                                                intra, inter, gamma))
    if gamma == 0 and nodes > 1 and gpus > 1:
        assert hier.time < ring.time      # the slow links carry 1/G of the ring's bytes


@pytest.mark.parametrize("p", [2, 4, 8, 16, 64, 1024])
def test_the_cited_formulas(p):
    a, b, g, n = 1e-5, 1e-9, 1e-10, 1 << 20
    lg = int(math.log2(p))
    f = (p - 1) / p
    # Thakur, Rabenseifner & Gropp 2005
    assert close(cost.time("ring_allgather", p, n, a, b), (p - 1) * a + f * n * b)
    assert close(cost.time("recursive_doubling_allgather", p, n, a, b), lg * a + f * n * b)
    assert close(cost.time("binomial_broadcast", p, n, a, b), lg * (a + n * b))
    assert close(cost.time("ring_reduce_scatter", p, n, a, b, g), (p - 1) * a + f * n * (b + g))
    assert close(cost.time("binomial_reduce", p, n, a, b, g), lg * (a + n * b + n * g))
    assert close(cost.time("pairwise_alltoall", p, n, a, b), (p - 1) * a + f * n * b)
    # Patarasuk & Yuan 2009
    assert close(cost.time("ring_allreduce", p, n, a, b, g),
                 2 * (p - 1) * a + 2 * f * n * b + f * n * g)
    # The two-level ring with one network: the flat ring's betas, fewer alphas.
    if p >= 4:
        t = cost.terms("hierarchical_allreduce", p, gpus_per_node=p // 2)
        assert t.bandwidth == cost.terms("ring_allreduce", p).bandwidth
        assert t.latency == 2 * (p // 2 - 1) + 2 < 2 * (p - 1)


@pytest.mark.parametrize("n", [4, 5, 7, 8, 16, 64])
def test_crossover_is_exact_and_splits_the_winners(n):
    alpha, beta = 1e-5, 1e-9
    for small in (2, 3):       # as many alphas as the ring, more betas: the ring always wins
        assert cost.crossover("tree_allreduce", "ring_allreduce", small, alpha, beta) is None
    x = cost.crossover("tree_allreduce", "ring_allreduce", n, alpha, beta)
    ta, tb = cost.terms("tree_allreduce", n), cost.terms("ring_allreduce", n)
    exact = lambda t, m: t.latency * Fraction(alpha) + t.bandwidth * m * Fraction(beta)
    assert exact(ta, x) == exact(tb, x)                       # a tie, exactly
    below, above = float(x) * 0.9, float(x) * 1.1
    pair = ["tree_allreduce", "ring_allreduce"]
    assert cost.fastest(pair, n, below, alpha, beta) == "tree_allreduce"
    assert cost.fastest(pair, n, above, alpha, beta) == "ring_allreduce"
    # Parallel lines never cross; a crossing at a negative size is no crossing.
    assert cost.crossover("alltoall", "pairwise_alltoall", n, alpha, beta) is None
    assert cost.crossover("binomial_broadcast", "flat_broadcast", max(n, 3), alpha, beta) is None


def test_crossover_table_agrees_with_fastest():
    algs = ["ring_allreduce", "tree_allreduce", "bidirectional_ring_allreduce"]
    rows = cost.crossover_table(algs, [4, 8, 16], 1e-5, 1e-9)
    assert rows and all(r["below"] != r["above"] for r in rows)
    for r in rows:
        pair = [r["a"], r["b"]]
        n, x = r["world_size"], r["crossover_bytes"]
        assert cost.fastest(pair, n, x / 2, 1e-5, 1e-9) == r["below"]
        assert cost.fastest(pair, n, x * 2, 1e-5, 1e-9) == r["above"]


def test_infiniband_rows_cite_infiniband_adapters():
    """An InfiniBand rate comes from an InfiniBand (VPI) adapter's manual, not from
    the Ethernet-only card's (ConnectX-6 EN)."""
    for name, row in INTERCONNECTS.items():
        if name.startswith("InfiniBand"):
            assert "ConnectX6EN" not in row.source and "Ethernet adapter" not in row.source
    assert "InfiniBand/VPI" in INTERCONNECTS["InfiniBand HDR"].source
    hdr = INTERCONNECTS["InfiniBand HDR"]                 # IBTA HDR: 4 lanes of 50 Gb/s
    assert hdr.bytes_per_s == 4 * 50e9 / 8 and "four lanes of 50 Gb/s" in hdr.note


def test_interconnect_rows_are_per_direction_and_sourced():
    gb = {name: row.gb_per_s for name, row in INTERCONNECTS.items()}
    assert gb["NVLink 3"] == 300 and gb["NVLink 4"] == 450 and gb["NVLink 5"] == 900
    assert gb["NVSwitch (H100 node)"] == gb["NVLink 4"]
    assert round(gb["PCIe 4.0 x16"], 2) == 31.51 and round(gb["PCIe 5.0 x16"], 2) == 63.02
    assert (gb["InfiniBand HDR"], gb["InfiniBand NDR"], gb["InfiniBand XDR"]) == (25, 50, 100)
    assert (gb["Ethernet 100G"], gb["Ethernet 200G"], gb["Ethernet 400G"]) == (12.5, 25, 50)
    assert all(row.source for row in INTERCONNECTS.values())
    ib = AlphaBeta.from_interconnect(INTERCONNECTS["InfiniBand HDR"])
    assert (ib.alpha, ib.beta) == (600e-9, 1 / 25e9)
    with pytest.raises(ValueError, match="latency"):
        AlphaBeta.from_interconnect(INTERCONNECTS["NVLink 4"])
    assert len(cost.interconnects.table()) == len(INTERCONNECTS)


def test_bad_arguments_are_named():
    with pytest.raises(KeyError, match="no closed form"):
        cost.time("ring_allreduse", 4, 100, 1e-6, 1e-9)
    with pytest.raises(ValueError, match="power-of-two"):
        cost.terms("recursive_doubling_allgather", 6)
    with pytest.raises(ValueError, match="multiple of"):
        cost.terms("hierarchical_allreduce", 6, gpus_per_node=4)
    with pytest.raises(ValueError, match="ports"):
        AlphaBeta(1e-6, 1e-9, ports="wire")
