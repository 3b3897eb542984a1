"""A topology as the ``network=`` of a run: messages are flows that share links.

``Topology(graph, placement)`` puts rank ``i`` on GPU ``placement[i]`` of a
graph from ``ringlab.cost.topology.graphs`` (default: the ``i``-th GPU). As the
``network=`` of ``ringlab.run`` every message becomes a **flow** along its route
(``ringlab.cost.topology.routing``), and the flows on the wire share the links
max-min fairly (``ringlab.cost.topology.flows``): the flow-level model of
SimGrid's network models. So any program gets a time that includes
contention::

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> from ringlab.cost.topology import Topology, nvswitch_node
    >>> net = Topology(nvswitch_node(gpus=4, bw=1e9, lat=0.0), alpha=1e-5)
    >>> res = ringlab.run(ring_allreduce, [np.ones(4000)] * 4, network=net)
    >>> round(res.time * 1e6, 3)       # 6 steps of (alpha + 8000 bytes / 1e9), as AlphaBeta
    108.0

What a message costs. A message of ``n`` bytes sent at time ``t``:

1. streams through every link of its route at once, from ``t`` on, at the
   rate its fair share gives it (bytes flow through a switch without waiting
   for the whole message: cut-through, the flow-level view); rates change
   whenever a flow joins or leaves a link it shares, and progressive filling
   recomputes them for the flows connected to that link;
2. arrives its **latency** after its last byte left: ``alpha`` (per message,
   as AlphaBeta's) plus the latencies of the links of its route. That is
   ``event.end``; the sender's ``send`` returns then too (as on AlphaBeta,
   a blocking send here returns once the message is through).

On its own a message takes ``latency + n / (slowest link)``: on a non-blocking
topology where every rank has its own link pair, with link latency
``alpha / 2`` (or 0 and ``alpha=``) and bandwidth ``1 / beta``, every time
equals ``AlphaBeta(alpha, beta)``'s. Links are **full duplex** (one capacity
per direction). There is no one-port rule: a GPU's link to its switch (its
NVLink, its NIC) is a link of the graph, so two messages a GPU sends at once
share it, each at half speed, instead of queueing one after the other. Steps
(``event.step``) are still those of the one-port model: a logical clock.

How arrival times are made exact. Under max-min sharing a flow's end depends on
flows that start *after* it (they take part of its links), so it cannot be
known when the message is sent. The simulator runs ranks in simulated-time
order; this network is one more actor of that scheduler (``ringlab.sim.world``),
with two kinds of events:

* the messages sent at time ``t`` join their links together, once every rank
  has sent what it sends at ``t`` and before anything later (the network runs
  at the next float after ``t``): one re-share for all of them;
* the earliest moment a flow's last byte leaves its links. The network runs
  then only once every rank has reached that time, so no message still to be
  sent can start before it and change it. It ends the flows due (their
  arrival, that moment plus the latency, is now certain: the waiting ranks
  wake then), and re-shares the links they leave.

Re-sharing recomputes the rates of the flows connected to a changed link
through shared links (max-min rates of separate groups do not depend on each
other); a flow alone on its links simply gets the slowest one. Between events
every rate is constant, so the times are exact up to floating point; a flow
never disturbed arrives at ``t + (latency + n / bandwidth)``, AlphaBeta's
``t + (alpha + beta n)`` to the last bit when ``n / bandwidth == beta n``
(a power-of-two bandwidth). ``flows_of(trace)`` replays the same flows offline
from the trace's send times, and gets the same arrivals (a test checks it).

A sizes-only mode for big runs: ``scale=k`` prices every message as ``k`` times
its bytes, so a run with small arrays takes the time of one with ``k`` times
larger ones (its outputs are those of the small arrays; ``event.nbytes`` too).

Link utilisation: ``link_loads(trace)`` replays the trace's flows (their send
times are in the trace) and returns each link's rate over time;
``chrome_counters(trace)`` / ``to_chrome_trace(trace)`` add them to a Perfetto
export as counter tracks, one per busy link.
"""

from __future__ import annotations

import heapq
import math

from .flows import fill
from .graphs import gpus
from .routing import Routing


