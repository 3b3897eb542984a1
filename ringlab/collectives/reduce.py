"""Reduce: the root ends with the element-wise sum of every rank's vector.

``binomial_reduce`` is ``binomial_broadcast`` run backwards: the same tree,
with messages flowing from the leaves up to the root and each rank adding
what its children send before it passes its partial sum to its parent.

A note on the step model: in the one-port model a rank sends at most one and
receives at most one message per step, so a parent takes in its children's
partial sums one per step. The root has ceil(log2 N) children, so the reduce
takes ceil(log2 N) steps, as many as the broadcast, for every N (N = 3: both
non-roots send at once, and the root takes one vector in step 1, the other in
step 2; see ``ringlab.cost.binomial_reduce_steps``).
"""

import numpy as np

from ..comm import collective
from .broadcast import check_root


@collective
def binomial_reduce(comm, x, root=0):
    """Sum ``x`` over all ranks onto ``root`` with a binomial tree; the root
    returns the sum, every other rank ``None`` (as with ``MPI_Reduce``).

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(binomial_reduce, [np.full(2, float(r)) for r in range(4)])
    >>> res.outputs
    [array([6., 6.]), None, None, None]
    >>> [(e.step, e.src, e.dst) for e in res.trace]
    [(1, 2, 0), (1, 3, 1), (2, 1, 0)]
    """
    n, rank = comm.world_size, comm.rank
    root = check_root(comm, root, "binomial_reduce")
    i = (rank - root) % n                   # position counted from the root
    partial = np.array(x, copy=True)        # never modify the caller's array
    # The broadcast's rounds in reverse: dist = the largest power of two < N down to 1.
    dist = 1
    while dist * 2 < n:
        dist *= 2
    while dist >= 1:
        if dist <= i < 2 * dist:
            # My subtree is summed: hand it to my parent; I am done.
            comm.send(partial, (i - dist + root) % n, chunk=0, op="reduce")
            return None
        if i < dist and i + dist < n:
            partial += comm.recv((i + dist + root) % n)
        dist //= 2
    return partial                           # only the root gets here
