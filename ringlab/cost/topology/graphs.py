"""Networks as graphs: who is wired to whom, and how fast.

Every builder returns a ``networkx.DiGraph``. Nodes have a ``kind``: ``"gpu"``
(where ranks live) or ``"switch"`` (an NVSwitch, a leaf, a spine, a rail).
Every cable is two directed edges, one per direction, because links are
**full duplex**: A -> B and B -> A each have the whole bandwidth. Each edge has

* ``bandwidth``: bytes per second in that direction;
* ``latency``: seconds a message spends crossing it;
* ``weight``: its routing cost (``ringlab.cost.topology.routing`` takes the cheapest
  route). NVLink hops cost 1 and network hops 4, so traffic between two GPUs of
  one node stays on NVLink instead of leaving through the network (both routes
  have two hops), as NCCL's does.

GPU nodes are added in rank order: ``gpus(g)`` lists them, and by default rank
``i`` runs on the ``i``-th.

    >>> g = fat_tree(nodes=4, gpus_per_node=2, leaves=2, spines=2, oversubscription=2)
    >>> len(gpus(g)), gpus(g)[:3]
    (8, ['n0.gpu0', 'n0.gpu1', 'n1.gpu0'])
    >>> g.edges["n0.gpu0", "leaf0"]["bandwidth"] / 1e9      # a 400 Gb/s NIC
    50.0
    >>> g.edges["leaf0", "spine0"]["bandwidth"] / 1e9       # 4 NICs * 50 / 2 / 2 spines
    50.0

The default numbers are illustrative, of the order of an H100 cluster:
NVLink 450 GB/s per direction per GPU, a 400 Gb/s (50 GB/s) NIC per GPU,
0.5 us per NVLink hop and 1 us per network hop.
"""

from __future__ import annotations

import networkx as nx

NVLINK_BW = 450e9       # bytes/s per direction, one GPU's NVLink to its NVSwitch
NVLINK_LAT = 0.5e-6
NIC_BW = 50e9           # 400 Gb/s
NET_LAT = 1e-6
NVLINK_WEIGHT, NET_WEIGHT = 1, 4


def duplex(g, a, b, bandwidth, latency, weight=1):
    """Add a full-duplex cable between ``a`` and ``b``: two directed links with
    the same bandwidth (bytes/s) and latency (s)."""
    if not bandwidth > 0 or not latency >= 0:
        raise ValueError(f"link {a} <-> {b}: bandwidth must be > 0 and latency >= 0, "
                         f"got {bandwidth!r} and {latency!r}")
    for u, v in ((a, b), (b, a)):
        g.add_edge(u, v, bandwidth=float(bandwidth), latency=float(latency), weight=weight)


def gpus(g):
    """The GPU nodes of ``g``, in the order they were added (rank order)."""
    return [n for n, kind in g.nodes(data="kind") if kind == "gpu"]


def _node(g, k, gpus_per_node, bw, lat):
    """Node ``k``: its GPUs on one NVSwitch. Returns the GPU ids."""
    switch = f"n{k}.nvswitch"
    g.add_node(switch, kind="switch", tier="nvswitch")
    ids = []
    for i in range(gpus_per_node):
        gpu = f"n{k}.gpu{i}"
        g.add_node(gpu, kind="gpu", node=k, local=i)
        if gpus_per_node > 1:
            duplex(g, gpu, switch, bw, lat, NVLINK_WEIGHT)
        ids.append(gpu)
    if gpus_per_node == 1:           # one GPU needs no switch
        g.remove_node(switch)
    return ids


def nvswitch_node(gpus=8, bw=NVLINK_BW, lat=NVLINK_LAT):
    """One server: ``gpus`` GPUs, each with a link of ``bw`` bytes/s per
    direction to one NVSwitch. The switch is non-blocking, so every pair of
    GPUs talks at ``bw`` as long as each GPU sends to one and receives from one.

    >>> g = nvswitch_node(gpus=4)
    >>> g.number_of_nodes(), g.number_of_edges()       # 4 GPUs + 1 switch, 4 cables
    (5, 8)
    """
    if gpus < 2:
        raise ValueError(f"nvswitch_node(gpus={gpus}): needs at least 2 GPUs")
    g = nx.DiGraph(name=f"nvswitch_node({gpus})")
    _node(g, 0, gpus, bw, lat)
    return g


