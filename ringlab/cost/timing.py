"""Seconds, in closed form: the alpha-beta(-gamma) time of every collective.

Under ``network=AlphaBeta(alpha, beta)`` a message of b bytes takes
``alpha + b * beta`` seconds, and every rank has one send port and one
receive port, each carrying one message at a time, first come first served
(the one-port model, ``ringlab.cost.alpha_beta``). Reductions may also cost
``gamma`` seconds per byte added. Then every algorithm here takes

    time = latency * alpha + bandwidth * nbytes * beta + compute * nbytes * gamma

with three numbers that depend only on N (and the algorithm's parameters):
its ``Terms``. ``nbytes`` means what it means in ``closed_forms`` (the
gathered result for AllGather, one rank's vector otherwise, one rank's whole
send buffer for AlltoAll), and divides evenly.

    >>> from ringlab import cost
    >>> cost.terms("ring_allreduce", 4)
    Terms(latency=6, bandwidth=3/2, compute=3/4)
    >>> round(cost.time("ring_allreduce", 4, 4000, alpha=1e-5, beta=1e-9) * 1e6, 3)
    66.0

======================================  ===========  ===================  =========
algorithm (N ranks, L = ceil(log2 N))   latency      bandwidth            compute
======================================  ===========  ===================  =========
ring_allgather, ring_reduce_scatter     N-1          (N-1)/N              (N-1)/N *
recursive_doubling_allgather            log2 N       (N-1)/N
naive_allgather                         2(N-1)       (N-1)/N + (N-1)
flat_broadcast                          N-1          N-1
chain_broadcast (S segments)            N-2+S        (N-2+S)/S
tree_broadcast (T = binary_tree_steps)  T            T
binomial_broadcast                      L            L
binomial_reduce                         L            L                    L (bound)
ring_allreduce                          2(N-1)       2(N-1)/N             (N-1)/N
tree_allreduce                          2L           2L                   L (bound)
bidirectional_ring_allreduce            4(N-1)       2(N-1)/N             (N-1)/N
  ... with ports="link", N > 2          2(N-1)       (N-1)/N              (N-1)/N
hierarchical_allreduce (M x G)          2(G-1)+2(M-1)  2(MG-1)/(MG)        (MG-1)/(MG)
alltoall, pairwise_alltoall             N-1          (N-1)/N
ring_alltoall                           N-1          (N-1)/2
======================================  ===========  ===================  =========

(* ring_reduce_scatter only.) Where they agree with the literature:
Thakur, Rabenseifner and Gropp 2005 (Int. J. HPC Applications 19(1)) give
ring and recursive-doubling allgather, binomial broadcast ``lg p (alpha + n
beta)``, ring/pairwise reduce-scatter ``(p-1) alpha + (p-1)/p n (beta +
gamma)``, binomial reduce ``lg p (alpha + n beta + n gamma)`` and pairwise
alltoall ``(p-1) alpha + n beta`` (their n = (N-1)/N of ours); Patarasuk and
Yuan 2009 (J. Parallel Distrib. Comput. 69(2)) the ring AllReduce
``2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma``; Chan et al. 2007
(Concurrency Computat.: Pract. Exper. 19(13)) the same forms as lower bounds
and minimum-spanning-tree/bucket algorithms. Where ours differ, it is the
port model:

* ``tree_broadcast``: a heap-ordered binary tree needs ``binary_tree_steps(N)``
  (about 2 log2 N) rounds, not log2 N: a node feeds its two children through
  one send port, one after the other.
* the three whole-vector trees and ``flat_broadcast`` are not pipelined: each
  round moves the whole vector, so the bandwidth term is as large as the
  latency term (L n beta), which is why pipelined trees (NCCL's) exist.
* ``binomial_reduce`` with gamma > 0: exact, ``L (alpha + n beta + n gamma)``,
  for N a power of two. For other N the first-come-first-served receive port
  takes the leaves' partial sums in a different order from the one the
  parent adds them in, and the simulator is a little faster; ``L (...)`` is
  then an upper bound and ``L (alpha + n beta) + n gamma`` a lower one (both
  tested). With gamma = 0 it is exact for every N.
* ``bidirectional_ring_allreduce``: one send port carries both rings'
  messages, so it costs twice the ring's alphas for the same betas; only
  with one port per link (``ports="link"``) does it halve the beta term.
* ``hierarchical_allreduce`` on one uniform network has the flat ring's
  bandwidth term and fewer alphas; on a two-level network see ``two_level_time``.

gamma is checked against the simulator through copies of the reductions that
spend ``comm.compute(gamma * bytes)`` after each addition
(``tests/programs/reduction_variants.py``), added before the next send (no overlap of
adding and sending); the reference collectives themselves take no time to add.
"""

