"""Part 5, ZeRO-1/2/3 and FSDP: sharded optimizer states, gradients and parameters.

``reference``: plain data-parallel Adam, which every stage must equal.
``sharding``: a flat buffer cut into N equal shards (padding at the end).
``zero1``: optimizer states sharded (P_os). ``zero2``: gradients too (P_os+g),
reduce-scattered bucket by bucket during backward. ``zero3``: ZeRO-3 / FSDP,
parameters sharded too and gathered layer by layer. ``accounting``: the ZeRO
paper's memory and communication formulas. ``compare``: DP and the three
stages trained side by side, for their memory timelines (every program
records what it holds with ``comm.alloc``/``free``) and bytes sent per step."""

from .reference import data_parallel_adam, single_process_adam
from .zero1 import zero1_adam, zero1_step
from .zero2 import BucketShards, zero2_adam, zero2_step
from .zero3 import ShardedModel, Unit, zero3_adam, zero3_step

__all__ = ["data_parallel_adam", "single_process_adam", "zero1_adam", "zero1_step",
           "BucketShards", "zero2_adam", "zero2_step",
           "ShardedModel", "Unit", "zero3_step", "zero3_adam"]
