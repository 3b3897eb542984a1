"""AlltoAll: every rank has one block for every rank, and gets one from every rank.

Signature ``program(comm, blocks) -> out``: ``blocks[c]`` is what this rank
sends to rank c, and ``out[c]`` is what rank c sent to this rank. Seen from the
whole world, with ``blocks[r][c]`` on rank r: rank c ends with
``out[c][r] == blocks[r][c]``, a transpose. ``out[rank]`` is the rank's own
``blocks[rank]``, which never leaves it. (This is how mixture-of-experts layers
send each token to its expert's rank and back.)

* ``alltoall``: direct. Each rank sends block c straight to rank c: N-1
  messages, each block crosses one link once.
* ``pairwise_alltoall``: the same messages, in N-1 rounds of exchanges between
  pairs of ranks: partner ``rank XOR k`` for a power-of-two world, otherwise send
  to ``rank + k`` and receive from ``rank - k``. Pairing keeps every rank
  sending to one rank and receiving from one rank at a time.
* ``ring_alltoall``: only ring neighbours talk. Each rank sends all the blocks
  that are still travelling to its right neighbour, which keeps the first (it
  is for that rank) and forwards the rest. A block for the rank d hops to the
  right crosses d links, so in total the ring moves about N/2 times the bytes
  of the direct algorithm, in the same N-1 steps.

Messages are labelled with the blocks they carry: ``chunk=(src, dst)`` for one
block, a tuple of such pairs for several.
"""

import numpy as np

from ..answers import answer
from ..comm import collective


def _check_blocks(comm, blocks, name):
    n = comm.world_size
    if len(blocks) != n:
        raise ValueError(f"rank {comm.rank}: {name} needs one block per rank (world_size={n}), "
                         f"got {len(blocks)}")
    return [np.asarray(b) for b in blocks]


@answer('alltoall', 'ring_alltoall')
@collective
def alltoall(comm, blocks):
    """Direct AlltoAll: send ``blocks[c]`` straight to rank c, for every c.

    >>> import numpy as np, ringlab
    >>> send = [[np.array([10.0 * r + c]) for c in range(3)] for r in range(3)]
    >>> res = ringlab.run(alltoall, send)
    >>> [float(b[0]) for b in res.outputs[1]]     # what ranks 0, 1, 2 sent to rank 1
    [1.0, 11.0, 21.0]
    """
    n, rank = comm.world_size, comm.rank
    blocks = _check_blocks(comm, blocks, "alltoall")
    # Post every receive first, then every send, then wait: no order of
    # waiting can deadlock. Rank r sends to r+1, r+2, ... so that in the first
    # step not everyone sends to rank 0 at once.
    recvs = {src: comm.irecv(src) for src in range(n) if src != rank}
    sends = [comm.isend(blocks[dst], dst, chunk=(rank, dst), op="copy")
             for dst in ((rank + k) % n for k in range(1, n))]
    for req in sends:
        req.wait()
    out = [None] * n
    out[rank] = blocks[rank].copy()
    for src, req in recvs.items():
        out[src] = req.wait()
    return out


@answer('alltoall', 'ring_alltoall')
@collective
def pairwise_alltoall(comm, blocks):
    """AlltoAll in N-1 rounds; in round k each rank swaps one block with one partner.

    >>> import numpy as np, ringlab
    >>> send = [[np.array([10.0 * r + c]) for c in range(4)] for r in range(4)]
    >>> res = ringlab.run(pairwise_alltoall, send)
    >>> [(e.step, e.src, e.dst) for e in res.trace.at_step(1)]   # 0 <-> 1, 2 <-> 3
    [(1, 0, 1), (1, 1, 0), (1, 2, 3), (1, 3, 2)]
    """
    n, rank = comm.world_size, comm.rank
    blocks = _check_blocks(comm, blocks, "pairwise_alltoall")
    power_of_two = n & (n - 1) == 0
    out = [None] * n
    out[rank] = blocks[rank].copy()
    for k in range(1, n):
        if power_of_two:
            # XOR pairs ranks up both ways: if r ^ k = p then p ^ k = r.
            dst = src = rank ^ k
        else:
            # Otherwise a shift: everyone sends k to the right and receives
            # from k to the left; over k = 1..N-1 that covers every pair.
            dst, src = (rank + k) % n, (rank - k) % n
        out[src] = comm.sendrecv(blocks[dst], dst, src, chunk=(rank, dst), op="copy")
    return out


@answer('ring_alltoall', 'alltoall')
@collective
def ring_alltoall(comm, blocks):
    """AlltoAll between ring neighbours only: blocks travel right until they arrive.

    All blocks must have the same shape (as in ``MPI_Alltoall``): they travel
    stacked in one array per message.

    >>> import numpy as np, ringlab
    >>> send = [[np.array([10.0 * r + c]) for c in range(3)] for r in range(3)]
    >>> res = ringlab.run(ring_alltoall, send)
    >>> [float(b[0]) for b in res.outputs[1]]
    [1.0, 11.0, 21.0]
    >>> [(e.step, e.src, e.dst, e.chunk) for e in res.trace.filter(src=0)]
    [(1, 0, 1, ((0, 1), (0, 2))), (2, 0, 1, ((2, 1),))]
    """
    n, rank = comm.world_size, comm.rank
    blocks = _check_blocks(comm, blocks, "ring_alltoall")
    shapes = {b.shape for b in blocks}
    if len(shapes) > 1:
        raise ValueError(f"rank {rank}: ring_alltoall needs blocks of one shape, "
                         f"got shapes {sorted(shapes)}")
    right, left = (rank + 1) % n, (rank - 1) % n
    out = [None] * n
    out[rank] = blocks[rank].copy()
    # What I pass on at step k: the blocks from rank (rank - k) that have not
    # arrived yet, ordered by how far they still have to go. At first my own
    # blocks for rank+1, rank+2, ..., rank+N-1.
    travelling = [blocks[(rank + d) % n] for d in range(1, n)]
    for k in range(n - 1):
        origin = (rank - k) % n
        label = tuple((origin, (rank + d) % n) for d in range(1, n - k))
        got = comm.sendrecv(np.stack(travelling), right, left, chunk=label, op="copy")
        # The first block that arrives from the left is for me: it came from
        # rank (rank - k - 1), k + 1 hops away. The rest are for ranks further
        # right, so they go on in the next step: no block passes its destination.
        out[(rank - k - 1) % n] = got[0]
        travelling = list(got[1:])
    return out
