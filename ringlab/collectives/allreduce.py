"""AllReduce: every rank ends with the element-wise sum of every rank's vector.

The ring algorithm (Patarasuk and Yuan 2009; the one NCCL and Horovod made
famous) splits the vector into ``world_size`` chunks and runs two phases:

1. reduce-scatter: N-1 steps; each step every rank sends one chunk to its
   right neighbour and *adds* the chunk it receives from the left. Afterwards
   rank r holds chunk (r + 1) mod N fully reduced.
2. all-gather: N-1 more steps; every rank passes fully reduced chunks on to
   the right and *copies* what it receives.

Each rank sends 2(N-1) chunks, i.e. 2(N-1)/N of the vector: exactly the lower
bound. In any all-reduce whose messages carry data or partial sums, the ranks
together send at least 2(N-1) vectors, so the busiest rank sends at least
2(N-1)/N of one (Patarasuk and Yuan 2009); the ring meets that bound on every
rank, for every N.
"""

import numpy as np

from ..answers import answer
from ..comm import collective
from .broadcast import binomial_broadcast
from .reduce import binomial_reduce


@answer('ring_allreduce')
@collective
def ring_allreduce(comm, x, out=None):
    """Sum ``x`` over all ranks with the ring algorithm; every rank gets the sum.

    The sum goes to a new array, or to ``out`` if given: ``out=x`` sums in
    place, as ``torch.distributed.all_reduce`` does, and saves copying ``x``.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(ring_allreduce, [np.full(5, r, float) for r in range(3)])
    >>> res.outputs[2]
    array([3., 3., 3., 3., 3.])
    """
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    if out is None:
        out = np.array(x, copy=True)       # never modify the caller's array unless asked to
    elif out is not x:
        out[...] = x
    chunks = np.array_split(out, n)        # views into `out`; sizes differ by at most 1

    # Phase 1, reduce-scatter. At step k rank r sends chunk (r - k) and receives
    # chunk (r - k - 1): the one its left neighbour sends, seen from that
    # neighbour's index (left - k) == (r - 1 - k).
    for k in range(n - 1):
        send_c, recv_c = (rank - k) % n, (rank - k - 1) % n
        # sendrecv, not send-then-recv: that way it also works when sends block.
        chunks[recv_c] += comm.sendrecv(chunks[send_c], right, left, chunk=send_c, op="reduce")

    # Now chunk (rank + 1) is complete here. Phase 2, all-gather: pass complete
    # chunks on, starting with that one, and overwrite (not add) what arrives.
    for k in range(n - 1):
        send_c, recv_c = (rank + 1 - k) % n, (rank - k) % n
        chunks[recv_c][...] = comm.sendrecv(chunks[send_c], right, left, chunk=send_c, op="copy")
    return out


@answer('ring_allreduce')
@collective
def tree_allreduce(comm, x):
    """AllReduce as a binomial-tree reduce to rank 0 followed by a binomial-tree
    broadcast from it: 2 ceil(log2 N) steps instead of the ring's 2(N-1), but
    every message carries the whole vector instead of 1/N of it.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(tree_allreduce, [np.full(3, float(r)) for r in range(8)])
    >>> res.outputs[5], res.trace.steps      # 3 steps up, 3 steps down
    (array([28., 28., 28.]), 6)

    (NCCL's trees are pipelined double binary trees; this is the textbook form.)
    """
    total = binomial_reduce(comm, x, 0)          # the sum on rank 0, None elsewhere
    return binomial_broadcast(comm, total, 0)
