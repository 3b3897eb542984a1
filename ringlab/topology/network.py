"""A topology as the ``network=`` of a run: messages are flows that share links.

``Topology(graph, placement)`` puts rank ``i`` on GPU ``placement[i]`` of a
graph from ``ringlab.topology.graphs`` (default: the ``i``-th GPU). As the
``network=`` of ``ringlab.run`` every message becomes a **flow** along its route
(``ringlab.topology.routing``), and the flows on the wire share the links
max-min fairly (``ringlab.topology.flows``): the flow-level model of SimGrid
and of ASTRA-sim's congestion-aware analytical backend. So any program gets a
time that includes contention::

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> from ringlab.topology import Topology, nvswitch_node
    >>> net = Topology(nvswitch_node(gpus=4, bw=1e9, lat=0.0), alpha=1e-5)
    >>> res = ringlab.run(ring_allreduce, [np.ones(4000)] * 4, network=net)
    >>> round(res.time * 1e6, 3)       # 6 steps of (alpha + 8000 bytes / 1e9), as AlphaBeta
    108.0

What a message costs. A message of ``n`` bytes sent at time ``t``:

1. waits its **latency**: ``alpha`` (per message, as AlphaBeta's) plus the
   latencies of the links of its route, using no bandwidth (as in SimGrid);
2. then crosses every link of its route at once, at the rate its fair share
   gives it; rates change whenever a flow joins or leaves a link it shares
   (progressive filling again, on the flows connected to that link);
3. arrives when its last byte is through: ``event.end``. The sender's
   ``send`` returns then too (a blocking send in ringlab returns when the
   message has left; here that is when it has arrived, as for a rendezvous).

On its own a message takes ``t + latency + n / (slowest link)``: on a
non-blocking topology where every rank has its own link pair, with link
latency ``alpha / 2`` (or 0 and ``alpha=``) and bandwidth ``1 / beta``, every
time equals ``AlphaBeta(alpha, beta)``'s. Links are **full duplex** (one
capacity per direction). There is no one-port rule: a GPU's link to its switch
(its NVLink, its NIC) is a link of the graph, so two messages a GPU sends at
once share it, each at half speed, instead of queueing one after the other.
Steps (``event.step``) are still those of the one-port model: a logical clock.

How arrival times are made exact. Under max-min sharing a flow's end depends on
flows that start *after* it (they take part of its links), so it cannot be
known when the message is sent. The simulator runs ranks in simulated-time
order; this network is one more actor of that scheduler (``ringlab.sim.world``):
its next event is the earliest flow to finish or to clear its latency, and it
runs only when every rank has reached that time, i.e. when no flow still to be
sent can start before it. Only then does it end the flows due, wake the ranks
waiting on them, re-share the links, and book its next event. Between events
every rate is constant, so a flow's end ``base + (latency + bytes / rate)`` is
exact (up to floating point) and a flow never disturbed keeps the closed form.

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

from .flows import max_min_fair
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
                raise ValueError(f"Topology: placement[{rank}] = {node!r} is not a GPU of the "
                                 f"network (GPUs: {all_gpus[:4]}{' ...' if len(all_gpus) > 4 else ''})")
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
            r = self._routes[src, dst] = (ids, min((self.capacity[i] for i in ids), default=math.inf),
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
    """A message on the wire. Its current segment: from ``base``, ``lat``
    seconds of latency still to wait, then ``rem`` bytes at ``rate``."""

    __slots__ = ("links", "cap", "token", "base", "lat", "rem", "rate", "end", "version", "seq")

    def __init__(self, links, cap, token, start, latency, nbytes, seq):
        self.links, self.cap, self.token, self.seq = links, cap, token, seq
        self.base, self.lat, self.rem = start, latency, float(nbytes)
        self.rate, self.end, self.version = 0.0, None, 0


class FlowSim:
    """The flow-level simulator: flows join after their latency, share links
    max-min fairly, and end. Events are handed to it in time order:
    ``add(...)`` at its start time, ``advance(t)`` at each ``next_time()``.

        >>> sim = FlowSim([10.0])                 # one link, 10 bytes/s
        >>> a = sim.add((0,), 10.0, 0.0, 10, 0.0, "a")
        >>> b = sim.add((0,), 10.0, 0.0, 10, 0.0, "b")
        >>> while (t := sim.next_time()) is not None:
        ...     sim.advance(t)
        >>> a.end, b.end                          # 10 bytes each at 5 bytes/s
        (2.0, 2.0)
    """

    def __init__(self, capacity, on_end=None, record=False):
        self.capacity = capacity
        self.on_link = {}              # link -> {flow: None}: the flows on it, in arrival order
        self.starts, self.ends = [], []   # heaps: (time, seq, flow) and (end, seq, version, flow)
        self.now, self.seq = 0.0, 0
        self.on_end = on_end
        self.loads = {} if record else None   # link -> [(time, total rate)]

    def add(self, links, cap, latency, nbytes, start, token):
        """A flow over ``links`` (bottleneck ``cap``) sent at ``start``."""
        if start < self.now:
            raise RuntimeError(f"a flow sent at {start} after the network reached {self.now}")
        self.seq += 1
        f = Flow(links, cap, token, start, latency, nbytes, self.seq)
        heapq.heappush(self.starts, (start + latency, self.seq, f))
        return f

    def next_time(self):
        """When the next flow clears its latency or ends (None: nothing on the wire)."""
        ends = self.ends
        while ends and ends[0][2] != ends[0][3].version:     # superseded by a new rate
            heapq.heappop(ends)
        t = ends[0][0] if ends else None
        if self.starts and (t is None or self.starts[0][0] < t):
            t = self.starts[0][0]
        return t

    def advance(self, now):
        """Process everything due at ``now``: end flows, start flows, re-share."""
        self.now = now
        on_link, done, changed, quiet = self.on_link, [], [], []
        ends, starts = self.ends, self.starts
        while ends and ends[0][0] <= now:
            _, _, version, f = heapq.heappop(ends)
            if version != f.version:
                continue
            shared = False
            for link in f.links:
                others = on_link[link]
                del others[f]
                shared = shared or bool(others)
            # Others on its links go faster now; a flow that was alone frees them for nobody.
            (changed if shared else quiet).extend(f.links)
            done.append(f)
        while starts and starts[0][0] <= now:
            t, _, f = heapq.heappop(starts)
            if not f.rem or not f.links:          # nothing to carry: done once its latency is
                f.end = t
                done.append(f)
                continue
            alone = True
            for link in f.links:
                others = on_link.get(link)
                if others is None:
                    others = on_link[link] = {}
                elif others:
                    alone = False
                others[f] = None
            if alone:                             # its own links: the slowest one's bandwidth
                self._set_rate(f, f.cap, now)
                quiet += f.links
            else:
                changed += f.links
        if changed:
            self._reshare(changed, now)
        if self.loads is not None:
            self._record(quiet, now)
        if self.on_end is not None:
            for f in done:
                self.on_end(f)

    def _reshare(self, changed, now):
        """New max-min rates for the flows connected (through shared links) to a
        link whose flows changed. Other flows keep theirs: the allocation of one
        connected group does not depend on the others."""
        on_link, seen = self.on_link, set()
        for first in changed:
            if first in seen:
                continue
            group, stack = {}, [first]
            while stack:                          # the connected group of flows
                link = stack.pop()
                if link in seen:
                    continue
                seen.add(link)
                for f in on_link[link]:
                    if f not in group:
                        group[f] = None
                        stack += f.links
            if len(group) == 1:                   # alone on its links: the slowest one
                f = next(iter(group))
                rates = {f: f.cap}
            else:
                rates = max_min_fair({f: f.links for f in group}, self.capacity)
            for f, r in rates.items():
                if r != f.rate:
                    self._set_rate(f, r, now)
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
            f.rem = max(f.rem - f.rate * (now - (f.base + f.lat)), 0.0)
            f.base, f.lat = now, 0.0
        f.rate = rate
        f.end = f.base + (f.lat + f.rem / rate)
        f.version += 1
        heapq.heappush(self.ends, (f.end, f.seq, f.version, f))


class FlowNetwork:
    """One run's network: a ``FlowSim`` driven by the simulator's scheduler."""

    deferred = True          # tells the world: arrivals are known later (see the module doc)

    def __init__(self, topology):
        self.topology, self.world = topology, None
        self.sim = FlowSim(topology.capacity, self._arrived)

    def bind(self, world):
        self.world = world

    def transfer(self, src, dst, nbytes, ready):
        """The world asks when a message ends: it starts now, and ends later."""
        return ready, None

    def launch(self, src, dst, nbytes, start, req):
        links, cap, lat = self.topology.route(src, dst)
        self.sim.add(links, cap, lat, nbytes * self.topology.scale, start, req)
        self.world._network_at(start + lat)

    def advance(self, now):
        self.sim.advance(now)
        t = self.sim.next_time()
        if t is not None:
            self.world._network_at(t)

    def _arrived(self, f):
        self.world._delivered(f.token, f.end)

    def release(self):
        self.world = self.sim = None