def fat_tree(nodes, gpus_per_node, leaves, spines, oversubscription=1.0, *, nic_bw=NIC_BW,
             nvlink_bw=NVLINK_BW, lat=NET_LAT, nvlink_lat=NVLINK_LAT):
    """A two-level leaf/spine (folded Clos) network of ``nodes`` servers.

    Each server has ``gpus_per_node`` GPUs on an NVSwitch, and each GPU its own
    NIC cabled to its server's leaf switch (``nic_bw``). Servers fill the leaves
    in order (``nodes / leaves`` per leaf). Every leaf has one cable to every
    spine; ``oversubscription`` is the ratio of a leaf's downlink capacity (its
    NICs) to its uplink capacity: 1 is a non-blocking (full bisection) tree,
    4 means the leaf can send up only a quarter of what its GPUs can inject::

        uplink bandwidth = gpus under the leaf * nic_bw / (oversubscription * spines)

    >>> g = fat_tree(nodes=4, gpus_per_node=1, leaves=2, spines=1, oversubscription=2)
    >>> g.edges["leaf0", "spine0"]["bandwidth"] == 2 * NIC_BW / 2
    True
    """
    if nodes % leaves:
        raise ValueError(f"fat_tree: nodes={nodes} must be a multiple of leaves={leaves}")
    if not (oversubscription > 0 and spines >= 1):
        raise ValueError(f"fat_tree: needs spines >= 1 and oversubscription > 0, got "
                         f"{spines} and {oversubscription}")
    g = nx.DiGraph(name=f"fat_tree({nodes}x{gpus_per_node}, {leaves} leaves, {spines} spines, "
                        f"{oversubscription}:1)")
    per_leaf = nodes // leaves
    for j in range(leaves):
        g.add_node(f"leaf{j}", kind="switch", tier="leaf")
    for s in range(spines):
        g.add_node(f"spine{s}", kind="switch", tier="spine")
    for k in range(nodes):
        for gpu in _node(g, k, gpus_per_node, nvlink_bw, nvlink_lat):
            duplex(g, gpu, f"leaf{k // per_leaf}", nic_bw, lat, NET_WEIGHT)
    uplink = per_leaf * gpus_per_node * nic_bw / (oversubscription * spines)
    for j in range(leaves):
        for s in range(spines):
            duplex(g, f"leaf{j}", f"spine{s}", uplink, lat, NET_WEIGHT)
    return g


def rail_optimized(nodes, gpus_per_node, *, nic_bw=NIC_BW, nvlink_bw=NVLINK_BW, lat=NET_LAT,
                   nvlink_lat=NVLINK_LAT):
    """A rail-optimized cluster: GPU ``i`` of every server is cabled to rail
    switch ``i``, so same-index GPUs of different servers are one switch apart.
    Traffic between different indices of different servers has no network path
    of its own: it crosses NVLink to the GPU on the right rail first (as NCCL's
    PXN does), through a GPU of either server.

    >>> g = rail_optimized(nodes=4, gpus_per_node=8)
    >>> sorted(g.successors("rail3"))[:2]
    ['n0.gpu3', 'n1.gpu3']
    """
    g = nx.DiGraph(name=f"rail_optimized({nodes}x{gpus_per_node})")
    for i in range(gpus_per_node):
        g.add_node(f"rail{i}", kind="switch", tier="rail")
    for k in range(nodes):
        for i, gpu in enumerate(_node(g, k, gpus_per_node, nvlink_bw, nvlink_lat)):
            duplex(g, gpu, f"rail{i}", nic_bw, lat, NET_WEIGHT)
    return g


def ring(n, bw=NIC_BW, lat=NET_LAT):
    """``n`` GPUs in a ring, each cabled to its two neighbours (no switch:
    a GPU forwards what is not for it).

    >>> g = ring(5)
    >>> g.number_of_edges(), sorted(g.successors("gpu0"))
    (10, ['gpu1', 'gpu4'])
    """
    if n < 2:
        raise ValueError(f"ring({n}): needs at least 2 GPUs")
    g = nx.DiGraph(name=f"ring({n})")
    for i in range(n):
        g.add_node(f"gpu{i}", kind="gpu", pos=(i,))
    for i in range(n if n > 2 else 1):
        duplex(g, f"gpu{i}", f"gpu{(i + 1) % n}", bw, lat)
    return g


def torus2d(x, y, bw=NIC_BW, lat=NET_LAT):
    """An ``x`` by ``y`` torus of GPUs (TPU-style): each cabled to its four
    neighbours, with wrap-around. GPU ``gpu{i}`` sits at ``(i // y, i % y)``.

    >>> g = torus2d(4, 4)
    >>> g.number_of_edges(), sorted(g.successors("gpu0"))
    (64, ['gpu1', 'gpu12', 'gpu3', 'gpu4'])
    """
    if x < 2 or y < 2:
        raise ValueError(f"torus2d({x}, {y}): both sides need at least 2 GPUs")
    g = nx.DiGraph(name=f"torus2d({x}, {y})")
    for i in range(x * y):
        g.add_node(f"gpu{i}", kind="gpu", pos=divmod(i, y))
    for a in range(x):
        for b in range(y):
            here = f"gpu{a * y + b}"
            # A side of 2 would cable the same pair twice: one cable is enough.
            if x > 2 or a == 0:
                duplex(g, here, f"gpu{(a + 1) % x * y + b}", bw, lat)
            if y > 2 or b == 0:
                duplex(g, here, f"gpu{a * y + (b + 1) % y}", bw, lat)
    return g
