"""What each collective costs, in closed form: the numbers its trace will show.

For every reference algorithm in ``ringlab.collectives`` there is a function
of the same name here, returning a ``Cost``::

    >>> from ringlab import cost
    >>> cost.ring_allgather(world_size=4, nbytes=4096)
    Cost(steps=3, messages=12, max_bytes_sent=3072, max_bytes_received=3072, total_bytes=12288)
    >>> cost.binomial_broadcast(8, 1000).steps, cost.tree_broadcast(8, 1000).steps
    (3, 4)

The columns:

* ``steps``: the step count of the one-port model (a rank sends at most one
  and receives at most one message per step; a message is forwarded in a
  later step than it arrived), i.e. the number of message latencies one
  after the other: the alpha term.
* ``messages``: messages sent in total.
* ``max_bytes_sent`` / ``max_bytes_received``: by the busiest rank. The bytes
  one rank must push through its link: the beta term of algorithms whose
  ranks all work at once (ring, recursive doubling, pairwise).
* ``total_bytes``: over all links.

What ``nbytes`` means (as in MPICH's comments and in Thakur et al.):

* AllGather: the size of the *result* (N blocks of nbytes / N).
* ReduceScatter, AllReduce, Reduce, Broadcast: the size of one rank's vector.
* AlltoAll: one rank's whole send buffer, N blocks of nbytes / N (its own
  block included). MPICH's n, "the total amount of data a process needs to
  send to all other processes", is (N-1)/N of it.

The formulas assume the data splits evenly (nbytes divisible by N, or by the
segment count); then they are exact. Otherwise per-block averages come out as
floats. Every formula is checked against the simulator's traces in
``tests/cost/test_cost.py``.

Sources. The algorithms and their alpha-beta costs: R. Thakur, R. Rabenseifner
and W. Gropp, "Optimization of Collective Communication Operations in MPICH",
Int. J. High Performance Computing Applications 19(1):49-66, 2005 (ring and
recursive-doubling allgather: (p-1)/p n beta; binomial broadcast: lg p (alpha
+ n beta); pairwise-exchange alltoall: (p-1) alpha + n beta). Lower bounds and
the minimum-spanning-tree (binomial) and bucket (ring) algorithms: E. Chan,
M. Heimlich, A. Purkayastha and R. van de Geijn, "Collective communication:
theory, practice, and experience", Concurrency and Computation: Practice and
Experience 19(13):1749-1783, 2007. Ring AllReduce: P. Patarasuk and X. Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations",
J. Parallel Distrib. Comput. 69(2):117-124, 2009. The step counts of the
binary tree and of the binomial reduce are derived below for this book's
one-port step model.
"""

from __future__ import annotations

from typing import NamedTuple


class Cost(NamedTuple):
    steps: int
    messages: int
    max_bytes_sent: int | float
    max_bytes_received: int | float
    total_bytes: int | float


def _exact(x):
    """An int when x is whole (the usual case: sizes divide evenly)."""
    return int(x) if float(x).is_integer() else x


def _cost(steps, messages, max_sent, max_received, total):
    return Cost(int(steps), int(messages), _exact(max_sent), _exact(max_received), _exact(total))


_NOTHING = Cost(0, 0, 0, 0, 0)       # a world of one rank never sends


# -- helpers: the step counts of trees ---------------------------------------------

def ceil_log2(n):
    """ceil(log2 n) for n >= 1, exactly (no floating point)."""
    return (n - 1).bit_length()


def max_popcount(k):
    """The most 1-bits any integer in 0..k has: max(popcount(k), bitlength(k) - 1).

    Either k itself, or k's top bit cleared and every bit below it set (that
    number is smaller than k and has bitlength(k) - 1 ones); nothing between
    does better."""
    return max(bin(k).count("1"), k.bit_length() - 1)


