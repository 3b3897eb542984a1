"""Synchronous data-parallel SGD: same model everywhere, different data, one AllReduce.

Every rank holds a full replica of the model and a different shard of each
global batch. After backward, the ranks' gradients are averaged with the ring
AllReduce, so every rank applies the same update and the replicas never drift
apart. The result is *the same* SGD as on one process with the whole batch,
up to float64 rounding (the AllReduce adds in another order).

When the batch does not divide by the number of ranks the shards differ in
size, and a plain mean of the ranks' mean gradients would over-weight the
small shards. Weighting each rank's mean gradient by its share of the samples,
``n_r / B``, makes the sum exactly the mean over the whole batch.

    >>> import numpy as np, ringlab
    >>> data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2)
    >>> batches = [b for _, b in zip(range(3), data.batches(10))]
    >>> res = ringlab.run(data_parallel_sgd, [batches] * 4,
    ...                   kwargs=dict(sizes=[4, 8, 2], seed=0, lr=0.1))
    >>> ref = single_process_sgd(batches, sizes=[4, 8, 2], seed=0, lr=0.1)
    >>> all(np.array_equal(out[1], res.outputs[0][1]) for out in res.outputs)
    True
    >>> bool(np.allclose(res.outputs[0][1], ref[1], rtol=0, atol=1e-12))
    True
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allreduce
from ..nn import SGD, flatten, mlp_model, mse


def shard(x, rank, world_size):
    """Rank's contiguous slice of a global batch ``x`` (``np.array_split``: sizes
    differ by at most one). Not ``DistributedSampler``'s way: it pads or drops the
    dataset to a multiple of the world size and takes ``indices[rank::world_size]``.

    >>> shard(np.arange(5), 0, 2), shard(np.arange(5), 1, 2)
    (array([0, 1, 2]), array([3, 4]))
    """
    return np.array_split(x, world_size)[rank]


def local_gradient(model, x, y, loss_fn=mse):
    """Forward and backward on this rank's samples; the gradient is their mean.
    Returns the loss (the mean over these samples)."""
    model.zero_grad()                        # backward adds (+=): start from zero
    loss, dpred = loss_fn(model.forward(x), y)
    model.backward(dpred)
    return loss


@answer('sync_sgd_step')
def sync_sgd_step(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """One step of synchronous SGD on this rank's shard ``(x, y)`` of a global
    batch of ``batch_size`` samples. Returns the loss on the shard."""
    loss = local_gradient(model, x, y, loss_fn)
    grads = flatten(model.named_grads())     # one buffer: one AllReduce, not one per tensor
    # Weight my mean gradient by my share of the batch: the AllReduce's sum is
    # then the mean over all batch_size samples (= divide by P for equal shards).
    grads.data *= len(x) / batch_size
    ring_allreduce(comm, grads.data, out=grads.data)
    opt.step(grads.views)                    # the same update on every rank
    return loss


def data_parallel_sgd(comm, batches, *, sizes, seed, lr, step=sync_sgd_step, loss_fn=mse):
    """Train ``mlp_model(sizes)`` (built from ``seed``, so every replica starts
    equal) with ``step`` on this rank's shard of each global batch ``(x, y)``.

    Returns ``(losses, params)``: the loss on this rank's shard at each step and
    the final parameters as one flat vector (``named_parameters()`` order)."""
    model = mlp_model(sizes, np.random.default_rng(seed))
    opt = SGD(model.named_parameters(), lr)
    losses = []
    for x, y in batches:
        p, r = comm.world_size, comm.rank
        losses.append(step(comm, model, opt, shard(x, r, p), shard(y, r, p), len(x), loss_fn))
    return losses, flatten(model.named_parameters()).data


def single_process_sgd(batches, *, sizes, seed, lr, loss_fn=mse):
    """The reference: the same model and SGD on one process, whole batches.
    Returns ``(losses, params)`` like ``data_parallel_sgd``."""
    model = mlp_model(sizes, np.random.default_rng(seed))
    opt = SGD(model.named_parameters(), lr)
    losses = []
    for x, y in batches:
        losses.append(local_gradient(model, x, y, loss_fn))
        opt.step(model.named_grads())
    return losses, flatten(model.named_parameters()).data


def global_loss(losses_per_rank, batches):
    """The whole batch's loss at each step from the ranks' shard losses: their
    mean weighted by shard size (what one process would have printed)."""
    world_size = len(losses_per_rank)
    out = []
    for step, (x, _) in enumerate(batches):
        counts = [len(shard(x, r, world_size)) for r in range(world_size)]
        out.append(sum(c * losses[step] for c, losses in zip(counts, losses_per_rank)) / len(x))
    return out
