"""Max-min fair sharing of links among flows, by progressive filling.

A *flow* is a message on the wire: it crosses a list of links, and every
link has a capacity (bytes/s). When flows share links, which rates do they
get? The usual answer of flow-level network simulators (SimGrid's, and
ASTRA-sim's congestion-aware analytical backend) is **max-min fairness**: no
flow can go faster without slowing down a flow that is already as slow or
slower. Progressive filling computes it (Bertsekas and Gallager, *Data
Networks*, section 6.5.2):

1. every flow starts at rate 0 and all rates grow together;
2. the first link to fill up is the one with the smallest *fair share*,
   (capacity left) / (flows on it still growing); its flows are frozen at that share;
3. repeat with the capacity the frozen flows leave, until every flow is frozen.

Each frozen flow has a *bottleneck*: a full link on which no flow is faster.

Two flows on one link get half each; a flow that also crosses a slower link
gets that link's share, and the other flow takes what it leaves:

    >>> max_min_fair({"a": ["l"], "b": ["l"]}, {"l": 10.0})
    {'a': 5.0, 'b': 5.0}
    >>> max_min_fair({"a": ["l", "slow"], "b": ["l"]}, {"l": 10.0, "slow": 2.0})
    {'a': 2.0, 'b': 8.0}
"""

from __future__ import annotations

import math


def max_min_fair(routes, capacity):
    """``{flow: rate}``: the max-min fair rates of flows crossing links.

    ``routes``: ``{flow: [link, ...]}``; ``capacity``: ``capacity[link]`` in
    bytes/s (a dict, or a list indexed by link). A flow that crosses no link is
    limited by nothing: its rate is ``inf``.
    """
    rate = {}
    users = {}                         # link -> flows on it that still grow
    for f, links in routes.items():
        if not links:
            rate[f] = math.inf
        for link in links:
            users.setdefault(link, []).append(f)
    left = {link: float(capacity[link]) for link in users}
    while users:
        # The link that fills first: the smallest fair share.
        share = min(left[link] / len(fs) for link, fs in users.items())
        full = [link for link, fs in users.items() if left[link] / len(fs) == share]
        for link in full:
            for f in users.get(link, ()):
                if f in rate:
                    continue
                rate[f] = share
                for other in routes[f]:          # it takes its share of every link it crosses
                    left[other] = max(left[other] - share, 0.0)
        # Frozen flows stop growing: drop them, and links nobody still grows on.
        for link in list(users):
            fs = [f for f in users[link] if f not in rate]
            if fs:
                users[link] = fs
            else:
                del users[link]
    return {f: rate[f] for f in routes}