class Topology:
    """A network of GPUs and switches with ranks placed on its GPUs.

    ``graph``: a ``networkx.DiGraph`` with ``kind`` on nodes and ``bandwidth``
    (bytes/s), ``latency`` (s) and ``weight`` on links (see ``graphs``).
    ``placement``: the GPU node of each rank (default: the GPUs in order).
    ``alpha``: seconds added to every message's latency. ``scale``: see above.
    """

    def __init__(self, graph, placement=None, *, alpha=0.0, scale=1.0, weight="weight"):
        self.graph = graph
        all_gpus = gpus(graph)
        self.placement = list(all_gpus if placement is None else placement)
        kinds = dict(graph.nodes(data="kind"))
        for rank, node in enumerate(self.placement):
            if kinds.get(node) != "gpu":
                more = " ..." if len(all_gpus) > 4 else ""
                raise ValueError(f"Topology: placement[{rank}] = {node!r} is not a GPU of the "
                                 f"network (GPUs: {all_gpus[:4]}{more})")
        if len(set(self.placement)) != len(self.placement):
            dup = next(n for n in self.placement if self.placement.count(n) > 1)
            raise ValueError(f"Topology: placement puts two ranks on GPU {dup!r}; one rank per GPU")
        if not (alpha >= 0 and scale > 0):
            raise ValueError(f"Topology: needs alpha >= 0 and scale > 0, got {alpha!r}, {scale!r}")
        self.alpha, self.scale = float(alpha), float(scale)
        self.routing = Routing(graph, weight)
        self.links = list(graph.edges)                      # link id -> (u, v)
        self.link_id = {uv: i for i, uv in enumerate(self.links)}
        self.capacity = [float(graph.edges[uv]["bandwidth"]) for uv in self.links]
        self.latency = [float(graph.edges[uv]["latency"]) for uv in self.links]
        self._routes = {}

    def __repr__(self):
        name = self.graph.graph.get("name", "graph")
        return f"Topology({name}, {len(self.placement)} GPUs, alpha={self.alpha!r})"

    def route(self, src, dst):
        """``(link ids, bottleneck bandwidth, latency)`` of rank ``src`` -> ``dst``."""
        r = self._routes.get((src, dst))
        if r is None:
            uv = self.routing.links(self.placement[src], self.placement[dst])
            ids = tuple(self.link_id[x] for x in uv)
            slowest = min((self.capacity[i] for i in ids), default=math.inf)
            r = self._routes[src, dst] = (ids, slowest,
                                          self.alpha + sum(self.latency[i] for i in ids))
        return r

    def link_name(self, link):
        u, v = self.links[link]
        return f"{u}->{v}"

    # -- as the network= of a run ----------------------------------------------------
    def ports(self, world_size):
        """The per-run state (``ringlab.sim.world`` calls it ``ports``)."""
        if world_size > len(self.placement):
            raise ValueError(f"Topology: the run has {world_size} ranks but the placement only "
                             f"{len(self.placement)} GPUs")
        return FlowNetwork(self)

    # -- after a run ----------------------------------------------------------------------
    def flows_of(self, trace):
        """Replay the flows of a timed ``trace`` (run on this topology): returns
        ``(ends, loads)``, each event's arrival and ``{link: [(time, bytes/s), ...]}``."""
        events = list(trace)
        if any(e.start is None for e in events):
            raise ValueError("flows_of needs a trace run with network=this topology "
                             "(its events have no start times)")
        sim = FlowSim(self.capacity, record=True)
        order = sorted(range(len(events)), key=lambda i: events[i].start)
        flows = [None] * len(events)
        for i in order:
            e = events[i]
            while (t := sim.next_time()) is not None and t <= e.start:
                sim.advance(t)
            links, cap, lat = self.route(e.src, e.dst)
            flows[i] = sim.add(links, cap, lat, e.nbytes * self.scale, e.start, i)
        while (t := sim.next_time()) is not None:
            sim.advance(t)
        return [f.end for f in flows], sim.loads

    def link_loads(self, trace):
        """``{"u->v": [(time, bytes/s), ...]}`` for every link a flow crossed:
        the link's total rate from each time on."""
        return {self.link_name(k): v for k, v in self.flows_of(trace)[1].items()}

    def chrome_counters(self, trace, pid=None):
        """Perfetto counter events ("C"): one track per busy link, its
        utilisation in percent of its bandwidth, in a process "network links"."""
        pid = trace.world_size + 1 if pid is None else pid
        out = [{"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                "args": {"name": "network links"}}]
        for link, series in sorted(self.flows_of(trace)[1].items()):
            name, cap = self.link_name(link), self.capacity[link]
            for t, load in series:
                out.append({"name": name, "cat": "link", "ph": "C", "ts": t * 1e6, "pid": pid,
                            "tid": 0, "args": {"utilisation %": 100 * load / cap}})
        return out

    def to_chrome_trace(self, trace, **options):
        """``trace.to_chrome_trace(**options)`` plus the links' counter tracks."""
        doc = trace.to_chrome_trace(**options)
        doc["traceEvents"] += self.chrome_counters(trace)
        return doc


class Flow:
    """A message on the wire. From ``base`` it has ``rem`` bytes left, moving
    at ``rate``; its last byte leaves the links at ``drain`` and arrives
    ``lat`` seconds later, at ``end``."""

    __slots__ = ("links", "cap", "token", "lat", "base", "rem", "rate", "drain", "end",
                 "version", "seq")

    def __init__(self, links, cap, token, start, latency, nbytes, seq):
        self.links, self.cap, self.token, self.lat, self.seq = links, cap, token, latency, seq
        self.base, self.rem = start, float(nbytes)
        self.rate, self.drain, self.end, self.version = 0.0, None, None, 0


class FlowSim:
    """The flow-level simulator: flows take their share of every link of their
    route from the moment they are sent, and arrive their latency after their
    last byte left. It is told what happens in time order: ``add(...)`` a flow
    at its send time, ``advance(t)`` at each ``next_time()`` that comes first.

        >>> sim = FlowSim([10.0])                 # one link, 10 bytes/s
        >>> a = sim.add((0,), 10.0, 0.5, 10, 0.0, "a")
        >>> b = sim.add((0,), 10.0, 0.5, 10, 0.0, "b")
        >>> while (t := sim.next_time()) is not None:
        ...     sim.advance(t)
        >>> a.end, b.end                          # 10 bytes each at 5 bytes/s, then 0.5 s
        (2.5, 2.5)

    Flows sent at one time join their links together, at the first
    ``advance`` after it (``next_time()`` is then the next float after that
    time: after every send of that moment, before anything later), so that
    links are re-shared once for all of them, not once per flow.
    """

    def __init__(self, capacity, on_end=None, record=False):
        """``on_end(token, end)`` is called as each flow's arrival becomes certain."""
        self.capacity = capacity
        self.on_link = {}              # link -> {flow: None}: the flows on it, in arrival order
        self.drains = []               # heap of (drain, seq, version, flow)
        self.sent = []                 # flows sent at self.now, not yet on their links
        self.now, self.seq = 0.0, 0
        self.on_end = on_end
        self.loads = {} if record else None   # link -> [(time, total rate)]

    def add(self, links, cap, latency, nbytes, start, token):
        """A flow over ``links`` (bottleneck ``cap``) sent at ``start``
        (every event before ``start`` must have been processed)."""
        if start < self.now or self.sent and start != self.now:
            raise RuntimeError(f"a flow sent at {start} after the network reached {self.now}")
        self.now = start
        self.seq += 1
        f = Flow(links, cap, token, start, latency, nbytes, self.seq)
        on_link = self.on_link
        if not f.rem or not links:                # nothing to carry: there after its latency
            f.drain, f.end = start, start + latency
            if self.on_end is not None:
                self.on_end(f.token, f.end)
            return f
        for link in links:
            if on_link.get(link):
                self.sent.append(f)               # shares a link: join with the others sent now
                break
        else:
            # Nobody on its links: it gets the slowest one's bandwidth, now. (A flow
            # sent later at this same time onto one of them re-shares with it then.)
            for link in links:
                on_link[link] = {f: None}
            self._alone(f, start)
            if self.loads is not None:
                self._record(links, start)
        return f

    def _alone(self, f, now):
        """``_set_rate(f, f.cap, now)`` for a flow that just joined its links alone."""
        f.rate = rate = f.cap
        left = f.rem / rate
        f.drain, f.end, f.version = now + left, now + (f.lat + left), 1
        heapq.heappush(self.drains, (f.drain, f.seq, 1, f))

    def next_time(self):
        """When something next happens: flows sent join their links, or a
        flow's last byte leaves its links (None: nothing on the wire)."""
        if self.sent:
            return math.nextafter(self.now, math.inf)
        drains = self.drains
        while drains and drains[0][2] != drains[0][3].version:   # superseded by a new rate
            heapq.heappop(drains)
        return drains[0][0] if drains else None

    def _join(self):
        """The flows sent at ``self.now`` take their share of their links."""
        flows, now, on_link = self.sent, self.now, self.on_link
        self.sent = []
        for f in flows:
            for link in f.links:
                others = on_link.get(link)
                if others is None:
                    on_link[link] = {f: None}
                else:
                    others[f] = None
        crowded, quiet = [], []
        for f in flows:
            links = f.links
            for link in links:
                if len(on_link[link]) > 1:
                    crowded += links
                    break
            else:
                self._alone(f, now)               # its own links after all
                quiet += links
        if crowded:
            self._reshare(crowded, now)
        if self.loads is not None:
            self._record(quiet, now)

    def advance(self, now):
        """Put the flows sent on their links; end the flows whose last byte has
        left by ``now``, and re-share their links."""
        if self.sent:
            self._join()
        self.now = now
        on_link, done, changed, quiet = self.on_link, [], [], []
        drains = self.drains
        while drains and drains[0][0] <= now:
            _, _, version, f = heapq.heappop(drains)
            if version != f.version:
                continue
            shared = False
            for link in f.links:
                others = on_link[link]
                del others[f]
                shared = shared or bool(others)
            # Others on its links may go faster now; if it was alone, nobody does.
            (changed if shared else quiet).extend(f.links)
            done.append(f)
        if changed:
            self._reshare(changed, now)
        if self.loads is not None:
            self._record(quiet, now)
        if self.on_end is not None:
            for f in done:
                self.on_end(f.token, f.end)

    def _reshare(self, changed, now):
        """New max-min rates for the flows connected (through shared links) to a
        link whose flows changed. Other flows keep theirs: the allocation of one
        connected group does not depend on the others.

        The rates are ``max_min_fair``'s (``flows.fill`` explains why, to the
        last bit): its first round is done here, while the group is found, and
        ``fill`` is called only if some flow does not fill a link in it."""
        on_link, capacity, seen = self.on_link, self.capacity, set()
        mark, set_rate = seen.add, self._set_rate
        for first in changed:
            if first in seen:
                continue
            mark(first)
            group, users, stack, share = {}, {}, [first], math.inf
            while stack:                          # the connected group: its flows and links
                link = stack.pop()
                flows = on_link[link]
                if flows:
                    # The link's fair share before anything is given out: round one's.
                    users[link] = key = capacity[link] / len(flows)
                    if key < share:
                        share = key
                    for f in flows:
                        if f not in group:
                            group[f] = links = f.links
                            for other in links:
                                if other not in seen:
                                    mark(other)
                                    stack.append(other)
            if not group:                         # links left empty
                continue
            if len(group) == 1:                   # alone on its links: the slowest one
                f = next(iter(group))
                rates = {f: f.cap}
            else:
                rates = {}
                for link, key in users.items():   # round one freezes the flows of the
                    if key == share:              # links with the smallest share
                        for f in on_link[link]:
                            rates[f] = share
                if len(rates) < len(group):       # more rounds: the general case
                    rates = fill(group, {link: on_link[link] for link in users}, capacity)
            for f, rate in rates.items():
                if rate != f.rate:
                    set_rate(f, rate, now)
        if self.loads is not None:
            self._record(seen, now)

    def _record(self, links, now):
        """Note the total rate on ``links`` from ``now`` on (for ``link_loads``)."""
        for link in links:
            load = sum(f.rate for f in self.on_link[link])
            series = self.loads.setdefault(link, [])
            if series and series[-1][0] == now:
                series.pop()
            if not series or series[-1][1] != load:
                series.append((now, load))

    def _set_rate(self, f, rate, now):
        if f.rate:          # it was moving bytes: its segment ends now
            f.rem = max(f.rem - f.rate * (now - f.base), 0.0)
            f.base = now
        f.rate = rate
        # Written so that a flow never disturbed arrives at start + (latency + n / rate),
        # to the last bit the AlphaBeta time start + (alpha + beta n) when n / rate == beta n.
        left = f.rem / rate
        f.drain, f.end = f.base + left, f.base + (f.lat + left)
        f.version += 1
        heapq.heappush(self.drains, (f.drain, f.seq, f.version, f))


class FlowNetwork:
    """One run's network: a ``FlowSim`` driven by the simulator's scheduler."""

    deferred = True          # tells the world: arrivals are known later (see the module doc)

    def __init__(self, topology):
        self.topology, self.world, self.sim = topology, None, None
        self.routes, self.scale = topology._routes, topology.scale

    def bind(self, world):
        self.world = world
        self.sim = FlowSim(self.topology.capacity, world._delivered)

    def transfer(self, src, dst, nbytes, ready):
        """The world asks when a message ends: it starts now, and ends later."""
        return ready, None

    def launch(self, src, dst, nbytes, start, req):
        """Put a message on the wire at ``start`` (the world's present)."""
        route = self.routes.get((src, dst)) or self.topology.route(src, dst)
        sim = self.sim
        sim.add(*route, nbytes * self.scale, start, req)
        t, wake = sim.next_time(), self.world.net_wake
        if t is not None and (wake is None or t < wake.time):
            self.world._network_at(t)

    def advance(self, now):
        self.sim.advance(now)
        t = self.sim.next_time()
        if t is not None:
            self.world._network_at(t)

    def release(self):
        self.world = self.sim = None
