"""Part 5, ZeRO-1/2/3 and FSDP: sharded optimizer states, gradients and parameters.

``reference``: plain data-parallel Adam, which every stage must equal."""

from .reference import data_parallel_adam, single_process_adam

__all__ = ["data_parallel_adam", "single_process_adam"]
