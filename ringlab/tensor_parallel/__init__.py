"""Part 3, tensor parallelism: one layer split over the ranks of a group (Megatron-LM).

* ``operators``: Megatron's conjugate ``f`` (identity forward, AllReduce
  backward) and ``g`` (AllReduce forward, identity backward).
* ``layers``: ``ColumnParallelLinear`` (W split by output columns) and
  ``RowParallelLinear`` (W split by input rows), built from a ``ringlab.nn.Linear``.
* ``mlp``: ``ParallelMLP``, column-parallel fc, local GeLU, row-parallel proj.
* ``attention``: ``ParallelAttention``, heads split, row-parallel output projection.

Every layer runs inside a ringlab program on ``comm``, the tensor-parallel
group (the world, or ``DeviceMesh(...).group("tp")``), and matches the
unsharded ``ringlab.nn`` layer it was built from up to float rounding.
"""

from .operators import CopyToTensorParallelRegion, ReduceFromTensorParallelRegion, f, g
from .layers import ColumnParallelLinear, RowParallelLinear
from .mlp import ParallelMLP
from .attention import ParallelAttention

__all__ = ["CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "f", "g",
           "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelAttention"]
