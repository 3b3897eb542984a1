"""ZeRO-2 (the paper's P_os+g): gradients sharded too, reduced while backward runs.

ZeRO-1 still builds the whole flat gradient on every rank before its
ReduceScatter. ZeRO-2 never holds it: gradients go into DDP's buckets (reverse
layer order, the order backward makes them), and as soon as a bucket is full
its **ReduceScatter** starts on the communication stream (``comm.start``)
while backward goes on with the earlier layers. A rank keeps only its piece of
each reduced bucket; the full bucket is dropped once its ReduceScatter is done.
Then Adam on the rank's shard and an **AllGather** per bucket, as in ZeRO-1.

How a bucket maps onto shards -- the scheme used here: *every bucket is
padded to a multiple of N and cut into N equal pieces; rank r owns piece r of
every bucket.* So each bucket is exactly one ReduceScatter with equal chunks,
and rank r's shard of the master weights (and m, v) is its pieces of all
buckets, one after another. (DeepSpeed's stage 2 keeps ZeRO-1's partition --
the flat buffer cut into N contiguous slices -- and reduces each bucket's
slices to whichever ranks own them, which gives unequal, even empty, chunks.
Cutting each bucket, as FSDP cuts each flat parameter, keeps the collective a
plain ReduceScatter; the price is at most N-1 zeros of padding per bucket.)
Rajbhandari et al. 2020, Section 5.2.

Memory (``comm.alloc``): for the whole run (from ``zero2_adam``'s start)
"params", the full model in ``dtype``; "grads", this rank's gradient pieces
(``padded_numel / N`` numbers in ``dtype``, the reduced shard the optimizer
reads); "master", "adam.m", "adam.v" for the same pieces in ``master_dtype``
(the master is a copy, as in ZeRO-1). During a step: "bucket", each full
bucket from its first gradient until its ReduceScatter ends (freed on the
communication stream, at the time it ends). The model's per-layer ``.grads``
are taken for autograd's short-lived gradients, copied into a bucket at once,
and not counted; nor are activations.

    >>> import numpy as np, ringlab
    >>> from ringlab.zero import data_parallel_adam
    >>> data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=3)
    >>> batches = [b for _, b in zip(range(3), data.batches(10))]
    >>> kw = dict(sizes=[4, 7, 3], seed=0, lr=0.01)
    >>> res = ringlab.run(zero2_adam, [batches] * 4, kwargs=dict(kw, cap_bytes=100))
    >>> ref = ringlab.run(data_parallel_adam, [batches] * 4, kwargs=kw)
    >>> bool(np.allclose(res.outputs[0][1], ref.outputs[0][1], rtol=0, atol=1e-12))
    True
    >>> layout = BucketShards(ringlab.nn.mlp_model([4, 7, 3], np.random.default_rng(0))
    ...                       .named_parameters(), world_size=4, cap_bytes=100)
    >>> layout.names, layout.numels, layout.padded   # backward order; 59 numbers in all
    ([['2.bias', '2.weight'], ['0.bias', '0.weight']], [24, 35], [24, 36])
    >>> res.trace.memory_by_label(0, time=0.0)    # at the end: (24 + 36) / 4 = 15-number pieces
    {'params': 472, 'grads': 120, 'master': 120, 'adam.m': 120, 'adam.v': 120}
    >>> res.trace.peak_memory(0) - sum(_.values())   # + both buckets: 8 * (24 + 36) bytes
    480

Both at once because this run has no simulated time, so backward outruns the
ReduceScatters; with ``flops_per_second`` and a fast network each bucket is
gone before the next one fills, and the peak adds only the largest.
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allgather, ring_reduce_scatter
from ..data_parallel.buckets import BUCKET_CAP_BYTES, assign_buckets, loss_and_backward
from ..data_parallel.sync_sgd import shard
from ..nn import Adam, FlatBuffer, flatten, mlp_model, mse
from .sharding import check_shard, load_flat, padded_size


class BucketShards:
    """ZeRO-2's layout: ``assign_buckets(params, ...)``'s buckets, each padded
    to a multiple of ``world_size`` and cut into equal pieces, one per rank.

    ``names[b]``: the bucket's parameter names (backward order); ``numels[b]``
    its numbers, ``padded[b]`` with the padding; ``padded_numel``: their sum,
    the length every ReduceScatter and AllGather of a step moves."""

    def __init__(self, params, world_size, cap_bytes=BUCKET_CAP_BYTES, first_bucket_bytes=None):
        self._lay_out(params, world_size, assign_buckets(params, cap_bytes, first_bucket_bytes))

    def _lay_out(self, params, world_size, names):
        # Apart from __init__ so that the grader lays out buckets it chose itself.
        self.world_size = world_size
        self.names = names
        self.shapes = {name: params[name].shape for name in params}
        self.where = {name: b for b, names in enumerate(self.names) for name in names}
        self.numels = [sum(params[n].size for n in names) for names in self.names]
        self.padded = [padded_size(k, world_size) for k in self.numels]
        self.padded_numel = sum(self.padded)

    def bucket(self, b, dtype=np.float64):
        """An empty (zero) flat buffer for bucket ``b``, padded to a multiple of N."""
        return FlatBuffer({n: np.zeros(self.shapes[n], dtype) for n in self.names[b]},
                          pad_to=self.world_size)

    def master_shard(self, params, rank, dtype=None):
        """A copy of rank's pieces of all buckets, one after another, in ``dtype``."""
        pieces = [FlatBuffer({n: params[n] for n in names}, pad_to=self.world_size)
                  .shard(rank, self.world_size) for names in self.names]
        return np.concatenate(pieces).astype(dtype or pieces[0].dtype)

    def pieces(self, shard):
        """``shard`` (a rank's master shard) cut back into its per-bucket pieces (views)."""
        return np.split(shard, np.cumsum([p // self.world_size for p in self.padded])[:-1])


@answer('zero2_step')
def zero2_step(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
               flops_per_second=None):
    """One ZeRO-2 step on this rank's shard ``(x, y)`` of a global batch of
    ``batch_size`` samples. ``layout``: the ``BucketShards`` of the model;
    ``opt`` optimizes ``layout.master_shard(...)``. ``flops_per_second``: time
    forward and backward (``compute`` events), else no simulated time.
    Returns the loss on this rank's samples."""
    loss, backward = loss_and_backward(comm, model, x, y, flops_per_second, loss_fn)
    buckets = [None] * len(layout.names)
    missing = [len(names) for names in layout.names]
    works = []
    for ready in backward:
        for name, g in ready.items():
            b = layout.where[name]
            if buckets[b] is None:        # a bucket exists from its first gradient
                buckets[b] = layout.bucket(b, g.dtype)
                comm.alloc("bucket", buckets[b].data)
            # The "autograd hook". (The model's own .grads stand in for autograd's
            # short-lived gradients, which a real ZeRO-2 frees right after this copy.)
            buckets[b].views[name][...] = g
            missing[b] -= 1
        # Start buckets strictly in order, as DDP does: every rank must launch the
        # same collectives in the same order, or they would pair up wrongly.
        while len(works) < len(buckets) and missing[len(works)] == 0:
            data = buckets[len(works)].data
            data *= len(x) / batch_size   # my share of the batch, as in sync_sgd_step
            works.append(comm.start(_reduce_scatter_bucket, data))
    # Only now wait: backward and the ReduceScatters ran side by side.
    # What is left of the gradients is my_grad, 1/N of them: the "grads" pieces.
    my_grad = np.concatenate([work.wait() for work in works])
    buckets = None
    master = opt.params["param"]
    check_shard(comm, master, my_grad)
    opt.step(my_grad.astype(master.dtype))
    params = model.named_parameters()
    dtype = next(iter(params.values())).dtype
    for names, piece in zip(layout.names, layout.pieces(master)):
        load_flat({n: params[n] for n in names}, ring_allgather(comm, piece.astype(dtype)))
    return loss


@answer('zero2_step')
def _reduce_scatter_bucket(comm, bucket):
    """A bucket's ReduceScatter, then the full bucket is dropped: on the
    communication stream, so that the free is recorded when the collective ends."""
    mine = ring_reduce_scatter(comm, bucket)
    comm.free("bucket", bucket)
    return mine


def zero2_adam(comm, batches, *, sizes, seed, lr, loss_fn=mse, dtype=np.float64,
               master_dtype=None, cap_bytes=BUCKET_CAP_BYTES, first_bucket_bytes=None,
               flops_per_second=None, **adam):
    """Train ``mlp_model(sizes)`` from ``seed`` with ZeRO-2 Adam on this rank's
    shard of each global batch; ``dtype``, ``master_dtype`` as in ``zero1_adam``,
    ``cap_bytes``, ``first_bucket_bytes`` as in ``ddp_sync``. Returns
    ``(losses, params)`` like ``data_parallel_adam``."""
    model = mlp_model(sizes, np.random.default_rng(seed), dtype=dtype)
    layout = BucketShards(model.named_parameters(), comm.world_size, cap_bytes,
                          first_bucket_bytes)
    master = layout.master_shard(model.named_parameters(), comm.rank, master_dtype or dtype)
    opt = Adam(master, lr, **adam)
    # Held for the whole run: the full model; gradients, master weights, m and v
    # for this rank's pieces only.
    comm.alloc("params", sum(a.nbytes for a in model.named_parameters().values()))
    comm.alloc("grads", layout.padded_numel // comm.world_size * np.dtype(dtype).itemsize)
    for label in ("master", "adam.m", "adam.v"):
        comm.alloc(label, master)
    losses = []
    for x, y in batches:
        p, r = comm.world_size, comm.rank
        xs, ys = shard(x, r, p).astype(dtype), shard(y, r, p).astype(dtype)
        losses.append(zero2_step(comm, model, opt, xs, ys, len(x), loss_fn, layout=layout,
                                 flops_per_second=flops_per_second))
    return losses, flatten(model.named_parameters()).data