from __future__ import annotations

import inspect
from fractions import Fraction
from typing import NamedTuple

from .closed_forms import binary_tree_steps, ceil_log2


class Terms(NamedTuple):
    """Coefficients of alpha, nbytes * beta and nbytes * gamma (exact fractions)."""
    latency: Fraction
    bandwidth: Fraction
    compute: Fraction = Fraction(0)

    def time(self, nbytes, alpha, beta, gamma=0.0):
        return (float(self.latency) * alpha + float(self.bandwidth) * nbytes * beta
                + float(self.compute) * nbytes * gamma)

    def __repr__(self):
        return (f"Terms(latency={self.latency}, bandwidth={self.bandwidth}, "
                f"compute={self.compute})")


def _t(latency, bandwidth, compute=0):
    return Terms(Fraction(latency), Fraction(bandwidth), Fraction(compute))


def _ring(n, phases, reduce_phases):
    """Ring algorithms: N-1 steps of n/N bytes per phase."""
    f = Fraction(n - 1, n)
    return _t(phases * (n - 1), phases * f, reduce_phases * f)


# One function per algorithm: N -> Terms. Extra parameters as keywords.
def ring_allgather(n):
    return _ring(n, 1, 0)


def ring_reduce_scatter(n):
    return _ring(n, 1, 1)


def recursive_doubling_allgather(n):
    if n & (n - 1):
        raise ValueError(f"recursive doubling needs a power-of-two world_size, got {n}")
    return _t(ceil_log2(n), Fraction(n - 1, n))


def naive_allgather(n):
    # gather: the root takes N-1 blocks, one at a time; then sends N-1 whole results
    return _t(2 * (n - 1), Fraction(n - 1, n) + (n - 1))


def flat_broadcast(n):
    return _t(n - 1, n - 1)


def chain_broadcast(n, segments=1):
    # segment s reaches the end of the chain after N-1+s message times of 1/S of the vector
    if n == 1:
        return _t(0, 0)
    k = n - 2 + segments
    return _t(k, Fraction(k, segments))


def tree_broadcast(n):
    t = binary_tree_steps(n)
    return _t(t, t)


def binomial_broadcast(n):
    return _t(ceil_log2(n), ceil_log2(n))


def binomial_reduce(n):
    lg = ceil_log2(n)
    return _t(lg, lg, lg)


def ring_allreduce(n):
    return _ring(n, 2, 1)


def tree_allreduce(n):
    lg = ceil_log2(n)
    return _t(2 * lg, 2 * lg, lg)


def bidirectional_ring_allreduce(n, ports="rank"):
    f = Fraction(n - 1, n)
    if n == 1:
        return _t(0, 0)
    if ports == "link" and n > 2:         # the two rings use different wires
        return _t(2 * (n - 1), f, f)
    return _t(4 * (n - 1), 2 * f, f)       # two messages of n/(2N) per step, one port


def hierarchical_allreduce(n, gpus_per_node):
    g = gpus_per_node
    if n % g:
        raise ValueError(f"hierarchical_allreduce: world_size {n} is not a multiple of "
                         f"gpus_per_node {g}")
    m = n // g
    return _t(2 * (g - 1) + 2 * (m - 1), Fraction(2 * (n - 1), n), Fraction(n - 1, n))


def alltoall(n):
    return _t(n - 1, Fraction(n - 1, n))


def pairwise_alltoall(n):
    return alltoall(n)          # the same messages, in pairs


def ring_alltoall(n):
    return _t(n - 1, Fraction(n - 1, 2))


ALGORITHMS = {f.__name__: f for f in [
    ring_allgather, naive_allgather, recursive_doubling_allgather, ring_reduce_scatter,
    flat_broadcast, chain_broadcast, tree_broadcast, binomial_broadcast, binomial_reduce,
    ring_allreduce, tree_allreduce, bidirectional_ring_allreduce, hierarchical_allreduce,
    alltoall, pairwise_alltoall, ring_alltoall]}


def _name(alg):
    name = alg if isinstance(alg, str) else getattr(alg, "__name__", repr(alg))
    if name not in ALGORITHMS:
        raise KeyError(f"no closed form for {name!r}; known: {sorted(ALGORITHMS)}")
    return name


