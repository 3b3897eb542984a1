"""The fast max-min solver and flow simulator against the readable ones, bit for bit.

References: ``max_min_fair`` (the progressive filling the book teaches, which
looks at every link in every round) and ``tests/support/reference_flowsim.py``
(``FlowSim`` as it was before its fast path). Floats are compared with ``==``:
a run's trace must stay bit-identical, so near is not enough."""

import math

from hypothesis import given, settings, strategies as st

from ringlab.cost.topology import FlowSim
from ringlab.cost.topology.flows import fair_shares, max_min_fair
from support import reference_flowsim

# Capacities whose fair shares tie (several links fill in one round), nearly tie
# (0.3 / 3 is 0.09999999999999999, not 0.1: a solver that rounds differently
# shows), and do not.
CAPACITIES = (st.sampled_from([1.0, 2.0, 3.0, 0.5, 0.1, 0.2, 0.3, 0.6, 0.7, 0.9, 1 / 3,
                               50e9, 100e9])
              | st.floats(0.01, 100.0))


@st.composite
def networks(draw, max_flows=14):
    """``(routes, capacity)``: up to 8 links, flows crossing up to 4 of them."""
    n_links = draw(st.integers(1, 8))
    capacity = [draw(CAPACITIES) for _ in range(n_links)]
    link = st.integers(0, n_links - 1)
    flows = draw(st.lists(st.lists(link, unique=True, max_size=4), min_size=1,
                          max_size=max_flows))
    return dict(enumerate(flows)), capacity


def rounds(routes, capacity):
    """How many distinct rates ``max_min_fair`` gives (a lower bound on its rounds)."""
    return len(set(max_min_fair(routes, capacity).values()))


@settings(max_examples=400, deadline=None)
@given(networks())
def test_fair_shares_are_max_min_fairs_floats(net):
    routes, capacity = net
    want = max_min_fair(routes, capacity)
    got = fair_shares(routes, capacity)
    assert got == want, (f"fair_shares differs from max_min_fair for routes {routes}, "
                         f"capacity {capacity}: {got} != {want}")
    assert list(got) == list(routes)                      # in the order of the flows, as there
    # The same with links named by strings, capacities in a dict.
    named = {f: [f"l{i}" for i in links] for f, links in routes.items()}
    caps = {f"l{i}": c for i, c in enumerate(capacity)}
    assert fair_shares(named, caps) == want


def test_fair_shares_of_the_parking_lot_and_of_several_rounds():
    """The parking lot of test_topology (rates 1/2, 1/2, 3/2, 5/2: three rounds),
    and a chain where each round frees capacity for the next: link x (4 B/s)
    carries flows 0, 1, 2; link y (1 B/s) carries 0; link z (1.25 B/s) 1.
    Round 1: shares 4/3, 1, 1.25: y fills, flow 0 gets 1; round 2: x has 3
    left for two flows (1.5), z 1.25 for one: z fills, flow 1 gets 1.25;
    round 3: flow 2 gets x's 1.75."""
    routes = {0: "abc", 1: "a", 2: "b", 3: "c"}
    capacity = {"a": 1.0, "b": 2.0, "c": 3.0}
    assert fair_shares(routes, capacity) == {0: 0.5, 1: 0.5, 2: 1.5, 3: 2.5}
    chain = {0: "xy", 1: "xz", 2: "x"}
    assert fair_shares(chain, {"x": 4.0, "y": 1.0, "z": 1.25}) == {0: 1.0, 1: 1.25, 2: 1.75}
    assert fair_shares({"idle": [], "a": ["l"]}, {"l": 4}) == {"idle": math.inf, "a": 4.0}


def test_the_random_networks_need_several_rounds_often():
    """The strategy above is no easy case: many of its networks take several
    rounds (so the heap of ``fill`` is exercised, not only its first round)."""
    seen = []

    @settings(max_examples=200, deadline=None, database=None)
    @given(networks())
    def count(net):
        seen.append(rounds(*net))
    count()
    assert sum(r >= 3 for r in seen) >= 20, f"only {sum(r >= 3 for r in seen)} of 200"


# -- the flow simulator ----------------------------------------------------------------

@st.composite
def traffic(draw):
    """``(capacity, sends)``: flows sent at nondecreasing times, several often at
    one instant, of sizes that often tie (so that several end at one instant)."""
    routes, capacity = draw(networks(max_flows=24))
    sends, t = [], 0.0
    for k, links in routes.items():
        t += draw(st.sampled_from([0.0, 0.0, 0.5, 1.0]) | st.floats(0.0, 3.0))
        nbytes = draw(st.sampled_from([0, 1, 10, 30]) | st.floats(0.0, 100.0))
        latency = draw(st.sampled_from([0.0, 0.25]) | st.floats(0.0, 1.0))
        sends.append((t, tuple(links), nbytes, latency))
    return capacity, sends


def drive(Sim, capacity, sends):
    """Everything a ``FlowSim`` says while it carries ``sends``: each flow's state
    after every step, the arrivals in the order announced, the link loads."""
    said, states, flows = [], [], []
    sim = Sim(capacity, on_end=lambda token, end: said.append((token, end)), record=True)

    def state(what):
        states.append((what, sim.next_time(),
                       [(f.rate, f.rem, f.base, f.drain, f.end) for f in flows]))

    for k, (start, links, nbytes, latency) in enumerate(sends):
        while (t := sim.next_time()) is not None and t <= start:
            sim.advance(t)
            state(("advance", t))
        slowest = min((capacity[link] for link in links), default=math.inf)
        flows.append(sim.add(links, slowest, latency, nbytes, start, k))
        state(("add", k))
    while (t := sim.next_time()) is not None:
        sim.advance(t)
        state(("advance", t))
    return said, states, sim.loads


@settings(max_examples=300, deadline=None)
@given(traffic())
def test_flowsim_gives_the_reference_rates_and_times(net):
    capacity, sends = net
    said, states, loads = drive(FlowSim, capacity, sends)
    want_said, want_states, want_loads = drive(reference_flowsim.FlowSim, capacity, sends)
    for (what, t, flows), (want_what, want_t, want_flows) in zip(states, want_states):
        assert (what, t) == (want_what, want_t), f"steps differ: {what} at {t}, " \
                                                 f"the reference {want_what} at {want_t}"
        for k, (got, want) in enumerate(zip(flows, want_flows)):
            assert got == want, (f"after {what}, flow {k} (links {sends[k][1]}) has "
                                 f"(rate, rem, base, drain, end) {got}, the reference {want}")
    assert len(states) == len(want_states)
    assert said == want_said                    # the same arrivals, announced in the same order
    assert loads == want_loads


def test_flowsim_a_near_tie_is_not_a_tie():
    """Link A (0.3 B/s) carries flows 0, 1, 2; link B (0.1 B/s) flow 3; link C
    (100 B/s) flows 0 and 3, so all four are one group. A's fair share is
    0.3 / 3 = 0.09999999999999999, B's 0.1: one ulp more. A fills first; flow 3
    then gets all of B, 0.1, in a second round (not A's share)."""
    for Sim in (FlowSim, reference_flowsim.FlowSim):
        sim = Sim([0.3, 0.1, 100.0])
        routes = [(0, 2), (0,), (0,), (1, 2)]
        flows = [sim.add(links, 0.1, 0.0, 1.0, 0.0, k) for k, links in enumerate(routes)]
        sim.advance(sim.next_time())          # they join their links together
        assert [f.rate for f in flows] == [0.3 / 3] * 3 + [0.1], Sim.__module__
        assert 0.3 / 3 != 0.1
