"""The cross-check: the same training with ``torch.nn.parallel.DistributedDataParallel``.

``train_ddp(world_size, batches, sizes=..., seed=..., lr=...)`` spawns
``world_size`` fresh CPU processes (``torch.multiprocessing``, gloo), builds in each
the torch twin of ``ringlab.nn.mlp_model(sizes)`` with the same initial
numbers, wraps it in DDP and trains it with ``torch.optim.SGD`` on the rank's
shard of every batch. Returns rank 0's final parameters as one flat float64
vector in ringlab's order and layout, so it compares directly with
``ringlab.data_parallel.data_parallel_sgd``.

DDP averages the gradients by dividing their sum by the world size, which is
the mean over the batch only when every shard has the same size: use batches
divisible by ``world_size``. Needs torch; importing this module does not.

Why fresh processes ("spawn") and not "fork": forking a process that already
runs threads (torch's thread pools, the simulator's watchdog) copies locks that
those threads held, and a child can wait on one forever. It happened here: a
forked DDP run hung CI for an hour. ``timeout`` bounds every run anyway.
"""

import contextlib
import os
import tempfile
import time

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


@contextlib.contextmanager
def gloo_group(rank, world_size, init_file):
    """This process is ``rank`` of a gloo process group of ``world_size`` for the
    ``with`` block (rendezvous through ``init_file``), and leaves the group after
    it, also on an error. One torch thread each: the processes share the CPUs."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def sgd(params, lr):
    """The optimizer of ``train_ddp``: ``torch.optim.SGD``."""
    import torch

    return torch.optim.SGD(params, lr=lr)


def ddp_worker(rank, world_size, init_file, optimizer, batches, sizes, seed, lr, out_file):
    """One process of a DDP run: the torch twin wrapped in DDP, trained with
    ``optimizer(params, lr)`` on this rank's shard of every batch; rank 0 saves
    its final parameters to ``out_file``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    with gloo_group(rank, world_size, init_file):
        model = DDP(torch_twin(sizes, seed))
        opt = optimizer(model.parameters(), lr)
        for x, y in batches:
            xs = torch.from_numpy(np.array_split(x, world_size)[rank]).float()
            ys = torch.from_numpy(np.array_split(y, world_size)[rank]).float()
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xs), ys).backward()   # DDP all-reduces here
            opt.step()
        if rank == 0:
            np.save(out_file, flat_params(model.module))


def train_ddp(world_size, batches, *, sizes, seed, lr, start_method="spawn", timeout=120.0):
    """Train with DDP on ``world_size`` gloo processes; rank 0's final parameters.
    Raises ``TimeoutError`` (after stopping the processes) if they have not all
    finished within ``timeout`` seconds."""
    return run_gloo_workers(ddp_worker, world_size, (sgd, batches, sizes, seed, lr),
                            what="DDP", timeout=timeout, start_method=start_method)


def run_gloo_workers(worker, world_size, args, *, what, timeout, start_method="spawn"):
    """Start ``worker(rank, world_size, init_file, *args, out_file)`` on
    ``world_size`` processes and return the array rank 0 saved to ``out_file``.
    Joined with a deadline: a hung gloo collective stops the processes and
    raises ``TimeoutError`` naming ``what``, instead of hanging the caller."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "params.npy")
        procs = mp.start_processes(worker, nprocs=world_size, join=False,
                                   start_method=start_method,
                                   args=(world_size, init_file, *args, out_file))
        deadline = time.monotonic() + timeout
        while not procs.join(timeout=0.5):       # raises if a worker failed
            if time.monotonic() > deadline:
                for p in procs.processes:
                    p.kill()
                raise TimeoutError(f"{what} on {world_size} gloo processes did not finish "
                                   f"within {timeout} s")
        return np.load(out_file)
