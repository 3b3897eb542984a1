"""How NCCL chooses an AllReduce algorithm and protocol: its own cost model.

NCCL predicts, for every (algorithm, protocol) pair, ``time = latency +
bytes / bandwidth`` and runs the fastest. This module reproduces that model
for AllReduce from NCCL **v2.21.5-1** (tag ``v2.21.5-1``, commit
ab2b89c4c339bd7f816fbc114a4b05d386b66290, April 2024): ``src/graph/tuning.cc``
(``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``) and ``src/enqueue.cc``
(``topoGetAlgoInfo``: the minimum over algorithms and protocols).

Algorithms: ``ring`` and ``tree`` (NCCL's pipelined double binary tree
across nodes, a chain inside each node). Protocols: ``LL`` (8-byte stores
with a flag in each, lowest latency, half the bandwidth), ``LL128`` (128-byte
lines with a flag, ~120/128 of the bandwidth) and ``Simple`` (big chunks
with a memory fence: full bandwidth, highest latency).

In microseconds and GB/s (1e9 bytes/s) as in the source:

* latency = ``baseLat[a][p]`` + per-hop ``hwLat[hw][a][p]`` times the hops:
  ring: ``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat`` with
  nsteps = 2(nRanks-1) and nInterSteps = 2 nNodes (0 on one node): it grows
  linearly with the ranks. Tree: ``2 * ((nRanks/nNodes - 1) * intraLat +
  log2i(nNodes) * interLat)``: the chain inside a node plus log2 of the
  nodes, up and down.
* bandwidth = ``nChannels * bw`` (the topology search's bandwidth per channel:
  ``bwIntra`` on up to 2 nodes, else ``bwInter``), capped and scaled by the
  protocol factors below, then turned from bus into algorithm bandwidth: a
  ring moves 2(n-1)/n of the data per rank (``ratio = nRanks / nsteps``), a
  tree 2 times (``ratio = .5``: up and down, each byte once per direction,
  pipelined, *not* 2 log2(N) full-size transfers).
* time = latency + nBytes / (1000 * bandwidth), with the tree's bandwidth
  multiplied by ``treeCorrectionFactor`` for messages under 512 MiB
  (``log2i(nBytes >> 6) < 23``) and the multi-node ring/Simple latency by 1.4
  (compute capability >= 8.0, else 1.9: "plateau effect of ring") once each
  rank's share per channel reaches 64 bytes.

Simplifications, all stated: the topology search is not modelled (you give
``n_channels`` and the per-channel ``bw_intra``/``bw_inter`` that NCCL logs
with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=GRAPH``), ring and tree get the same
channels and bandwidths, the tree graph is taken as balanced (no ``.85``
penalty of ``NCCL_TOPO_PATTERN_TREE``), ``latencyInter`` is 0 (what the IB
plugin reports), CollNet and NVLS are left out, and LL128 is on or off as you
say (NCCL enables it by default only on NVLink systems of one GPU type).

    >>> best = choose(8 << 10, n_nodes=4, gpus_per_node=8)
    >>> best.algorithm, best.protocol
    ('tree', 'LL')
    >>> choose(1 << 30, n_nodes=4, gpus_per_node=8)[:2]
    ('ring', 'Simple')

nccl-tests reports, for AllReduce of S bytes in t seconds on n ranks,
``algbw = S / t`` and ``busbw = algbw * 2(n-1)/n`` (nccl-tests,
doc/PERFORMANCE.md): bus bandwidth is what each rank's link carries, the
number to compare with the hardware's peak.
"""

from __future__ import annotations

from typing import NamedTuple

VERSION = "v2.21.5-1"
COMMIT = "ab2b89c4c339bd7f816fbc114a4b05d386b66290"

ALGORITHMS = ("tree", "ring")                    # NCCL_ALGO_TREE = 0, NCCL_ALGO_RING = 1
PROTOCOLS = ("LL", "LL128", "Simple")            # NCCL_PROTO_LL, _LL128, _SIMPLE

