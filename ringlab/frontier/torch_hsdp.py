"""The cross-check: the same training with PyTorch's FSDP2 ``fully_shard`` on a 2-D mesh.

``train_fsdp2(shape, batches, sizes=..., seed=..., lr=...)`` runs on R*S CPU
processes of the torch backend (gloo, as ``torch_ddp.train_ddp``), lays them out
with ``init_device_mesh("cpu", (R, S), mesh_dim_names=("replicate", "shard"))``,
builds in each the float64 torch twin of ``ringlab.nn.mlp_model(sizes)``, applies
``fully_shard(layer, mesh=mesh)`` to every Linear and then to the whole model
(FSDP2's HSDP: parameters sharded over "shard", replicated over "replicate",
gradients reduce-scattered in the one and all-reduced in the other), and trains it
with ``torch.optim.Adam`` on the rank's shard of every batch. Returns rank 0's final
parameters (gathered with ``full_tensor()``) as ringlab's flat float64 vector, to
compare with ``hsdp.hsdp_adam``.

FSDP2 shards each parameter along its first dimension (``Shard(0)``), not a
flat buffer: another partition, the same elementwise Adam. It averages the
gradients over all R*S ranks, the global mean when every rank has as many
samples: use batches divisible by R*S. Works on torch 2.13's CPU build (gloo
has the ReduceScatter FSDP2 needs); needs torch, importing this module does not.

    >>> twin = torch_twin64([4, 8, 2], seed=0)          # (needs torch)
    >>> twin[0].weight.shape, twin[0].weight.dtype      # torch's (out, in)
    (torch.Size([8, 4]), torch.float64)
"""

import numpy as np

from ..data_parallel.torch_ddp import run_gloo_workers, torch_twin


def torch_twin64(sizes, seed):
    """``torch_ddp.torch_twin`` in float64 (weights transposed to torch's (out, in))."""
    return torch_twin(sizes, seed, dtype="float64")


def _rank(comm, _, shape, batches, sizes, seed, lr):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world_size = comm.rank, comm.world_size
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    model = torch_twin64(sizes, seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in batches:
        xs = torch.from_numpy(np.array_split(x, world_size)[rank])
        ys = torch.from_numpy(np.array_split(y, world_size)[rank])
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()
    full = []                                   # every rank takes part in full_tensor()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            full += [layer.weight.full_tensor().detach().numpy().T.ravel(),
                     layer.bias.full_tensor().detach().numpy()]
    return np.concatenate(full)


def train_fsdp2(shape, batches, *, sizes, seed, lr, timeout=120.0):
    """FSDP2 HSDP on R*S gloo processes; rank 0's final parameters, flat.
    Raises ``TimeoutError`` if the processes have not finished within ``timeout`` s."""
    R, S = shape
    return run_gloo_workers(_rank, R * S, (tuple(shape), batches, sizes, seed, lr),
                            what="FSDP2 fully_shard (HSDP)", timeout=timeout)
