"""The cross-check: the same training with torch's ``ZeroRedundancyOptimizer``.

``train_zero(world_size, batches, sizes=..., seed=..., lr=...)`` spawns
``world_size`` fresh CPU processes (gloo), builds in each the torch twin of
``ringlab.nn.mlp_model(sizes)`` (``torch_ddp.torch_twin``), wraps it in DDP
and trains it with ``torch.distributed.optim.ZeroRedundancyOptimizer`` around
``torch.optim.Adam``: torch's ZeRO-1, where each rank keeps Adam's state for
its part of the parameters and broadcasts its updated part after the step.
(torch partitions whole tensors among the ranks, not a flat buffer: a
different partition, the same arithmetic.) Returns rank 0's final parameters
as one flat float64 vector in ringlab's order and layout, to compare with
``ringlab.zero.zero1_adam``.

DDP averages by dividing the gradients' sum by the world size: use batches
divisible by ``world_size``. Started with "spawn" and bounded by ``timeout``,
as ``torch_ddp.train_ddp`` is (its docstring says why not "fork").
"""

import numpy as np

from ..data_parallel.torch_ddp import flat_params, run_gloo_workers, torch_twin


def _worker(rank, world_size, init_file, batches, sizes, seed, lr, out_file):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        model = DDP(torch_twin(sizes, seed))
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=lr)
        for x, y in batches:
            xs = torch.from_numpy(np.array_split(x, world_size)[rank]).float()
            ys = torch.from_numpy(np.array_split(y, world_size)[rank]).float()
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xs), ys).backward()   # DDP all-reduces here
            opt.step()              # Adam on my partition, then the partitions are broadcast
        if rank == 0:
            np.save(out_file, flat_params(model.module))
    finally:
        dist.destroy_process_group()


def train_zero(world_size, batches, *, sizes, seed, lr, timeout=120.0):
    """Train with DDP + ZeroRedundancyOptimizer(Adam) on ``world_size`` gloo
    processes; rank 0's final parameters. Raises ``TimeoutError`` (after
    stopping the processes) if they have not all finished within ``timeout`` s."""
    return run_gloo_workers(_worker, world_size, (batches, sizes, seed, lr),
                            what="ZeroRedundancyOptimizer", timeout=timeout)
