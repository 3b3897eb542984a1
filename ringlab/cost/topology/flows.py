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

``max_min_fair`` is the readable version: each round looks at every link.
``fill`` (and ``fair_shares``, called as ``max_min_fair`` is) computes the same
floats faster: its first round is one scan, and often the last (every flow
crosses a link that fills in it); later rounds take the links that fill from
a heap ordered by fair share, and touch only the links of the flows they
freeze. The flow simulator (``network.FlowSim``) uses it.
"""

from __future__ import annotations

import heapq
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


def fair_shares(routes, capacity):
    """``max_min_fair(routes, capacity)``, the same floats, computed by ``fill``.

        >>> fair_shares({"a": ["l", "slow"], "b": ["l"]}, {"l": 10.0, "slow": 2.0})
        {'a': 2.0, 'b': 8.0}
    """
    users, moving = {}, {}
    for f, links in routes.items():
        if links:
            moving[f] = links
        for link in links:
            users.setdefault(link, []).append(f)
    rate = fill(moving, users, {link: float(capacity[link]) for link in users}) if users else {}
    return {f: rate.get(f, math.inf) for f in routes}


def fill(routes, users, capacity):
    """Progressive filling: ``{flow: rate}`` for the flows of ``routes``
    (``{flow: its links}``, none empty) over ``users`` (``{link: the flows
    crossing it}``, for every link of every route), ``capacity[link]`` a float.

    Why it gives ``max_min_fair``'s floats exactly. A link's capacity left
    changes only by ``max(left - share, 0.0)``, once per flow of it frozen, and
    every flow frozen in one round gets that round's share: so whatever order a
    round freezes its flows in, each link sees the same subtractions, and each
    round's smallest ``left / n`` (a heap's top here, a ``min`` over all links
    there) is the same float. The links that fill in a round are taken off the
    heap before any flow is frozen, as ``max_min_fair`` lists them first.
    """
    # Round one, by a scan. It is often the only one (every flow crosses a link
    # that fills first), and then nothing else need be computed.
    keys = [capacity[link] / len(fs) for link, fs in users.items()]
    share, rate = min(keys), {}
    for link, key in zip(users, keys):
        if key == share:
            for f in users[link]:
                rate[f] = share
    if len(rate) == len(routes):
        return rate
    # The capacity the frozen flows leave; then the links in a heap, by fair share.
    left, growing, heap, entry = {}, {}, [], {}
    for link, fs in users.items():
        left[link] = capacity[link]
        growing[link] = len(fs)
    for f in rate:
        for link in routes[f]:
            left[link] = max(left[link] - share, 0.0)
            growing[link] -= 1
    for link, n in growing.items():
        if n:
            entry[link] = k = len(heap)       # the link's current entry (older ones are stale)
            heap.append((left[link] / n, k, link))
    heapq.heapify(heap)
    pop, push, count = heapq.heappop, heapq.heappush, len(heap)
    while heap:
        share, full = heap[0][0], []
        while heap and heap[0][0] == share:   # every link that fills now (and stale entries)
            _, k, link = pop(heap)
            if entry[link] == k:
                full.append(link)
        touched = {}
        for link in full:
            for f in users[link]:
                if f in rate:
                    continue
                rate[f] = share
                for other in routes[f]:
                    left[other] = max(left[other] - share, 0.0)
                    growing[other] -= 1
                    touched[other] = None
        if len(rate) == len(routes):
            break
        for link in touched:                  # their new fair shares, after the round
            n = growing[link]
            entry[link] = count = count + 1
            if n:
                push(heap, (left[link] / n, count, link))
    return rate
