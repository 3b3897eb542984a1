"""Broadcast: one rank (the root) has a vector; afterwards every rank has it.

Every broadcast here has the signature ``program(comm, x, root)``: ``x`` is the
data on the root and ``None`` on every other rank, and every rank returns the
data. They differ in who sends to whom, which the step model makes visible:
a rank sends one message per step (one port), and a message can be forwarded
only in a later step than the one that brought it.

=====================  =========================  ======================
algorithm              steps (N ranks)            root sends
=====================  =========================  ======================
``flat_broadcast``     N - 1                      N - 1 whole vectors
``chain_broadcast``    N - 2 + S (S segments)     1 whole vector
``tree_broadcast``     about 2 log2(N)            2 whole vectors
``binomial_broadcast`` ceil(log2 N)               ceil(log2 N) vectors
=====================  =========================  ======================

A binary tree does *not* broadcast in ceil(log2 N) steps, as is often said:
that would need each node to send to both children at once. With one port a
node needs two steps for its two children, so the node that receives last is
the one whose path from the root turns right most often: node i (counted from
the root) receives at step depth(i) + (right turns) (see ``ringlab.cost``).
The binomial tree gets the minimum, ceil(log2 N), because every rank that has
the data keeps sending in every step: the number of ranks with the data
doubles each step.

Messages carry the whole vector as ``chunk=0``, or segment s as ``chunk=s``.
"""

import numpy as np

from ..answers import answer
from ..comm import collective


def check_root(comm, root, name):
    """A clear error if ``root`` is not a rank of this world."""
    n = comm.world_size
    if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)) or not 0 <= root < n:
        raise ValueError(f"rank {comm.rank}: {name}(root={root!r}): root must be a rank in 0..{n - 1} "
                         f"(world_size={n})")
    return int(root)


def _start(comm, x, root, name):
    """Checks the arguments; returns (position relative to the root, data or None)."""
    root = check_root(comm, root, name)
    if comm.rank == root:
        if x is None:
            raise ValueError(f"rank {comm.rank}: {name}: the root (rank {root}) has no data (x is None)")
        return 0, np.array(x, copy=True)      # never hand back the caller's own array
    return (comm.rank - root) % comm.world_size, None


@answer('tree_broadcast', 'binomial_broadcast')
@collective
def flat_broadcast(comm, x, root=0):
    """The root sends the whole vector to every other rank, one rank per step.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(flat_broadcast, [np.arange(2.0), None, None, None])
    >>> res.outputs[3], res.trace.steps
    (array([0., 1.]), 3)
    """
    n = comm.world_size
    i, x = _start(comm, x, root, "flat_broadcast")
    if i != 0:
        return comm.recv(root)
    for k in range(1, n):
        comm.send(x, (root + k) % n, chunk=0, op="copy")
    return x


@answer('tree_broadcast', 'binomial_broadcast')
@collective
def chain_broadcast(comm, x, root=0, segments=1):
    """Pass the vector along the chain root, root+1, ..., root-1 in ``segments``
    pieces: while rank root+1 forwards piece 0, the root already sends piece 1.

    With S segments the last rank has everything after N - 2 + S steps, and
    every link carries the vector once: for long vectors and many segments
    that is nearly as fast as sending it over a single link.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(chain_broadcast, [np.arange(6.0), None, None, None],
    ...                   kwargs={"segments": 3})
    >>> res.outputs[3], res.trace.steps    # 4 - 2 + 3
    (array([0., 1., 2., 3., 4., 5.]), 5)
    """
    n, rank = comm.world_size, comm.rank
    if (isinstance(segments, bool) or not isinstance(segments, (int, np.integer))
            or segments < 1):
        raise ValueError(f"rank {rank}: chain_broadcast(segments={segments!r}): "
                         "segments must be an int >= 1")
    i, x = _start(comm, x, root, "chain_broadcast")
    prev, nxt = (rank - 1) % n, (rank + 1) % n
    last = i == n - 1                      # the end of the chain forwards nothing
    pieces = np.array_split(x, segments) if i == 0 else []
    for s in range(segments):
        if i != 0:
            pieces.append(comm.recv(prev))
        if not last:
            # Forward piece s right away: the next rank can pass it on while we
            # wait for piece s + 1. That overlap is the whole point of segments.
            comm.send(pieces[s], nxt, chunk=s, op="copy")
    return x if i == 0 else np.concatenate(pieces)


@answer('tree_broadcast', 'binomial_broadcast')
@collective
def tree_broadcast(comm, x, root=0):
    """Broadcast down a binary tree laid out like a heap, relative to the root:
    the rank at position i = (rank - root) mod N has children 2i+1 and 2i+2.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(tree_broadcast, [None, None, np.ones(2), None, None],
    ...                   args=(2,))
    >>> [(e.step, e.src, e.dst) for e in res.trace]
    [(1, 2, 3), (2, 2, 4), (2, 3, 0), (3, 3, 1)]
    """
    n = comm.world_size
    i, x = _start(comm, x, root, "tree_broadcast")
    if i != 0:
        parent = ((i - 1) // 2 + root) % n       # heap position -> rank
        x = comm.recv(parent)
    # One port: the left child gets it one step before the right child.
    for child in (2 * i + 1, 2 * i + 2):
        if child < n:
            comm.send(x, (child + root) % n, chunk=0, op="copy")
    return x


@answer('binomial_broadcast', 'tree_broadcast')
@collective
def binomial_broadcast(comm, x, root=0):
    """Broadcast in ceil(log2 N) steps: in step k+1 every rank that has the data
    (positions i < 2^k, counted from the root) sends it to position i + 2^k.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(binomial_broadcast, [np.ones(2)] + [None] * 7)
    >>> [(e.step, e.src, e.dst) for e in res.trace]
    [(1, 0, 1), (2, 0, 2), (2, 1, 3), (3, 0, 4), (3, 1, 5), (3, 2, 6), (3, 3, 7)]

    The tree this draws is a binomial tree: the parent of position i is i with
    its highest set bit cleared.
    """
    n = comm.world_size
    i, x = _start(comm, x, root, "binomial_broadcast")
    dist = 1
    while dist < n:
        # Positions below `dist` have the data; each sends to the one `dist` above.
        if i < dist and i + dist < n:
            comm.send(x, (i + dist + root) % n, chunk=0, op="copy")
        elif dist <= i < 2 * dist:
            x = comm.recv((i - dist + root) % n)
        dist *= 2
    return x
