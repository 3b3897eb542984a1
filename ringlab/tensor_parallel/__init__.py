"""Part 3, tensor parallelism: one layer split over the ranks of a group (Megatron-LM).

* ``operators``: Megatron's conjugate ``f`` (identity forward, AllReduce
  backward) and ``g`` (AllReduce forward, identity backward).
* ``layers``: ``ColumnParallelLinear`` (W split by output columns) and
  ``RowParallelLinear`` (W split by input rows), built from a ``ringlab.nn.Linear``.
* ``mlp``: ``ParallelMLP``, column-parallel fc, local GeLU, row-parallel proj.
* ``attention``: ``ParallelAttention``, heads split, row-parallel output projection.
* ``block``: ``ParallelTransformerBlock``, a whole pre-LN block: 2 AllReduces
  forward, 2 backward (``tp_bytes_per_layer``).
* ``sequence``: sequence parallelism (Korthikanti et al. 2022): the paper's
  ``sequence.g`` (AllGather forward, ReduceScatter backward; not Megatron's
  ``g`` above) and ``g_bar`` (the reverse),
  and the linears that use them; ``block(..., sequence_parallel=True)``.
* ``dropout``: ``ShardedDropout``, a shard of the unsharded layer's dropout mask.
* ``hybrid``: ``tp_dp_sgd_step``, one SGD step with TP inside DP on a 2-D mesh.
* ``memory``: the activation bytes a block holds for backward, and the
  paper's formulas for them.
* ``ownership``: who holds what, read off a rank's shards, for the chapters'
  pictures (``ringlab.show.ownership``).

Every layer runs inside a ringlab program on ``comm``, the tensor-parallel
group (the world, or ``DeviceMesh(...).group("tp")``), and matches the
unsharded ``ringlab.nn`` layer it was built from up to float rounding.
"""

from .operators import CopyToTensorParallelRegion, ReduceFromTensorParallelRegion, f, g
from .layers import ColumnParallelLinear, RowParallelLinear
from .mlp import ParallelMLP
from .attention import ParallelAttention
from .sequence import GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion, SequenceParallelColumnLinear, SequenceParallelRowLinear, g_bar
from .dropout import ShardedDropout
from .block import ParallelTransformerBlock, tp_bytes_per_layer
from .hybrid import tp_dp_sgd_step
from .activation_memory import activation_bytes, layernorm_stats_bytes, paper_activation_bytes

__all__ = ["CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "f", "g",
           "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelAttention",
           "GatherFromSequenceParallelRegion", "ReduceScatterToSequenceParallelRegion", "g_bar",
           "SequenceParallelColumnLinear", "SequenceParallelRowLinear", "ShardedDropout",
           "ParallelTransformerBlock", "tp_bytes_per_layer",
           "activation_bytes", "paper_activation_bytes", "layernorm_stats_bytes",
           "tp_dp_sgd_step"]
