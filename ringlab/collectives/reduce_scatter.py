"""ReduceScatter: sum every rank's vector, and leave chunk r of the sum on rank r.

Convention: the vector is cut as ``np.array_split(x, world_size)`` cuts it
(the first ``len % N`` chunks one element longer) and rank r ends with chunk
r. That is what ``MPI_Reduce_scatter_block``, NCCL's ``ncclReduceScatter`` and
``torch.distributed.reduce_scatter_tensor`` give you, so there is no second
convention to choose. (Inside ring AllReduce, the first phase leaves chunk
r+1 on rank r; that is an implementation detail, which the all-gather phase
that follows does not mind.)

The ring algorithm takes N-1 steps. In every step each rank sends one chunk
to its right neighbour and *adds* the chunk that arrives from its left; a
chunk collects one more contribution with every link it crosses, and after
N-1 links it holds all N.

ReduceScatter followed by AllGather is AllReduce:
``ring_allgather(comm, ring_reduce_scatter(comm, x))`` sums ``x`` over all
ranks in 2(N-1) steps, exactly like ``ring_allreduce``.
"""

import numpy as np

from ..answers import answer
from ..comm import collective


@answer('ring_reduce_scatter')
@collective
def ring_reduce_scatter(comm, x):
    """Return chunk ``rank`` of the element-wise sum of all ranks' ``x``.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(ring_reduce_scatter, [np.arange(5.0) * (r + 1) for r in range(3)])
    >>> res.outputs            # the sum is [0, 6, 12, 18, 24], cut into 2 + 2 + 1
    [array([0., 6.]), array([12., 18.]), array([24.])]
    >>> res.trace.steps
    2
    """
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    out = np.array(x, copy=True)            # never modify the caller's array
    chunks = np.array_split(out, n)         # views into `out`
    # Work backwards from the goal. Chunk c must arrive complete at rank c at
    # the last step, so it starts at rank c + 1 (N-1 links to the left of c,
    # going right) and gets one more contribution at every rank it passes.
    # Hence at step k rank r sends chunk (r - k - 1), its own contribution at
    # k = 0 and after that the chunk it just added into, and receives chunk
    # (r - k - 2), the one its left neighbour sends.
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        chunks[recv_c] += comm.sendrecv(chunks[send_c], right, left, chunk=send_c, op="reduce")
    return chunks[rank].copy()              # a copy: don't keep the whole buffer alive
