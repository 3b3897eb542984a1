"""The topology-aware network: graphs, routing, max-min sharing, and runs on it.

References are independent of the code under test: counts and bandwidths from
the builders' definitions, networkx's own shortest paths, the defining property
of max-min fairness (every flow has a bottleneck link), AlphaBeta's closed
forms, and cases worked out by hand (the arithmetic is in the tests)."""

import math
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ringlab
from ringlab import AlphaBeta, cost
from ringlab.collectives import binomial_broadcast, ring_allgather, ring_allreduce, tree_broadcast
from ringlab.cost.topology import FlowSim, Routing, Topology, fat_tree, gpus, max_min_fair, nvswitch_node, rail_optimized, ring, torus2d
from ringlab.cost.topology.graphs import NIC_BW, NVLINK_BW


# -- builders ---------------------------------------------------------------------------

def cables(g):
    return g.number_of_edges() // 2


def test_every_link_is_full_duplex():
    for g in (nvswitch_node(4), fat_tree(4, 2, 2, 2, 2.0), rail_optimized(2, 4), ring(5),
              torus2d(3, 4), torus2d(2, 2)):
        for u, v, d in g.edges(data=True):
            assert g.edges[v, u] == d, (u, v)
            assert d["bandwidth"] > 0 and d["latency"] >= 0


def test_nvswitch_node():
    g = nvswitch_node(gpus=8, bw=100.0, lat=1e-6)
    assert g.number_of_nodes() == 9 and cables(g) == 8
    assert gpus(g) == [f"n0.gpu{i}" for i in range(8)]
    assert {d["bandwidth"] for *_, d in g.edges(data=True)} == {100.0}


@pytest.mark.parametrize("ratio", [1, 2, 4, 1.5])
def test_fat_tree_counts_and_oversubscription(ratio):
    nodes, per_node, leaves, spines = 8, 4, 2, 4
    g = fat_tree(nodes, per_node, leaves, spines, ratio)
    kinds = [d for _, d in g.nodes(data="tier")]
    assert len(gpus(g)) == nodes * per_node
    assert kinds.count("nvswitch") == nodes
    assert kinds.count("leaf") == leaves and kinds.count("spine") == spines
    # NVLink cables, one NIC per GPU, every leaf to every spine.
    assert cables(g) == nodes * per_node * 2 + leaves * spines
    for j in range(leaves):
        down = sum(g.edges[f"leaf{j}", v]["bandwidth"] for v in g.successors(f"leaf{j}")
                   if g.nodes[v]["kind"] == "gpu")
        up = sum(g.edges[f"leaf{j}", f"spine{s}"]["bandwidth"] for s in range(spines))
        assert down == nodes // leaves * per_node * NIC_BW
        assert up == pytest.approx(down / ratio, rel=1e-15)      # uplink = downlink / ratio
    assert g.edges["n0.gpu0", "n0.nvswitch"]["bandwidth"] == NVLINK_BW


def test_rail_optimized_puts_gpu_i_of_every_node_on_rail_i():
    g = rail_optimized(nodes=4, gpus_per_node=8)
    assert len(gpus(g)) == 32 and g.number_of_nodes() == 32 + 4 + 8
    assert cables(g) == 32 + 32
    for i in range(8):
        assert sorted(g.successors(f"rail{i}")) == [f"n{k}.gpu{i}" for k in range(4)]


def test_ring_and_torus():
    assert cables(ring(8)) == 8 and cables(ring(2)) == 1
    g = torus2d(4, 6)
    assert len(gpus(g)) == 24 and cables(g) == 2 * 24
    assert all(g.out_degree(v) == 4 for v in g)
    assert cables(torus2d(2, 5)) == 5 + 10      # a side of 2: one cable between the two rows


# -- routing ------------------------------------------------------------------------------

def test_routes_are_cheapest_paths_and_stay_on_nvlink_inside_a_node():
    g = fat_tree(nodes=8, gpus_per_node=4, leaves=2, spines=3, oversubscription=2)
    r = Routing(g)
    names = gpus(g)
    for a in names[::3]:
        for b in names[::5]:
            if a == b:
                continue
            p = r.path(a, b)
            assert p[0] == a and p[-1] == b and all(g.has_edge(u, v) for u, v in zip(p, p[1:]))
            cost_ = sum(g.edges[u, v]["weight"] for u, v in zip(p, p[1:]))
            assert cost_ == nx.shortest_path_length(g, a, b, weight="weight")
    assert r.path("n0.gpu0", "n0.gpu3") == ["n0.gpu0", "n0.nvswitch", "n0.gpu3"]
    assert r.path("n0.gpu0", "n4.gpu1")[2].startswith("spine")       # other leaf: via a spine


