"""Hierarchical (two-level) AllReduce: inside each node, then across nodes.

A cluster has fast links inside a node (NVLink, NVSwitch) and slower ones
between nodes (InfiniBand, Ethernet). Lay the ranks out as a ``DeviceMesh``
of ``nodes x gpus`` (row-major: a node's GPUs are consecutive ranks) and:

1. ReduceScatter inside each node (ring over its G GPUs): GPU g ends with
   chunk g of the node's sum, 1/G of the vector.
2. AllReduce across nodes, among the GPUs with the same index g (ring over
   the M nodes): each carries only its 1/G chunk over the slow links.
3. AllGather inside each node: every GPU gets the whole sum.

Only step 2 crosses nodes, and each GPU sends 2(M-1)/M of n/G bytes there,
where a flat ring over all M*G ranks pushes 2(MG-1)/(MG) of n through every
link it uses, the node-crossing ones included. With one ``AlphaBeta`` for
every link, the bandwidth terms are equal (2(G-1)/G + 2(M-1)/(MG) =
2(MG-1)/(MG)) and the hierarchy saves latency: 2(G-1) + 2(M-1) steps instead
of 2(MG-1). See ``ringlab.cost.timing`` for the two-level network.
"""

from ..answers import answer
from ..comm import collective
from ..mesh import DeviceMesh
from ..collectives.allgather import ring_allgather
from ..collectives.allreduce import ring_allreduce
from ..collectives.reduce_scatter import ring_reduce_scatter


@answer('hierarchical_allreduce')
@collective
def hierarchical_allreduce(comm, x, mesh=None):
    """Sum ``x`` over all ranks in three phases; ``mesh`` is a ``DeviceMesh``
    whose first axis counts nodes and whose second counts GPUs in a node, or
    just its shape ``(nodes, gpus)`` (axes then named "node" and "gpu").
    Without one: two nodes if the world size is even, else one.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(hierarchical_allreduce, [np.arange(4.0) + r for r in range(6)],
    ...                   args=((2, 3),))
    >>> res.outputs[4]
    array([15., 21., 27., 33.])
    >>> sorted({e.group for e in res.trace})
    ['gpu[0]', 'gpu[1]', 'node[0]', 'node[1]', 'node[2]']

    (A group ``gpu[k]`` is node k's GPUs, a row of the mesh; ``node[g]`` links
    the GPUs with index g across the nodes, a column.)
    """
    if mesh is None:
        nodes = 2 if comm.world_size % 2 == 0 else 1
        mesh = (nodes, comm.world_size // nodes)
    if not isinstance(mesh, DeviceMesh):
        mesh = DeviceMesh(comm, mesh, ("node", "gpu"))
    if len(mesh.shape) != 2:
        raise ValueError(f"rank {comm.rank}: hierarchical_allreduce needs a 2-axis mesh "
                         f"(nodes, gpus), got shape {mesh.shape}")
    across, inside = (mesh.group(name) for name in mesh.names)
    part = ring_reduce_scatter(inside, x)      # 1/G of the node's sum
    part = ring_allreduce(across, part)        # ... summed over the nodes
    return ring_allgather(inside, part)        # the chunks back together
