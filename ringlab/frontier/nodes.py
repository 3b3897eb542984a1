"""Ranks on nodes: node k holds ranks ``k*g .. (k+1)*g - 1``, g GPUs per node.

Inside a node GPUs talk over NVLink (hundreds of GB/s per direction); between
nodes over InfiniBand or Ethernet, several times slower (Part 6's
``interconnects``). The layouts of Part 7 are judged by the bytes that
*leave* a node, which a trace gives directly.

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> trace = ringlab.run(ring_allreduce, [np.ones(4)] * 4).trace
    >>> node_of(3, ranks_per_node=2), cross_node_bytes(trace, ranks_per_node=2)
    (1, 96)

(a ring of 4 ranks on 2 nodes crosses between them on 2 of its 4 links; each
link carries 2 * 3 chunks of 8 bytes: 2 * 48.)
"""


def node_of(rank, ranks_per_node):
    """The node of a global rank."""
    return rank // ranks_per_node


def cross_node_bytes(trace, ranks_per_node, span=None):
    """Bytes of the messages (in ``span``, if given) whose sender and receiver
    sit on different nodes."""
    events = trace if span is None else trace.filter(span=span)
    return sum(e.nbytes for e in events
               if node_of(e.src, ranks_per_node) != node_of(e.dst, ranks_per_node))