def test_ecmp_is_deterministic_and_spreads_flows_over_the_spines():
    g = fat_tree(nodes=16, gpus_per_node=1, leaves=2, spines=4)
    left, right = gpus(g)[:8], gpus(g)[8:]
    pairs = [(a, b) for a in left for b in right]
    spine = [Routing(g).path(a, b)[2] for a, b in pairs]
    assert spine == [Routing(g).path(a, b)[2] for a, b in pairs]     # same in a fresh router
    counts = {s: spine.count(s) for s in set(spine)}
    assert sorted(counts) == [f"spine{s}" for s in range(4)]
    assert max(counts.values()) <= 2 * len(pairs) / 4                 # 64 flows, none gets 32
    # A flow id is part of the hash: one pair's flows spread too.
    assert len({Routing(g).path(left[0], right[0], flow=f)[2] for f in range(16)}) == 4


def test_ecmp_does_not_depend_on_pythons_hash_seed():
    code = ("from ringlab.cost.topology import Routing, fat_tree; g = fat_tree(8, 1, 2, 4); "
            "r = Routing(g); print([r.path(f'n{a}.gpu0', f'n{b}.gpu0')[2] "
            "for a in range(4) for b in range(4, 8)])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONHASHSEED": seed, "PYTHONPATH": ":".join(sys.path)},
                           check=True).stdout for seed in ("1", "2")}
    assert len(outs) == 1


# -- max-min fairness ------------------------------------------------------------------------

def test_two_flows_on_one_link_get_half_each():
    assert max_min_fair({0: ["l"], 1: ["l"]}, {"l": 8.0}) == {0: 4.0, 1: 4.0}


def test_the_parking_lot():
    """Three links in a row with capacities 1, 2, 3; flow 0 crosses all three,
    flows 1, 2, 3 one each. Link a fills first (fair share 1/2): flows 0 and 1
    get 1/2. Flow 2 then has b's 2 - 1/2 = 3/2, flow 3 has c's 3 - 1/2 = 5/2."""
    rates = max_min_fair({0: "abc", 1: "a", 2: "b", 3: "c"}, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert rates == {0: 0.5, 1: 0.5, 2: 1.5, 3: 2.5}


def bottlenecked(routes, capacity, rates, tol=1e-9):
    """Max-min fairness, by its definition: rates are feasible, and every flow
    crosses a full link on which no flow is faster than it."""
    load = {}
    for f, links in routes.items():
        for link in links:
            load[link] = load.get(link, 0.0) + rates[f]
    if any(load[l] > capacity[l] * (1 + tol) for l in load):
        return False
    return all(any(load[l] >= capacity[l] * (1 - tol)
                   and all(rates[g] <= rates[f] * (1 + tol) for g in routes if l in routes[g])
                   for l in links)
               for f, links in routes.items())


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 6), st.integers(1, 12))
def test_progressive_filling_gives_every_flow_a_bottleneck(seed, n_links, n_flows):
    rng = np.random.default_rng(seed)
    capacity = {l: float(rng.integers(1, 10)) for l in range(n_links)}
    routes = {f: sorted(set(rng.choice(n_links, size=rng.integers(1, n_links + 1)).tolist()))
              for f in range(n_flows)}
    rates = max_min_fair(routes, capacity)
    assert bottlenecked(routes, capacity, rates)


def test_flowsim_a_later_flow_slows_an_earlier_one():
    """Link of 10 B/s. Flow a: 30 bytes at t=0. Flow b: 10 bytes at t=1.
    a alone for 1 s (10 bytes, 20 left); then 5 B/s each: b's 10 bytes take
    2 s (drained at 3), a has 10 left and finishes alone at 10 B/s: at 4.
    Each arrives its latency (0.25 s) after its last byte left."""
    sim = FlowSim([10.0])
    a = sim.add((0,), 10.0, 0.25, 30, 0.0, "a")
    assert a.end == 3.25                      # alone: what it would be if nobody came
    assert sim.next_time() == 3.0
    b = sim.add((0,), 10.0, 0.25, 10, 1.0, "b")
    assert sim.next_time() == math.nextafter(1.0, 2)     # b joins after all sends at t=1
    sim.advance(sim.next_time())
    assert (a.end, b.end) == (5.25, 3.25)     # predicted while both share: 20 bytes at 5 B/s
    while (t := sim.next_time()) is not None:
        sim.advance(t)
    assert (a.end, b.end) == (4.25, 3.25)


