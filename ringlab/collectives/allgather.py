"""AllGather: every rank ends with every rank's vector, concatenated in rank order.

Three ways to do it, from the worst to the best known:

* ``naive_allgather``: everyone sends its vector to one root, which
  concatenates and sends the whole result back to everyone. The root's link
  carries N-1 whole results: it is the bottleneck.
* ``ring_allgather``: N-1 steps; in every step each rank passes one block to its
  right neighbour, the block it received in the step before. Every rank sends
  (N-1)/N of the result, and no algorithm can do with less: every rank must
  receive the N-1 blocks it lacks, so N(N-1) blocks cross links in all, and
  some rank sends at least N-1 of them. The second phase of ring AllReduce is
  exactly this.
* ``recursive_doubling_allgather``: log2(N) steps for power-of-two N; in step k
  ranks 2^k apart swap everything they have so far. Same bytes, fewer steps,
  but partners are not neighbours.

Blocks are labelled in the trace by the rank they came from: ``chunk=3`` is
rank 3's vector; a message carrying several blocks has a tuple of them.
"""

import numpy as np

from ..answers import answer
from ..comm import collective
from .broadcast import check_root, flat_broadcast


@answer('ring_allgather', 'fix_ring_allgather')
@collective
def ring_allgather(comm, x):
    """Gather every rank's ``x`` on every rank, around a ring; returns the concatenation.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(ring_allgather, [np.array([10.0 * r, 10.0 * r + 1]) for r in range(3)])
    >>> res.outputs[1]
    array([ 0.,  1., 10., 11., 20., 21.])
    >>> res.trace.steps        # world_size - 1
    2

    The ranks' vectors may even differ in length (receivers take whatever
    arrives), which lets ``ring_allgather`` undo ``ring_reduce_scatter``.
    """
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    blocks = [None] * n
    blocks[rank] = np.array(x, copy=True)
    # At step k rank r passes on block (r - k): its own at first, then always
    # the one it received in the step before. Its left neighbour does the same,
    # so what arrives is block (r - 1 - k). After N-1 steps every block has
    # travelled N-1 links to the right and visited every rank.
    for k in range(n - 1):
        send_b, recv_b = (rank - k) % n, (rank - k - 1) % n
        blocks[recv_b] = comm.sendrecv(blocks[send_b], right, left, chunk=send_b, op="copy")
    return np.concatenate(blocks)


@answer('ring_allgather', 'fix_ring_allgather')
@collective
def naive_allgather(comm, x, root=0):
    """AllGather through one rank: gather everything to ``root``, then
    broadcast the whole result from there with ``flat_broadcast``.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(naive_allgather, [np.array([float(r)]) for r in range(4)])
    >>> res.outputs[3], res.trace.steps     # N-1 steps to gather (one receive a step), N-1 back
    (array([0., 1., 2., 3.]), 6)
    """
    n, rank = comm.world_size, comm.rank
    check_root(comm, root, "naive_allgather")
    result = None
    if rank != root:
        comm.send(x, root, chunk=rank, op="copy")
    else:
        blocks = [None] * n
        blocks[root] = np.array(x, copy=True)
        for src in range(n):
            if src != root:
                blocks[src] = comm.recv(src)
        result = np.concatenate(blocks)
    # The root now sends the whole result N-1 times, one copy per step.
    return flat_broadcast(comm, result, root)


@answer('ring_allgather', 'fix_ring_allgather')
@collective
def recursive_doubling_allgather(comm, x):
    """AllGather in log2(N) steps for a power-of-two world_size.

    In step k (k = 0, 1, ...) rank r swaps with rank ``r XOR 2^k`` all the
    blocks it has: after step k it holds the 2^(k+1) blocks of its group of
    ranks that agree in all but the lowest k+1 bits.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(recursive_doubling_allgather, [np.array([float(r)]) for r in range(4)])
    >>> res.outputs[0], res.trace.steps
    (array([0., 1., 2., 3.]), 2)
    """
    n, rank = comm.world_size, comm.rank
    if n & (n - 1):
        raise ValueError(f"rank {rank}: recursive_doubling_allgather needs a power-of-two world_size, "
                         f"got {n}; use ring_allgather for other sizes")
    x = np.asarray(x)
    length = len(x)                      # every rank's block has this length
    out = np.empty(n * length, dtype=x.dtype)
    out[rank * length:(rank + 1) * length] = x
    dist = 1
    while dist < n:
        partner = rank ^ dist
        # My group is the `dist` consecutive blocks starting at a multiple of dist.
        mine, theirs = (rank // dist) * dist, (partner // dist) * dist
        send = out[mine * length:(mine + dist) * length]
        got = comm.sendrecv(send, partner, partner, chunk=tuple(range(mine, mine + dist)), op="copy")
        out[theirs * length:(theirs + dist) * length] = got
        dist *= 2
    return out

