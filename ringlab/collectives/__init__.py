"""Reference collectives, built from point-to-point ``send``/``recv`` only.

One module per collective; each function has the signature of the exercise
that asks for it, so ``ringlab.grade("ring_allreduce", ring_allreduce)`` passes.
"""

from .allreduce import ring_allreduce, tree_allreduce
from .allgather import naive_allgather, recursive_doubling_allgather, ring_allgather
from .reduce_scatter import ring_reduce_scatter
from .broadcast import binomial_broadcast, chain_broadcast, flat_broadcast, tree_broadcast
from .reduce import binomial_reduce
from .alltoall import alltoall, pairwise_alltoall, ring_alltoall
from .bidirectional import bidirectional_ring_allreduce

__all__ = ["ring_allreduce", "tree_allreduce",
           "bidirectional_ring_allreduce",
           "ring_allgather", "naive_allgather", "recursive_doubling_allgather",
           "ring_reduce_scatter",
           "flat_broadcast", "chain_broadcast", "tree_broadcast", "binomial_broadcast",
           "binomial_reduce",
           "alltoall", "pairwise_alltoall", "ring_alltoall"]
