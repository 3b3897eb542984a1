"""Graders of Part 3, tensor parallelism: one layer split over the ranks of a group.

Four exercises, one module each: ``column_parallel_linear``,
``row_parallel_linear``, ``megatron_mlp`` and ``tp_attention``. What they share
(the cases, the driver that runs forward then backward on every rank, the value
checks and the reading of every message) is in ``_common.py``; each module holds
its layer's math, the usual mistakes as formulas, and its words.
"""