def terms(alg, world_size, **params):
    """The ``Terms`` of ``alg`` (a name or the function) on ``world_size`` ranks.
    Parameters the algorithm does not take are ignored (so one call can pass
    ``segments=``, ``ports=``, ``gpus_per_node=`` to a mix of algorithms)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    fn = ALGORITHMS[_name(alg)]
    accepted = inspect.signature(fn).parameters
    return fn(world_size, **{k: v for k, v in params.items() if k in accepted})


def time(alg, world_size, nbytes, alpha, beta, gamma=0.0, **params):
    """Seconds ``alg`` takes on ``world_size`` ranks for ``nbytes`` under the
    one-port alpha-beta model (plus ``gamma`` seconds per byte reduced)."""
    return terms(alg, world_size, **params).time(nbytes, alpha, beta, gamma)


def crossover(alg_a, alg_b, world_size, alpha, beta, gamma=0.0, **params):
    """The message size (bytes, an exact ``Fraction``) where ``alg_a`` and
    ``alg_b`` take equal time, or ``None`` if they never tie at a positive size.

    Both times are linear in nbytes, so this solves
    ``(La - Lb) alpha = nbytes ((Bb - Ba) beta + (Gb - Ga) gamma)`` exactly.
    Below it the one with fewer alphas wins, above it the one with fewer betas.

    >>> float(crossover("tree_allreduce", "ring_allreduce", 8, alpha=1e-5, beta=1e-9))
    18823.529411764706
    """
    a, b = terms(alg_a, world_size, **params), terms(alg_b, world_size, **params)
    alpha, beta, gamma = Fraction(alpha), Fraction(beta), Fraction(gamma)
    slope = (a.bandwidth - b.bandwidth) * beta + (a.compute - b.compute) * gamma
    if slope == 0:
        return None
    n = (b.latency - a.latency) * alpha / slope
    return n if n > 0 else None


def fastest(algs, world_size, nbytes, alpha, beta, gamma=0.0, **params):
    """The name of the fastest of ``algs`` (first listed wins a tie)."""
    return min((_name(a) for a in algs),
               key=lambda a: time(a, world_size, nbytes, alpha, beta, gamma, **params))


def crossover_table(algs, world_sizes, alpha, beta, gamma=0.0, **params):
    """One row per world size and pair of ``algs``: where they tie, and who wins
    below and above that size."""
    names = [_name(a) for a in algs]
    rows = []
    for n in world_sizes:
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                x = crossover(a, b, n, alpha, beta, gamma, **params)
                if x is None:
                    continue
                fewer_alphas = terms(a, n, **params).latency < terms(b, n, **params).latency
                small, large = (a, b) if fewer_alphas else (b, a)
                rows.append({"world_size": n, "a": a, "b": b, "crossover_bytes": float(x),
                             "below": small, "above": large})
    return rows


# -- two levels: fast links inside a node, slow ones between nodes ---------------------------

def two_level_time(alg, nodes, gpus_per_node, nbytes, intra, inter, gamma=0.0):
    """Seconds of ``ring_allreduce`` or ``hierarchical_allreduce`` over ``nodes``
    nodes of ``gpus_per_node`` ranks on ``TwoLevel(intra, inter, gpus_per_node)``
    (``intra``, ``inter``: ``AlphaBeta``). Each rank has its own ports (a NIC per GPU).

    The flat ring moves in lockstep at the pace of its slowest link: each of
    its 2(N-1) steps costs max(intra, inter) for n/N bytes (a max-plus
    recurrence: the longest chain of dependent messages stays on the slowest
    link). The hierarchical one pays intra-node steps for 2(G-1)/G of n and
    inter-node steps for only 2(M-1)/(MG) of n.

    >>> from ringlab.cost.alpha_beta import AlphaBeta
    >>> nv, ib = AlphaBeta(1e-6, 1 / 450e9), AlphaBeta(5e-6, 1 / 50e9)
    >>> [round(two_level_time(a, 4, 8, 2**28, nv, ib) * 1e3, 3)
    ...  for a in ("ring_allreduce", "hierarchical_allreduce")]
    [10.712, 2.095]
    """
    name = _name(alg)
    m, g = nodes, gpus_per_node
    n = m * g
    if n == 1:
        return 0.0
    if name == "ring_allreduce":
        b = nbytes / n
        step = max([ab.message(b) for ab, present in ((intra, g > 1), (inter, m > 1)) if present])
        return 2 * (n - 1) * step + (n - 1) * b * gamma
    if name == "hierarchical_allreduce":
        inside = 2 * (g - 1) * intra.message(nbytes / g) + (g - 1) * nbytes / g * gamma
        across = 2 * (m - 1) * inter.message(nbytes / n) + (m - 1) * nbytes / n * gamma
        return inside + across
    raise KeyError(f"two_level_time knows ring_allreduce and hierarchical_allreduce, not {name!r}")