# baseLat[a][p], us: "Tree { LL, LL128, Simple } , Ring { LL, LL128, Simple }"
BASE_LAT = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}

# hwLat[hw][a][p], us per hop, hw = NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET
HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)},
}

# Rows: VOLTA_COMPCAP_IDX, AMPERE_COMPCAP_IDX, HOPPER_COMPCAP_IDX; columns: 1, 2, >2 nodes.
# llMaxBws: "LL128 max BW per channel" says the source's comment, but it caps LL.
# (Rows for more than one node: Intel CPU = row 0, AMD = row 1.)
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0))
PER_CH_MAX_RING_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))

# treeCorrectionFactor[p][log2i(nBytes >> 6)]: entry k for sizes in [64 B * 2^k,
# 64 B * 2^(k+1)), k = 0..22: from 64 B to just under 512 MiB.
TREE_CORRECTION_FACTOR = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}

NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}     # getNetOverhead(), x 3 for Simple


def log2i(n):
    """NCCL's integer log2 (utils.h): floor(log2 n), and 0 for n < 2."""
    n, out = int(n), 0
    while n > 1:
        n >>= 1
        out += 1
    return out


class Prediction(NamedTuple):
    algorithm: str
    protocol: str
    time_us: float
    latency_us: float
    bandwidth_gbs: float      # algorithm bandwidth NCCL uses: bytes / (1000 * this) = us


def _compcap_index(compute_capability):
    return 2 if compute_capability >= 90 else 1 if compute_capability >= 80 else 0