def binary_tree_steps(n):
    """Steps of ``tree_broadcast`` (heap tree, one port) on n ranks.

    Position i receives at step depth(i) + (right turns on its path): the left
    child gets the data one step after its parent, the right child two. In
    binary, i + 1 spells the path (after the leading 1: 0 = left, 1 = right),
    so the step is bitlength(i+1) - 1 + popcount(i+1) - 1. The full levels
    above the last give at most 2(d - 1), d = floor(log2 n), from position
    2^d - 2; on the last level (i + 1 = 2^d + m, m <= n - 2^d) the most right
    turns are max_popcount(n - 2^d).
    """
    if n <= 1:
        return 0
    d = n.bit_length() - 1
    return max(2 * d - 2, d + max_popcount(n - 2 ** d))


def binomial_reduce_steps(n):
    """Steps of ``binomial_reduce`` on n ranks: ceil(log2 n).

    In the one-port model a rank receives one message per step, so the root,
    which has ceil(log2 n) children, needs at least that many steps. It needs
    no more: by induction the child at distance 2^j (whose subtree has at most
    2^j ranks) has its partial sum ready after step j, and the root takes it
    in step j + 1, one child per step, smallest subtree first."""
    return ceil_log2(n) if n > 1 else 0


# -- AllGather (nbytes = the gathered result) ----------------------------------------

def ring_allgather(world_size, nbytes):
    """N-1 steps; every rank sends N-1 blocks: (N-1)/N of the result (Thakur et al. 2005)."""
    n, block = world_size, nbytes / world_size
    if n == 1:
        return _NOTHING
    return _cost(n - 1, n * (n - 1), (n - 1) * block, (n - 1) * block, n * (n - 1) * block)


def naive_allgather(world_size, nbytes):
    """Gather to the root (N-1 steps: it receives one block per step), then the
    root sends the whole result N-1 times: 2(N-1) steps."""
    n, block = world_size, nbytes / world_size
    if n == 1:
        return _NOTHING
    return _cost(2 * (n - 1), 2 * (n - 1), (n - 1) * nbytes, nbytes, (n - 1) * block + (n - 1) * nbytes)


def recursive_doubling_allgather(world_size, nbytes):
    """log2 N steps (power-of-two N); the same bytes as the ring (Thakur et al. 2005)."""
    n, block = world_size, nbytes / world_size
    if n & (n - 1):
        raise ValueError(f"recursive doubling needs a power-of-two world_size, got {n}")
    if n == 1:
        return _NOTHING
    k = ceil_log2(n)
    return _cost(k, n * k, (n - 1) * block, (n - 1) * block, n * (n - 1) * block)


# -- ReduceScatter (nbytes = one rank's input vector) ----------------------------------

def ring_reduce_scatter(world_size, nbytes):
    """N-1 steps; every rank sends N-1 chunks: (N-1)/N of its vector (Thakur et al. 2005)."""
    return ring_allgather(world_size, nbytes)      # the same messages, adding instead of copying


# -- Broadcast (nbytes = the vector) ------------------------------------------------

def flat_broadcast(world_size, nbytes):
    """The root sends N-1 whole vectors, one per step."""
    n = world_size
    return _NOTHING if n == 1 else _cost(n - 1, n - 1, (n - 1) * nbytes, nbytes, (n - 1) * nbytes)


def chain_broadcast(world_size, nbytes, segments=1):
    """Segment s leaves the root at step s + 1 and reaches the end of the chain
    N-2 steps later: N - 2 + S steps. Every rank but the last sends the vector once."""
    n, s = world_size, segments
    if n == 1:
        return _NOTHING
    return _cost(n - 2 + s, (n - 1) * s, nbytes, nbytes, (n - 1) * nbytes)


def tree_broadcast(world_size, nbytes):
    """Binary heap tree: ``binary_tree_steps(N)`` steps, about 2 log2 N, not log2 N."""
    n = world_size
    if n == 1:
        return _NOTHING
    return _cost(binary_tree_steps(n), n - 1, min(2, n - 1) * nbytes, nbytes, (n - 1) * nbytes)


