"""The reference flow simulator: ``FlowSim`` (and its ``Flow``) of
``ringlab/cost/topology/network.py`` as it was before its fast path (commit
1335670), kept verbatim but for its imports and this note. It re-shares links
with the readable ``max_min_fair`` of ``ringlab/cost/topology/flows.py`` on every
connected group of flows, found from scratch. ``tests/cost/test_flows_fast.py``
drives random arrivals and departures through both and wants bit-identical
rates and times. Change it only to follow a deliberate change of the model.
"""

from __future__ import annotations

import heapq
import math

from ringlab.cost.topology.flows import max_min_fair


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
            if all(len(on_link[link]) == 1 for link in links):
                self._alone(f, now)               # its own links after all
                quiet += links
            else:
                crowded += links
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
            if not group:                         # links left empty
                continue
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
            f.rem = max(f.rem - f.rate * (now - f.base), 0.0)
            f.base = now
        f.rate = rate
        # Written so that a flow never disturbed arrives at start + (latency + n / rate),
        # to the last bit the AlphaBeta time start + (alpha + beta n) when n / rate == beta n.
        left = f.rem / rate
        f.drain, f.end = f.base + left, f.base + (f.lat + left)
        f.version += 1
        heapq.heappush(self.drains, (f.drain, f.seq, f.version, f))
