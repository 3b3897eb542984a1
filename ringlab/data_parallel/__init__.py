"""Part 2, data parallelism: one concept per module.

* ``sync_sgd``: synchronous SGD. Every rank holds the whole model and a shard
  of each batch; one ring AllReduce averages the gradients (weighted by shard
  size) and every rank applies the same update (``sync_sgd_step``,
  ``data_parallel_sgd``, ``single_process_sgd``).
* ``buckets``: gradient sync inside the training step. One AllReduce per
  parameter, one flat AllReduce after backward, and DDP's buckets overlapped
  with backward (``assign_buckets``, ``timed_backward``, ``sync_per_parameter``,
  ``sync_flat``, ``ddp_sync``, ``accumulate``).
* ``async_ps`` (with ``ps_task``): asynchronous SGD with a parameter server
  and bounded staleness (SSP).
* ``torch_ddp``: the cross-check, the same training under PyTorch's
  ``DistributedDataParallel`` on gloo processes (``train_ddp``; needs torch).
"""

from . import buckets, sync_sgd
from .buckets import BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES, assign_buckets, ddp_sync, sync_flat, sync_per_parameter, timed_backward
from .sync_sgd import data_parallel_sgd, single_process_sgd, sync_sgd_step

__all__ = ["sync_sgd", "buckets", "sync_sgd_step", "data_parallel_sgd", "single_process_sgd",
           "assign_buckets", "timed_backward", "sync_per_parameter", "sync_flat", "ddp_sync",
           "BUCKET_CAP_BYTES", "FIRST_BUCKET_BYTES"]
