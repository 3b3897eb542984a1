"""Routing: the cheapest path, and ECMP among the equally cheap ones.

A route is the list of nodes a message crosses. It is a cheapest path by the
links' ``weight`` (see ``graphs``). When several are equally cheap (a fat tree
has one per spine), a switch spreads flows over them the way real switches do:
**equal-cost multi-path** (ECMP) forwarding hashes the flow's identity and
takes next hop ``hash % choices``. Each switch hashes on its own, so a path is
chosen hop by hop, and the hash is deterministic (CRC-32 of the names, never
Python's salted ``hash``): the same flow takes the same route in every run.

    >>> from ringlab.cost.topology.graphs import fat_tree
    >>> r = Routing(fat_tree(nodes=4, gpus_per_node=1, leaves=2, spines=2))
    >>> r.path("n0.gpu0", "n2.gpu0")                 # up to a spine and down again
    ['n0.gpu0', 'leaf0', 'spine0', 'leaf1', 'n2.gpu0']
    >>> sorted({r.path("n0.gpu0", "n2.gpu0", flow=f)[2] for f in range(8)})
    ['spine0', 'spine1']

``flow`` (default 0) tells flows between the same pair of GPUs apart; ringlab's
network model routes every message between two ranks with ``flow=0``, like one
long-lived connection (NCCL keeps a few per pair of GPUs).
"""

from __future__ import annotations

import heapq
import zlib


def ecmp_hash(src, dst, flow, hop):
    """The deterministic hash a switch ``hop`` uses to pick a next hop."""
    return zlib.crc32(f"{src}>{dst}#{flow}@{hop}".encode())


class Routing:
    """Cheapest routes in ``graph`` with hop-by-hop ECMP; cached."""

    def __init__(self, graph, weight="weight"):
        self.graph, self.weight = graph, weight
        for u, v, w in graph.edges(data=weight, default=1):
            if not w > 0:
                raise ValueError(f"link {u} -> {v} has {weight}={w!r}; routing needs weights > 0")
        self._dist = {}          # dst -> {node: cost to dst}, settled so far
        self._paths = {}
        # Each node's incoming links as (from, weight), in networkx's order: read
        # once here, not through networkx's edge views at every step of Dijkstra.
        self._into = {v: [(u, d.get(weight, 1)) for u, d in graph.pred[v].items()]
                      for v in graph}

    def distances_to(self, dst, src):
        """Cost from every node at most as far as ``src`` to ``dst``: Dijkstra
        from ``dst`` on the reversed links, stopped once ``src`` is settled
        (every next hop of a cheapest route from ``src`` is nearer than it)."""
        done = self._dist.get(dst)
        if done is not None and src in done:
            return done
        into, done, inf = self._into, {}, float("inf")
        heap, seen = [(0, dst)], {dst: 0}
        while heap:
            d, v = heapq.heappop(heap)
            if v in done:
                continue
            done[v] = d
            if v == src:
                break
            for u, c in into[v]:
                nd = d + c
                if u not in done and nd < seen.get(u, inf):
                    seen[u] = nd
                    heapq.heappush(heap, (nd, u))
        if src not in done:
            raise ValueError(f"no route from {src} to {dst} in the network")
        self._dist[dst] = done
        return done

    def next_hops(self, node, dst, dist):
        """The neighbours of ``node`` on a cheapest route to ``dst``, sorted by name."""
        w, here = self.weight, dist[node]
        return sorted(v for _, v, c in self.graph.out_edges(node, data=w, default=1)
                      if v in dist and dist[v] + c == here)

    def path(self, src, dst, flow=0):
        """The route of flow ``flow`` from ``src`` to ``dst``: a list of nodes."""
        key = (src, dst, flow)
        p = self._paths.get(key)
        if p is None:
            dist = self.distances_to(dst, src)
            p, node = [src], src
            while node != dst:
                hops = self.next_hops(node, dst, dist)
                node = hops[ecmp_hash(src, dst, flow, node) % len(hops)] if len(hops) > 1 \
                    else hops[0]
                p.append(node)
            self._paths[key] = p
        return list(p)

    def links(self, src, dst, flow=0):
        """The route as a list of directed links ``(u, v)``."""
        p = self.path(src, dst, flow)
        return list(zip(p, p[1:]))
