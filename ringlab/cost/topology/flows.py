"""Max-min fair sharing of links among flows, by progressive filling.

A *flow* is a message on the wire: it crosses a list of links, and every
link has a capacity (bytes/s). When flows share links, which rates do they
get? The usual answer of flow-level network simulators (SimGrid's max-min
solver, whose TCP models weight the shares by inverse round-trip time) is
**max-min fairness**: no flow can go faster without slowing down a flow that
is already as slow or slower. (ASTRA-sim's congestion-aware analytical
backend does not share: its links send one chunk at a time, first come first
served, store-and-forward.) Progressive filling computes it (Bertsekas and Gallager, *Data
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
    users = {}                         # link -> the flows crossing it
    for f, links in routes.items():
        if not links:
            rate[f] = math.inf
        for link in links:
            users.setdefault(link, []).append(f)
    left = {link: float(capacity[link]) for link in users}      # capacity not yet given out
    growing = {link: len(fs) for link, fs in users.items()}     # flows on it not yet frozen
    while growing:
        # The link that fills first: the smallest fair share.
        share = min(left[link] / n for link, n in growing.items())
        full = [link for link, n in growing.items() if left[link] / n == share]
        for link in full:
            for f in users[link]:
                if f in rate:
                    continue
                rate[f] = share                  # frozen: it takes its share of every link
                for other in routes[f]:
                    left[other] = max(left[other] - share, 0.0)   # never below 0 by rounding
                    growing[other] -= 1
                    if not growing[other]:
                        del growing[other]
    return {f: rate[f] for f in routes}
