"""Part 5, ZeRO-1/2/3 and FSDP: sharded optimizer states, gradients and parameters.

``reference``: plain data-parallel Adam, which every stage must equal.
``zero3``: ZeRO-3 / FSDP, parameters sharded too and gathered layer by layer."""

from .reference import data_parallel_adam, single_process_adam
from .zero3 import ShardedModel, Unit, zero3_adam, zero3_step

__all__ = ["data_parallel_adam", "single_process_adam",
           "ShardedModel", "Unit", "zero3_step", "zero3_adam"]