# -- runs on a topology -------------------------------------------------------------------

ALPHA, BETA = 2e-6, 2.0 ** -30          # 1 GiB/s: n / bandwidth == n * beta exactly


def nonblocking(n):
    """n ranks, each on its own NVSwitch port; 2 hops of alpha / 2."""
    return Topology(nvswitch_node(gpus=n, bw=1 / BETA, lat=ALPHA / 2))


@pytest.mark.parametrize("n", range(2, 17))
def test_nonblocking_ring_allreduce_and_allgather_equal_alpha_beta(n):
    for size in (n * 64, n * 1000, n * 4096 + 8 * (n - 1)):
        xs = [np.full(size // 8, float(r)) for r in range(n)]
        res = ringlab.run(ring_allreduce, xs, network=nonblocking(n))
        ab = ringlab.run(ring_allreduce, xs, network=AlphaBeta(ALPHA, BETA))
        assert [(e.start, e.end) for e in res.trace] == [(e.start, e.end) for e in ab.trace]
        assert [(s.t_start, s.t_end) for s in res.trace.spans] == \
            [(s.t_start, s.t_end) for s in ab.trace.spans]
        assert res.time == ab.time
        if size % (8 * n) == 0:        # chunks of n/N bytes: 2(N-1)(alpha + n/N beta)
            assert res.time == pytest.approx(2 * (n - 1) * (ALPHA + size / n * BETA), rel=1e-12)
        np.testing.assert_array_equal(res.outputs[0], ab.outputs[0])
    size = n * 512
    blocks = [np.full(size // n // 8, float(r)) for r in range(n)]
    res = ringlab.run(ring_allgather, blocks, network=nonblocking(n))
    assert res.time == pytest.approx((n - 1) * (ALPHA + size / n * BETA), rel=1e-12)
    assert res.time == ringlab.run(ring_allgather, blocks, network=AlphaBeta(ALPHA, BETA)).time


@pytest.mark.parametrize("n", range(2, 17))
@pytest.mark.parametrize("bcast", [binomial_broadcast, tree_broadcast])
def test_nonblocking_tree_broadcasts_equal_alpha_beta(n, bcast):
    size = 8000
    xs = [np.arange(size / 8)] + [None] * (n - 1)
    res = ringlab.run(bcast, xs, network=nonblocking(n))
    steps = getattr(cost, bcast.__name__)(n, size).steps
    assert res.time == pytest.approx(steps * (ALPHA + size * BETA), rel=1e-12)
    ab = ringlab.run(bcast, xs, network=AlphaBeta(ALPHA, BETA))
    assert [(e.start, e.end) for e in res.trace] == [(e.start, e.end) for e in ab.trace]


def test_default_nvlink_numbers_match_alpha_beta_to_rounding():
    n, size = 8, 8 * 2 ** 16
    xs = [np.ones(size // 8)] * n
    res = ringlab.run(ring_allreduce, xs, network=Topology(nvswitch_node(n)))
    alpha = 2 * 0.5e-6                  # two NVLink hops
    assert res.time == pytest.approx(2 * (n - 1) * (alpha + size / n / NVLINK_BW), rel=1e-12)


def fan_in(comm, n):
    if comm.rank == 0:
        for r in comm.irecv(1), comm.irecv(2):
            r.wait()
    elif comm.rank in (1, 2):
        comm.send(np.zeros(n), 0)


def test_two_messages_into_one_gpu_share_its_link():
    """Both cross rank 0's link from the switch: 8000 bytes at half of 1e9 B/s:
    16 us each, where the one-port AlphaBeta queues them (8 us, then 16 us)."""
    net = Topology(nvswitch_node(gpus=3, bw=1e9, lat=0.0))
    res = ringlab.run(fan_in, [1000] * 3, network=net)
    assert [round(e.end * 1e6, 9) for e in res.trace] == [16.0, 16.0]
    ab = ringlab.run(fan_in, [1000] * 3, network=AlphaBeta(0.0, 1e-9))
    assert sorted(round(e.end * 1e6, 9) for e in ab.trace) == [8.0, 16.0]


def hand_worked(comm, n):
    """Rank 0 sends n float64 to rank 2; rank 1 sends n/2 to rank 3 and n to rank 0."""
    r = comm.rank
    reqs = {0: lambda: [comm.isend(np.zeros(n), 2), comm.irecv(1)],
            1: lambda: [comm.isend(np.zeros(n // 2), 3), comm.isend(np.zeros(n), 0)],
            2: lambda: [comm.irecv(0)], 3: lambda: [comm.irecv(1)]}[r]()
    for q in reqs:
        q.wait()
    return comm.time


@pytest.mark.parametrize("ratio", [1, 2])
def test_hand_worked_oversubscribed_fat_tree(ratio):
    """4 servers of 1 GPU, 2 per leaf, 1 spine, NICs of B bytes/s, no latency.
    Leaf 0 holds GPUs 0 and 1, leaf 1 GPUs 2 and 3; the uplink is 2B / ratio.
    Flows, all sent at t = 0 (S = 8n bytes):
      f1: 0 -> 2, S bytes     (0's NIC, leaf0 -> spine -> leaf1, 2's NIC)
      f2: 1 -> 3, S/2 bytes   (1's NIC, leaf0 -> spine -> leaf1, 3's NIC)
      f3: 1 -> 0, S bytes     (1's NIC, 0's NIC down)
    1's NIC carries f2 and f3: B/2 each.
    ratio 2: the uplink (B) carries f1 and f2: B/2 each too. At t = (S/2)/(B/2)
      = S/B, f2 is done; f1 and f3 have S/2 left, alone at B: end at 1.5 S/B.
    ratio 1: the uplink (2B) is no bottleneck; f1 gets its NIC's B and ends at
      S/B, with f2 (S/2 at B/2); then f3 has S/2 left, alone: ends at 1.5 S/B.
    """
    B, n = 1e9, 2 ** 17
    S = 8 * n
    g = fat_tree(nodes=4, gpus_per_node=1, leaves=2, spines=1, oversubscription=ratio,
                 nic_bw=B, lat=0.0)
    assert g.edges["leaf0", "spine0"]["bandwidth"] == 2 * B / ratio
    res = ringlab.run(hand_worked, [n] * 4, network=Topology(g))
    ends = {(e.src, e.dst): e.end for e in res.trace}
    f1 = 1.5 * S / B if ratio == 2 else S / B
    assert ends[0, 2] == pytest.approx(f1, rel=1e-12)
    assert ends[1, 3] == pytest.approx(S / B, rel=1e-12)
    assert ends[1, 0] == pytest.approx(1.5 * S / B, rel=1e-12)
    assert res.outputs == [pytest.approx(t, rel=1e-12) for t in (1.5 * S / B, 1.5 * S / B, f1,
                                                                  S / B)]


def late_sender(comm, n):
    """Rank 0 sends at t = 0; rank 1 computes 1 s, then sends; both to rank 2."""
    if comm.rank == 0:
        comm.send(np.zeros(n), 2)
    elif comm.rank == 1:
        comm.compute(1.0)
        comm.send(np.zeros(n // 3), 2)
    else:
        for r in comm.irecv(0), comm.irecv(1):
            r.wait()


def test_a_message_sent_later_slows_one_already_on_the_wire():
    """Rank 2's link, 1000 B/s. Rank 0's 3000 bytes: alone for 1 s (1000 bytes),
    then shared with rank 1's 1000 bytes at 500 B/s each: those take 2 s (until
    t = 3), when rank 0's has 1000 left, alone again: it arrives at t = 4 (not 3)."""
    net = Topology(nvswitch_node(gpus=3, bw=1000.0, lat=0.0))
    res = ringlab.run(late_sender, [375] * 3, network=net)
    ends = {e.src: e.end for e in res.trace}
    assert ends == {0: pytest.approx(4.0, rel=1e-12), 1: pytest.approx(3.0, rel=1e-12)}
    # The sender's send returned when its message arrived.
    assert res.time == pytest.approx(4.0, rel=1e-12)


def test_replaying_the_trace_gives_the_same_arrivals():
    """The run ends each flow when the scheduler reaches it; an offline flow
    simulation of the same sends (times from the trace) must agree."""
    net = Topology(fat_tree(nodes=8, gpus_per_node=2, leaves=2, spines=2, oversubscription=4))
    placement = [gpus(net.graph)[(7 * i) % 16] for i in range(16)]   # neighbours far apart
    net = Topology(net.graph, placement)
    xs = [np.ones(4099)] * 16
    res = ringlab.run(ring_allreduce, xs, network=net)
    ends, loads = net.flows_of(res.trace)
    assert ends == pytest.approx([e.end for e in res.trace], rel=1e-9)
    top = max(max(load for _, load in series) / net.capacity[k] for k, series in loads.items())
    assert top == pytest.approx(1.0)          # some link ran full, none over


def random_traffic(comm, plan):
    """Rank r computes plan[r][0] seconds, isends plan[r][1] (a list of
    (dst, float64 count)), then receives what the plan sends it, in order."""
    wait, sends = plan[comm.rank]
    comm.compute(wait)
    reqs = [comm.isend(np.zeros(k), dst) for dst, k in sends]
    for src in range(comm.world_size):
        for dst, _ in plan[src][1]:
            if dst == comm.rank:
                comm.recv(src)
    for r in reqs:
        r.wait()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10 ** 6))
def test_any_traffic_is_never_faster_than_an_idle_network_and_replays(seed):
    rng = np.random.default_rng(seed)
    n = 8
    plan = [(float(rng.choice([0, 1e-6, 3e-6])),
             [(int(d), int(rng.integers(0, 5000))) for d in rng.choice(
                 [q for q in range(n) if q != r], size=rng.integers(0, 4))])
            for r in range(n)]
    net = Topology(fat_tree(nodes=4, gpus_per_node=2, leaves=2, spines=2,
                            oversubscription=float(rng.choice([1, 3]))), alpha=1e-7)
    res = ringlab.run(random_traffic, [plan] * n, network=net)
    for e in res.trace:
        _, cap, lat = net.route(e.src, e.dst)
        assert e.end >= e.start + lat + e.nbytes / cap - 1e-15       # alone, it takes this
    ends, loads = net.flows_of(res.trace)
    assert ends == pytest.approx([e.end for e in res.trace], rel=1e-12)
    for link, series in loads.items():
        assert all(0 <= load <= net.capacity[link] * (1 + 1e-12) for _, load in series)


def test_placement_keeping_ring_neighbours_under_one_leaf_is_faster():
    """32 GPUs, 4 leaves of 8, oversubscribed 4:1. Ranks in leaf order: 4 ring
    hops cross the spines. Ranks dealt round-robin over the leaves: all 32 do,
    and share the thin uplinks (a leaf's 8 NICs, 400 GB/s, have 100 GB/s up).
    Messages of 256 KiB (scale=64), so that bandwidth matters next to latency."""
    g = fat_tree(nodes=32, gpus_per_node=1, leaves=4, spines=2, oversubscription=4)
    xs = [np.ones(2 ** 14)] * 32
    blocked = ringlab.run(ring_allreduce, xs, network=Topology(g, scale=64)).time
    dealt = [gpus(g)[(i % 4) * 8 + i // 4] for i in range(32)]
    scattered = ringlab.run(ring_allreduce, xs, network=Topology(g, dealt, scale=64)).time
    assert blocked < scattered / 2


def test_scale_prices_messages_as_bigger_ones():
    xs = [np.ones(1024)] * 4
    big = [np.ones(8 * 1024)] * 4
    g = fat_tree(nodes=2, gpus_per_node=2, leaves=2, spines=1, oversubscription=2)
    small = ringlab.run(ring_allreduce, xs, network=Topology(g, scale=8))
    full = ringlab.run(ring_allreduce, big, network=Topology(g))
    assert small.time == pytest.approx(full.time, rel=1e-12)
    assert small.trace.total_bytes * 8 == full.trace.total_bytes


# -- unchanged programs, modes, failures ------------------------------------------------------

def test_zero1_adam_runs_unchanged_on_a_fat_tree():
    from ringlab.zero import zero1_adam
    data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=3, seed=1)
    batches = [b for _, b in zip(range(2), data.batches(10, seed=2))]
    kw = dict(sizes=[4, 7, 3], seed=0, lr=0.01, flops_per_second=1e9)
    net = Topology(fat_tree(nodes=2, gpus_per_node=2, leaves=2, spines=1, oversubscription=2))
    res = ringlab.run(zero1_adam, [batches] * 4, kwargs=kw, network=net)
    plain = ringlab.run(zero1_adam, [batches] * 4, kwargs=kw)
    for a, b in zip(res.outputs, plain.outputs):
        np.testing.assert_array_equal(a[1], b[1])
    assert [(e.src, e.dst, e.step) for e in res.trace] == \
        [(e.src, e.dst, e.step) for e in plain.trace]
    assert all(e.start <= e.end for e in res.trace) and res.time > 0
    assert all(s.t_start <= s.t_end <= res.time for s in res.trace.spans)


def test_zero2_overlaps_on_the_comm_stream_with_a_topology():
    from ringlab.zero import data_parallel_adam, zero2_adam
    data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=16, out=4, seed=1)
    batches = [b for _, b in zip(range(2), data.batches(32, seed=2))]
    kw = dict(sizes=[16, 32, 32, 4], seed=0, lr=0.01, cap_bytes=2048, flops_per_second=1e9)
    net = Topology(rail_optimized(nodes=2, gpus_per_node=2))
    res = ringlab.run(zero2_adam, [batches] * 4, kwargs=kw, network=net)
    dp = ringlab.run(data_parallel_adam, [batches] * 4,
                     kwargs=dict(sizes=kw["sizes"], seed=0, lr=0.01)).outputs[0][1]
    assert np.allclose(res.outputs[0][1], dp, rtol=0, atol=1e-12)
    assert any(s.stream == 1 for s in res.trace.spans)


def test_rendezvous_mode_and_recv_any_on_a_torus():
    def gather_any(comm, x):
        if comm.rank == 0:
            return sorted(comm.recv_any()[0] for _ in range(comm.world_size - 1))
        comm.compute(1e-6 * comm.rank)
        comm.send(x, 0)

    net = Topology(torus2d(2, 3), alpha=1e-6)
    res = ringlab.run(gather_any, [np.ones(100)] * 6, network=net)
    assert res.outputs[0] == [1, 2, 3, 4, 5]
    xs = [np.ones(300)] * 6
    ren = ringlab.run(ring_allreduce, xs, network=net, mode="rendezvous")
    buf = ringlab.run(ring_allreduce, xs, network=net)
    assert ren.time == pytest.approx(buf.time, rel=1e-12)   # a ring's sendrecv waits anyway


def test_deadlock_on_a_topology_is_reported():
    def both_receive(comm, x):
        comm.recv(1 - comm.rank)

    with pytest.raises(ringlab.DeadlockError):
        ringlab.run(both_receive, [None] * 2, network=Topology(ring(2)))


def test_an_error_with_messages_on_the_wire_is_reported():
    def bad(comm, x):
        comm.isend(x, (comm.rank + 1) % comm.world_size)
        if comm.rank == 2:
            comm.compute(1e-9)
            raise ValueError("boom")
        comm.recv((comm.rank - 1) % comm.world_size)
        comm.recv((comm.rank - 1) % comm.world_size)

    with pytest.raises(ringlab.RankError, match="rank 2 raised ValueError"):
        ringlab.run(bad, [np.ones(1000)] * 4, network=Topology(fat_tree(2, 2, 2, 1)))


def test_bad_placements_are_clear_errors():
    g = nvswitch_node(4)
    with pytest.raises(ValueError, match="not a GPU"):
        Topology(g, ["n0.nvswitch"])
    with pytest.raises(ValueError, match="two ranks on GPU"):
        Topology(g, ["n0.gpu1", "n0.gpu1"])
    with pytest.raises(ValueError, match="5 ranks but the placement only 4 GPUs"):
        ringlab.run(ring_allreduce, [np.ones(4)] * 5, network=Topology(g))


def test_link_utilisation_as_perfetto_counters():
    B, n = 1e9, 2 ** 17
    g = fat_tree(nodes=4, gpus_per_node=1, leaves=2, spines=1, oversubscription=2,
                 nic_bw=B, lat=0.0)
    net = Topology(g)
    res = ringlab.run(hand_worked, [n] * 4, network=net)
    doc = net.to_chrome_trace(res.trace)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["cat"] == "link"]
    tracks = {e["name"] for e in counters}
    assert "leaf0->spine0" in tracks and "spine0->leaf0" not in tracks    # busy links only
    up = [(e["ts"], e["args"]["utilisation %"]) for e in counters if e["name"] == "leaf0->spine0"]
    # f1 and f2 fill the uplink (B) until f2 ends at S/B; f1 alone fills it until 1.5 S/B.
    S = 8 * n
    assert up == [(0.0, 100.0), (pytest.approx(1.5 * S / B * 1e6), 0.0)]
    assert all(0 <= e["args"]["utilisation %"] <= 100 + 1e-9 for e in counters)
    assert any(e["ph"] == "X" for e in doc["traceEvents"])     # the run's own tracks are there


def test_pipeline_schedules_run_unchanged_on_a_rail_optimized_cluster():
    from ringlab.nn import mlp_model, mse
    from ringlab.pipeline import run_pipeline, schedules
    model = mlp_model([3] * 5, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    batch = rng.normal(size=(8, 3)), rng.normal(size=(8, 3))
    net = Topology(rail_optimized(nodes=2, gpus_per_node=2), alpha=1e-6)
    res = run_pipeline(model, batch, schedules.one_f_one_b(4, 4), network=net)
    plain = run_pipeline(model, batch, schedules.one_f_one_b(4, 4))
    for name, g in plain.grads.items():
        np.testing.assert_array_equal(res.grads[name], g)


def ddp_step_on_a_fat_tree(sync, **extra):
    """One data-parallel step of a 5-linear-layer MLP (16 x 16, batch 32) on 2 nodes
    of 2 GPUs, one leaf per node, one spine, 1 GB/s NICs, alpha = 1 us."""
    from ringlab.data_parallel.buckets import training_step
    from ringlab.nn import mlp_model
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((32, 16)), rng.standard_normal((32, 16))) for _ in range(4)]
    kw = dict(model_fn=lambda: mlp_model([16] * 6, np.random.default_rng(0)),
              flops_per_second=1e9, sync=sync)
    net = Topology(fat_tree(nodes=2, gpus_per_node=2, leaves=2, spines=1, oversubscription=2,
                            nic_bw=1e9), alpha=1e-6)
    return ringlab.run(training_step, data, network=net, kwargs=dict(kw, **extra))


def test_ddp_buckets_still_beat_one_flat_allreduce_on_a_fat_tree():
    from ringlab.data_parallel.buckets import ddp_sync, sync_flat
    flat = ddp_step_on_a_fat_tree(sync_flat)
    ddp = ddp_step_on_a_fat_tree(ddp_sync, cap_bytes=2048, first_bucket_bytes=2048)
    assert np.allclose(flat.outputs[0], ddp.outputs[0], rtol=1e-12, atol=1e-15)
    assert ddp.time < flat.time


def test_ddp_buckets_on_a_fat_tree_queue_on_the_stream_worked_by_hand():
    """Each layer's weight and bias (272 float64s, 2176 bytes) is a bucket: 5 AllReduces
    on the communication stream, in order. One takes 6 ring steps of 544 bytes, each as
    long as the inter-node message: alpha + 4 network hops of 1 us + 544 B / 1 GB/s (the
    two inter-node flows go opposite ways, so they share no link). That is longer than a
    layer's backward, so each bucket waits for the one before it, not for its gradients."""
    from ringlab.data_parallel.buckets import ddp_sync
    res = ddp_step_on_a_fat_tree(ddp_sync, cap_bytes=2048, first_bucket_bytes=2048)
    forward = 2 * 32 * 16 * 16 / 1e9                         # one linear layer's forward
    backward = 2 * forward
    allreduce = 6 * (1e-6 + 4 * 1e-6 + 544 / 1e9)
    assert allreduce > backward
    first_ready = 5 * forward + backward
    starts = sorted(s.t_start for s in res.trace.spans if s.rank == 0 and s.stream == 1)
    assert starts == [pytest.approx(first_ready + k * allreduce, rel=1e-12) for k in range(5)]
    assert res.time == pytest.approx(first_ready + 5 * allreduce, rel=1e-12)
