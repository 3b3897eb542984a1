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
"""

import numpy as np

from ..data_parallel.sync_sgd import local_gradient, shard, sync_sgd_step
from ..nn import Adam, flatten, mlp_model, mse


def data_parallel_adam(comm, batches, *, sizes, seed, lr, loss_fn=mse, **adam):
    """Data parallelism with Adam: ``mlp_model(sizes)`` from ``seed`` on every
    rank, this rank's shard of each global batch, one AllReduce of the flat
    gradients per step, then Adam (``adam``: betas, eps, weight_decay) on the
    full model everywhere. Returns ``(losses, params)``, params one flat vector."""
    model = mlp_model(sizes, np.random.default_rng(seed))
    opt = Adam(model.named_parameters(), lr, **adam)
    losses = []
    for x, y in batches:
        p, r = comm.world_size, comm.rank
        # sync_sgd_step only averages gradients and calls opt.step: any optimizer works
        losses.append(sync_sgd_step(comm, model, opt, shard(x, r, p), shard(y, r, p),
                                    len(x), loss_fn))
    return losses, flatten(model.named_parameters()).data


def single_process_adam(batches, *, sizes, seed, lr, loss_fn=mse, **adam):
    """The same model and Adam on one process with whole batches: ``(losses, params)``."""
    model = mlp_model(sizes, np.random.default_rng(seed))
    opt = Adam(model.named_parameters(), lr, **adam)
    losses = []
    for x, y in batches:
        losses.append(local_gradient(model, x, y, loss_fn))
        opt.step(model.named_grads())
    return losses, flatten(model.named_parameters()).data
