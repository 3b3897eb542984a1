"""What communication costs: closed forms (``closed_forms``) and the alpha-beta
model (``alpha_beta``).

    >>> from ringlab import cost
    >>> cost.ring_allreduce(world_size=4, nbytes=4096).steps
    6
"""

from .alpha_beta import AlphaBeta
from .closed_forms import (ALGORITHMS, Cost, binary_tree_steps, binomial_broadcast,
                           binomial_reduce, binomial_reduce_steps, ceil_log2, chain_broadcast,
                           flat_broadcast, max_popcount, naive_allgather, pairwise_alltoall,
                           recursive_doubling_allgather, ring_allgather, ring_allreduce,
                           ring_alltoall, ring_reduce_scatter, table, tree_allreduce,
                           tree_broadcast, alltoall)

__all__ = ["AlphaBeta", "ALGORITHMS", "Cost", "table", "ceil_log2", "max_popcount",
           "binary_tree_steps", "binomial_reduce_steps", "ring_allgather", "naive_allgather",
           "recursive_doubling_allgather", "ring_reduce_scatter", "flat_broadcast",
           "chain_broadcast", "tree_broadcast", "binomial_broadcast", "binomial_reduce",
           "ring_allreduce", "tree_allreduce", "alltoall", "pairwise_alltoall", "ring_alltoall"]
