"""The cross-check: the same training with ``torch.nn.parallel.DistributedDataParallel``.

``train_ddp(world_size, batches, sizes=..., seed=..., lr=...)`` runs ``world_size``
CPU processes of ringlab's torch backend (``ringlab.run(..., backend="torch")``,
gloo), builds in each the torch twin of ``ringlab.nn.mlp_model(sizes)`` with the
same initial numbers, wraps it in DDP and trains it with ``torch.optim.SGD`` on the
rank's shard of every batch. Returns rank 0's final parameters as one flat float64
vector in ringlab's order and layout, so it compares directly with
``ringlab.data_parallel.data_parallel_sgd``.

DDP averages the gradients by dividing their sum by the world size, which is
the mean over the batch only when every shard has the same size: use batches
divisible by ``world_size``. Needs torch; importing this module does not.

Why the torch backend's processes: each is forked from one that imported torch
once and serves run after run, so a cross-check costs no torch import per process
(about 1.5 s of CPU each, and as much again for what DDP imports); each run has a
process group of its own, the default one, so the program is a plain
``torch.distributed`` program, as under ``torchrun``. Not ``fork`` of the caller:
forking a process that already runs threads (torch's thread pools, the simulator's
watchdog) copies locks that those threads held, and a child can wait on one forever
(a forked DDP run once hung CI for an hour).
"""

import numpy as np

from ..nn import mlp_model


def torch_twin(sizes, seed, dtype="float32"):
    """``mlp_model(sizes, default_rng(seed))`` as a ``torch.nn.Sequential`` of
    ``dtype`` (float32, as DDP trains; "float64" to compare exactly): Linear,
    GELU(tanh), ..., Linear. torch stores a Linear's weight as (out, in): the
    transpose of ringlab's (in, out)."""
    import torch

    ours = mlp_model(sizes, np.random.default_rng(seed))
    layers = []
    for i, layer in enumerate(ours.layers):
        if "weight" in layer.params:
            lin = torch.nn.Linear(layer.in_features, layer.out_features,
                                  dtype=getattr(torch, dtype))
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(layer.params["weight"].T.copy()))
                lin.bias.copy_(torch.from_numpy(layer.params["bias"]))
            layers.append(lin)
        else:
            layers.append(torch.nn.GELU(approximate="tanh"))
    return torch.nn.Sequential(*layers)


def flat_params(model):
    """A torch twin's parameters as ringlab's flat vector (weights transposed back)."""
    out = []
    for layer in model:
        if hasattr(layer, "weight"):
            out += [layer.weight.detach().double().numpy().T.ravel(),
                    layer.bias.detach().double().numpy()]
    return np.concatenate(out)


def sgd(params, lr):
    """The optimizer of ``train_ddp``: ``torch.optim.SGD``."""
    import torch

    return torch.optim.SGD(params, lr=lr)


def ddp_rank(comm, _, optimizer, batches, sizes, seed, lr):
    """One rank of a DDP run: the torch twin wrapped in DDP (on the run's default
    process group), trained with ``optimizer(params, lr)`` on this rank's shard of
    every batch; returns its final parameters."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world_size = comm.rank, comm.world_size
    model = DDP(torch_twin(sizes, seed))
    opt = optimizer(model.parameters(), lr)
    for x, y in batches:
        xs = torch.from_numpy(np.array_split(x, world_size)[rank]).float()
        ys = torch.from_numpy(np.array_split(y, world_size)[rank]).float()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()   # DDP all-reduces here
        opt.step()
    return flat_params(model.module)


def train_ddp(world_size, batches, *, sizes, seed, lr, timeout=120.0):
    """Train with DDP on ``world_size`` gloo processes; rank 0's final parameters.
    Raises ``TimeoutError`` (after stopping the processes) if they have not all
    finished within ``timeout`` seconds."""
    return run_gloo_workers(ddp_rank, world_size, (sgd, batches, sizes, seed, lr),
                            what="DDP", timeout=timeout)


def run_gloo_workers(program, world_size, args, *, what, timeout):
    """``program(comm, None, *args)`` on ``world_size`` processes of the torch backend
    (gloo); rank 0's result. A hung collective stops the processes and raises
    ``TimeoutError`` naming ``what``, instead of hanging the caller."""
    from ..errors import ProgramTimeout
    from ..runner import run

    try:
        return run(program, [None] * world_size, args=args, timeout=timeout,
                   backend="torch").outputs[0]
    except ProgramTimeout as e:
        raise TimeoutError(f"{what} on {world_size} gloo processes did not finish "
                           f"within {timeout} s") from e