def model(n_nodes, gpus_per_node, *, n_channels=16, bw_intra=20.0, bw_inter=12.0,
          compute_capability=90, intra="nvlink", cpu="intel", ll128=True):
    """``{(algorithm, protocol): (latency_us, bandwidth_gbs)}`` for AllReduce:
    ``comm->latencies`` and ``comm->bandwidths`` as ``ncclTopoTuneModel`` fills them.

    ``bw_intra``, ``bw_inter``: GB/s per channel inside a node and across nodes
    (defaults: an illustration, not a measured system); ``intra``: "nvlink" or
    "pci"; ``cpu``: "intel" or "amd" (picks LL's cap across nodes and the
    network post overhead).
    """
    if n_nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"n_nodes={n_nodes}, gpus_per_node={gpus_per_node}: both must be >= 1")
    n_ranks = n_nodes * gpus_per_node
    if n_ranks == 1:
        return {}
    cc = _compcap_index(compute_capability)
    index2 = n_nodes - 1 if n_nodes <= 2 else 2
    index1 = cc if n_nodes == 1 else (1 if cpu == "amd" else 0)
    ll_max_bw = LL_MAX_BWS[index1][index2]
    per_ch_tree = PER_CH_MAX_TREE_BWS[cc][index2]
    per_ch_ring_ll128 = PER_CH_MAX_RING_LL128_BWS[cc][index2]
    per_ch_tree_ll128 = PER_CH_MAX_TREE_LL128_BWS[cc][index2]
    ppn = n_ranks / n_nodes
    nsteps = 2 * (n_ranks - 1)
    n_inter_steps = 2 * n_nodes if n_nodes > 1 else 0
    out = {}
    for a in ALGORITHMS:
        for i, p in enumerate(PROTOCOLS):
            if p == "LL128" and not ll128:
                continue
            bw = bw_intra if n_nodes <= 2 else bw_inter
            bus = n_channels * bw
            if a == "ring" and p == "LL":
                bus = min(ll_max_bw, bus * .5)
            if a == "ring" and p == "LL128":
                bus = min(bus * (0.7 if ppn < 2 else 0.92), n_channels * per_ch_ring_ll128)
            if a == "tree":
                bus = min(bus * .92, n_channels * per_ch_tree)
            if a == "tree" and p == "LL":
                bus = min(bus * 1.0 / 3.8, ll_max_bw)
            if a == "tree" and p == "LL128":
                bus = min(bus * (7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0),
                          n_channels * per_ch_tree_ll128)
            # bus bandwidth -> algorithm bandwidth
            bus *= n_ranks / nsteps if a == "ring" else .5
            lat = BASE_LAT[a][i]
            intra_lat = HW_LAT[intra][a][i]
            inter_lat = HW_LAT["net"][a][i]          # + latencyInter (0), twice for Simple
            if a == "ring":
                overhead = 0.0
                if n_nodes > 1:
                    overhead = NET_OVERHEAD_US[cpu] * (3 if p == "Simple" else 1)
                intra_lat = max(intra_lat, overhead)
                lat += (nsteps - n_inter_steps) * intra_lat + n_inter_steps * inter_lat
            else:
                lat += 2 * ((n_ranks // n_nodes - 1) * intra_lat + log2i(n_nodes) * inter_lat)
            out[(a, p)] = (lat, bus)
    return out


def predict(nbytes, algorithm, protocol, n_nodes, gpus_per_node, **system):
    """NCCL's predicted time for one AllReduce of ``nbytes`` (``ncclTopoGetAlgoTime``
    with one operation, ``numPipeOps = 1``)."""
    table = model(n_nodes, gpus_per_node, **system)
    return _predict(table, nbytes, algorithm, protocol, n_nodes, gpus_per_node, **system)


def _predict(table, nbytes, a, p, n_nodes, gpus_per_node, n_channels=16,
             compute_capability=90, **_):
    lat, bw = table[(a, p)]
    log_size = log2i(int(nbytes) >> 6)
    if a == "tree" and log_size < 23:
        bw *= TREE_CORRECTION_FACTOR[p][log_size]
    n_ranks = n_nodes * gpus_per_node
    if a == "ring" and p == "Simple" and n_nodes > 1 and nbytes / (n_channels * n_ranks) >= 64:
        lat *= 1.4 if compute_capability >= 80 else 1.9      # "plateau effect of ring"
    return Prediction(a, p, lat + nbytes / (1000 * bw), lat, bw)


def choose(nbytes, n_nodes, gpus_per_node, **system):
    """The (algorithm, protocol) NCCL picks for an AllReduce of ``nbytes``: the
    smallest predicted time, first found wins a tie (tree before ring, LL
    before LL128 before Simple, as NCCL loops). One rank: ring/Simple, time 0."""
    if n_nodes * gpus_per_node == 1:
        return Prediction("ring", "Simple", 0.0, 0.0, float("inf"))
    table = model(n_nodes, gpus_per_node, **system)
    best = None
    for a, p in table:
        guess = _predict(table, nbytes, a, p, n_nodes, gpus_per_node, **system)
        if best is None or guess.time_us < best.time_us:
            best = guess
    return best


def algbw(nbytes, seconds):
    """nccl-tests' algorithm bandwidth, GB/s: the size over the time."""
    return nbytes / seconds / 1e9


def busbw(nbytes, seconds, n_ranks):
    """nccl-tests' bus bandwidth for AllReduce, GB/s: algbw * 2(n-1)/n."""
    return algbw(nbytes, seconds) * 2 * (n_ranks - 1) / n_ranks


def naive_tree_time_us(nbytes, n_ranks, alpha_us, bytes_per_us):
    """The common simplification NCCL's tree is *not*: 2 log2(N) full-size
    transfers one after the other (a reduce then a broadcast of whole vectors)."""
    return 2 * log2i(n_ranks) * (alpha_us + nbytes / bytes_per_us)


def crossover(n_nodes, gpus_per_node, lo=1, hi=1 << 34, **system):
    """Message sizes (bytes, powers of two from ``lo`` to ``hi``) where NCCL's
    choice changes: ``[(nbytes, Prediction), ...]`` for the first size of each
    new choice."""
    out, last, n = [], None, lo
    while n <= hi:
        c = choose(n, n_nodes, gpus_per_node, **system)
        if last is None or c[:2] != last:
            out.append((n, c))
            last = c[:2]
        n *= 2
    return out
