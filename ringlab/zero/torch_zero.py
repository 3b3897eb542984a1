"""The cross-check: the same training with torch's ``ZeroRedundancyOptimizer``.

``train_zero(world_size, batches, sizes=..., seed=..., lr=...)`` runs on
``world_size`` CPU processes of the torch backend (gloo), builds in each the torch twin of
``ringlab.nn.mlp_model(sizes)`` (``torch_ddp.torch_twin``), wraps it in DDP
and trains it with ``torch.distributed.optim.ZeroRedundancyOptimizer`` around
``torch.optim.Adam``: torch's ZeRO-1, where each rank keeps Adam's state for
its part of the parameters and broadcasts its updated part after the step.
(torch partitions whole tensors among the ranks, not a flat buffer: a
different partition, the same arithmetic.) Returns rank 0's final parameters
as one flat float64 vector in ringlab's order and layout, to compare with
``ringlab.zero.zero1_adam``.

DDP averages by dividing the gradients' sum by the world size: use batches
divisible by ``world_size``. Run and bounded by ``timeout`` as
``torch_ddp.train_ddp`` is (its docstring says on which processes, and why).
"""

from ..data_parallel.torch_ddp import ddp_rank, run_gloo_workers


def zero_adam(params, lr):
    """``ZeroRedundancyOptimizer`` around Adam: each rank runs Adam on its
    partition of the parameters, then the partitions are broadcast."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=lr)


def train_zero(world_size, batches, *, sizes, seed, lr, timeout=120.0):
    """Train with DDP + ZeroRedundancyOptimizer(Adam) on ``world_size`` gloo
    processes; rank 0's final parameters. Raises ``TimeoutError`` (after
    stopping the processes) if they have not all finished within ``timeout`` s."""
    return run_gloo_workers(ddp_rank, world_size, (zero_adam, batches, sizes, seed, lr),
                            what="ZeroRedundancyOptimizer", timeout=timeout)
