"""The references every ZeRO stage must equal: plain data-parallel Adam.

ZeRO changes *who stores what*, not the arithmetic: after k steps each stage's
parameters equal those of data parallelism (every rank a full replica, one
AllReduce of the gradients, Adam on the whole model), which equal one process
training on whole batches, up to the summation order of the reductions.

    >>> import numpy as np, ringlab
    >>> data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2)
    >>> batches = [b for _, b in zip(range(3), data.batches(8))]
    >>> kw = dict(sizes=[4, 8, 2], seed=0, lr=0.01)
    >>> res = ringlab.run(data_parallel_adam, [batches] * 4, kwargs=kw)
    >>> ref = single_process_adam(batches, **kw)
    >>> bool(np.allclose(res.outputs[0][1], ref[1], rtol=0, atol=1e-12))
    True
    >>> res.trace.memory_by_label(0)          # 58 float64 numbers: 464 bytes each
    {'params': 464, 'grads': 464, 'adam.m': 464, 'adam.v': 464}

``data_parallel_adam`` is the memory baseline of the ZeRO stages: every rank
holds, for the whole run (``comm.alloc`` at its start), "params", "grads",
"adam.m" and "adam.v" for the whole model, and "master", a separate copy of
the parameters, only with mixed precision (``dtype=np.float16,
master_dtype=np.float32``): the paper's (2 + 2 + 12) Ψ. In plain float64 Adam
updates the parameters themselves: they are their own master. Nothing is
allocated during a step (the AllReduce runs in the gradients' buffer;
activations are not recorded).
"""

import numpy as np

from ..collectives import ring_allreduce
from ..data_parallel.buckets import loss_and_backward
from ..data_parallel.sync_sgd import local_gradient, shard, sync_sgd_step
from ..nn import Adam, flatten, mlp_model, mse
from .sharding import load_flat


def data_parallel_adam(comm, batches, *, sizes, seed, lr, loss_fn=mse, dtype=np.float64,
                       master_dtype=None, flops_per_second=None, **adam):
    """Data parallelism with Adam: ``mlp_model(sizes)`` from ``seed`` on every
    rank, this rank's shard of each global batch, one AllReduce of the flat
    gradients per step, then Adam (``adam``: betas, eps, weight_decay) on the
    full model everywhere. ``dtype``, ``master_dtype`` as in ``zero1_adam``;
    ``flops_per_second``: time forward and backward. Returns ``(losses,
    params)``, params one flat vector."""
    model = mlp_model(sizes, np.random.default_rng(seed), dtype=dtype)
    mixed = master_dtype is not None and np.dtype(master_dtype) != np.dtype(dtype)
    # Mixed precision: Adam updates a float32 copy of the whole model, its master.
    master = flatten(model.named_parameters()).data.astype(master_dtype) if mixed else None
    opt = Adam({"param": master} if mixed else model.named_parameters(), lr, **adam)
    replica = sum(a.nbytes for a in model.named_parameters().values())
    comm.alloc("params", replica)
    comm.alloc("grads", replica)
    for label in ("master", "adam.m", "adam.v") if mixed else ("adam.m", "adam.v"):
        comm.alloc(label, master if mixed else replica)
    losses = []
    for x, y in batches:
        p, r = comm.world_size, comm.rank
        xs, ys = shard(x, r, p).astype(dtype), shard(y, r, p).astype(dtype)
        if not mixed and flops_per_second is None:
            # sync_sgd_step only averages gradients and calls opt.step: any optimizer works
            losses.append(sync_sgd_step(comm, model, opt, xs, ys, len(x), loss_fn))
        else:
            losses.append(_dp_step(comm, model, opt, master, xs, ys, len(x), loss_fn,
                                   flops_per_second))
    return losses, flatten(model.named_parameters()).data


def _dp_step(comm, model, opt, master, x, y, batch_size, loss_fn, flops_per_second):
    """``sync_sgd_step`` with timed compute and, if ``master`` is not None, Adam on
    that higher-precision copy, loaded back into the model after the step."""
    loss, backward = loss_and_backward(comm, model, x, y, flops_per_second, loss_fn)
    for _ in backward:
        pass
    grads = flatten(model.named_grads())
    grads.data *= len(x) / batch_size
    ring_allreduce(comm, grads.data, out=grads.data)
    if master is None:
        opt.step(grads.views)
    else:
        opt.step(grads.data.astype(master.dtype))
        load_flat(model.named_parameters(), master)
    return loss


def single_process_adam(batches, *, sizes, seed, lr, loss_fn=mse, **adam):
    """The same model and Adam on one process with whole batches: ``(losses, params)``."""
    model = mlp_model(sizes, np.random.default_rng(seed))
    opt = Adam(model.named_parameters(), lr, **adam)
    losses = []
    for x, y in batches:
        losses.append(local_gradient(model, x, y, loss_fn))
        opt.step(model.named_grads())
    return losses, flatten(model.named_parameters()).data