def binomial_broadcast(world_size, nbytes):
    """ceil(log2 N) steps; the root sends ceil(log2 N) whole vectors (Thakur et al. 2005)."""
    n = world_size
    if n == 1:
        return _NOTHING
    k = ceil_log2(n)
    return _cost(k, n - 1, k * nbytes, nbytes, (n - 1) * nbytes)


# -- Reduce and AllReduce (nbytes = one rank's vector) ---------------------------------

def binomial_reduce(world_size, nbytes):
    """Every non-root sends one partial sum; the root receives ceil(log2 N) of them."""
    n = world_size
    if n == 1:
        return _NOTHING
    return _cost(binomial_reduce_steps(n), n - 1, nbytes, ceil_log2(n) * nbytes, (n - 1) * nbytes)


def ring_allreduce(world_size, nbytes):
    """2(N-1) steps; every rank sends 2(N-1)/N of the vector (Patarasuk and Yuan 2009)."""
    rs = ring_reduce_scatter(world_size, nbytes)
    return Cost(*(2 * v for v in rs))              # reduce-scatter, then an all-gather as big


def tree_allreduce(world_size, nbytes):
    """``binomial_reduce`` then ``binomial_broadcast``: their steps and messages add up.
    No rank is busier than the root, which receives ceil(log2 N) vectors going
    up and sends as many going down."""
    n = world_size
    if n == 1:
        return _NOTHING
    up, down = binomial_reduce(n, nbytes), binomial_broadcast(n, nbytes)
    k = ceil_log2(n)
    return _cost(up.steps + down.steps, up.messages + down.messages, k * nbytes, k * nbytes,
                 up.total_bytes + down.total_bytes)


# -- AlltoAll (nbytes = one rank's whole send buffer, N blocks) --------------------------

def alltoall(world_size, nbytes):
    """Direct: N-1 messages per rank, one block each (Thakur et al. 2005: (p-1) alpha + n beta)."""
    return ring_allgather(world_size, nbytes)      # N(N-1) one-block messages in N-1 steps


def pairwise_alltoall(world_size, nbytes):
    """The same messages as ``alltoall``, in N-1 rounds of pairwise exchanges."""
    return alltoall(world_size, nbytes)


def ring_alltoall(world_size, nbytes):
    """N-1 steps; at step k each rank forwards N-k blocks, so it sends
    (N-1) + (N-2) + ... + 1 = N(N-1)/2 blocks: N/2 times the direct algorithm."""
    n, block = world_size, nbytes / world_size
    if n == 1:
        return _NOTHING
    per_rank = n * (n - 1) // 2 * block
    return _cost(n - 1, n * (n - 1), per_rank, per_rank, n * per_rank)


# -- the table for the book -----------------------------------------------------------

ALGORITHMS = {
    "AllGather": ["ring_allgather", "naive_allgather", "recursive_doubling_allgather"],
    "ReduceScatter": ["ring_reduce_scatter"],
    "Broadcast": ["flat_broadcast", "chain_broadcast", "tree_broadcast", "binomial_broadcast"],
    "Reduce": ["binomial_reduce"],
    "AllReduce": ["ring_allreduce", "tree_allreduce"],
    "AlltoAll": ["alltoall", "pairwise_alltoall", "ring_alltoall"],
}


def table(world_size, nbytes, segments=4, collective=None):
    """One row (a dict) per algorithm, for ``world_size`` ranks and ``nbytes``.

    Algorithms that cannot run on this world size (recursive doubling on a
    non-power of two) are left out. ``segments`` is for ``chain_broadcast``.

    >>> [r["algorithm"] for r in table(4, 1024, collective="Broadcast")]
    ['flat_broadcast', 'chain_broadcast', 'tree_broadcast', 'binomial_broadcast']
    """
    rows = []
    for coll, names in ALGORITHMS.items():
        if collective is not None and coll != collective:
            continue
        for name in names:
            if name == "recursive_doubling_allgather" and world_size & (world_size - 1):
                continue
            fn = globals()[name]
            c = fn(world_size, nbytes, segments) if name == "chain_broadcast" else fn(world_size, nbytes)
            rows.append({"collective": coll, "algorithm": name, **c._asdict()})
    return rows
