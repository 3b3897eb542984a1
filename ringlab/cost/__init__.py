"""What communication costs: closed forms of steps and bytes (``closed_forms``),
of seconds (``timing``), the alpha-beta model (``alpha_beta``), realistic link
parameters (``interconnects``) and NCCL's own cost model (``nccl``).

    >>> from ringlab import cost
    >>> cost.ring_allreduce(world_size=4, nbytes=4096).steps
    6
"""

from . import interconnects, nccl, timing
from .alpha_beta import AlphaBeta, TwoLevel
from .closed_forms import ALGORITHMS, Cost, binary_tree_steps, binomial_broadcast, binomial_reduce, binomial_reduce_steps, ceil_log2, chain_broadcast, flat_broadcast, max_popcount, naive_allgather, pairwise_alltoall, recursive_doubling_allgather, ring_allgather, ring_allreduce, ring_alltoall, ring_reduce_scatter, table, tree_allreduce, tree_broadcast, alltoall
from .timing import Terms, crossover, crossover_table, fastest, terms, time, two_level_time

__all__ = ["AlphaBeta", "TwoLevel", "Terms", "terms", "time", "crossover", "crossover_table",
           "fastest", "two_level_time", "timing", "interconnects", "nccl",
           "ALGORITHMS", "Cost", "table", "ceil_log2", "max_popcount",
           "binary_tree_steps", "binomial_reduce_steps", "ring_allgather", "naive_allgather",
           "recursive_doubling_allgather", "ring_reduce_scatter", "flat_broadcast",
           "chain_broadcast", "tree_broadcast", "binomial_broadcast", "binomial_reduce",
           "ring_allreduce", "tree_allreduce", "alltoall", "pairwise_alltoall", "ring_alltoall"]
