"""ZeRO-1 (the paper's P_os): every rank keeps the optimizer state of its shard only.

Data parallelism stores Adam's master weights and moments m, v on every rank:
12 bytes a parameter in mixed precision, N times over. ZeRO-1 cuts the flat
parameter vector into N equal shards and lets rank r own shard r: its master
weights and moments. A step then needs no AllReduce; its two halves do:

1. backward as usual (every rank, full model, its part of the batch);
2. **ReduceScatter** of the flat gradients: rank r receives the *sum* for its
   shard only -- the first half of an AllReduce;
3. Adam on the shard: master weights, m and v of 1/N of the model;
4. **AllGather** of the updated shards into every rank's model -- the second
   half of the AllReduce, moving parameters instead of gradients.

Same bytes as data parallelism (2 x (N-1)/N of the buffer per rank), the same
result up to rounding, and 1/N of the optimizer state. Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (2020),
Section 5.1.

Memory (``comm.alloc``, once, at the start of ``zero1_adam``): "params" and
"grads", the full model and its gradients in ``dtype`` (ZeRO-1 shards
neither); "master", "adam.m", "adam.v": ``master_dtype`` numbers for this
rank's padded shard only. The master weights are always a separate copy
(``master_shard`` says why), even when ``master_dtype == dtype``. Nothing is
allocated or freed during a step: the ReduceScatter reduces into the
gradients' own buffer and the AllGather into the parameters', as DeepSpeed
does (the copies numpy makes on the way are not counted), and activations are
not recorded. So ``trace.memory_by_label(r)`` is the paper's 2Ψ + 2Ψ + 12Ψ/N
in mixed precision, plus padding.

    >>> import numpy as np, ringlab
    >>> from ringlab.zero import data_parallel_adam
    >>> data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=3)
    >>> batches = [b for _, b in zip(range(3), data.batches(10))]
    >>> kw = dict(sizes=[4, 7, 3], seed=0, lr=0.01)     # 59 parameters: padded to 60
    >>> res = ringlab.run(zero1_adam, [batches] * 4, kwargs=kw)
    >>> ref = ringlab.run(data_parallel_adam, [batches] * 4, kwargs=kw)
    >>> bool(np.allclose(res.outputs[0][1], ref.outputs[0][1], rtol=0, atol=1e-12))
    True
    >>> [c["span"] for c in res.trace.collectives()][:2]
    ['ring_reduce_scatter', 'ring_allgather']
    >>> res.trace.memory_by_label(3)       # 59 float64 numbers and a 15-number shard
    {'params': 472, 'grads': 472, 'master': 120, 'adam.m': 120, 'adam.v': 120}
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allgather, ring_reduce_scatter
from ..data_parallel.buckets import loss_and_backward
from ..data_parallel.sync_sgd import shard
from ..nn import Adam, flatten, mlp_model, mse
from .sharding import check_shard, load_flat, master_shard


@answer('zero1_step')
def zero1_step(comm, model, opt, x, y, batch_size, loss_fn=mse, *,
               flops_per_second=None):
    """One ZeRO-1 step on this rank's shard ``(x, y)`` of a global batch of
    ``batch_size`` samples. ``opt`` optimizes this rank's shard of the master
    weights (``Adam(master_shard(...))``); ``model`` is updated in place.
    ``flops_per_second``: time forward and backward (``compute`` events).
    Returns the loss on this rank's samples."""
    loss, backward = loss_and_backward(comm, model, x, y, flops_per_second, loss_fn)
    for _ in backward:                         # ZeRO-1 waits for the whole gradient
        pass
    # Padded to a multiple of N, so the ReduceScatter's chunks are equal and
    # chunk r is exactly the master shard rank r owns.
    grads = flatten(model.named_grads(), pad_to=comm.world_size)
    grads.data *= len(x) / batch_size          # my share of the batch (sync_sgd_step)
    my_grad = ring_reduce_scatter(comm, grads.data)
    # ZeRO-1 keeps the full gradients ("grads"): only ZeRO-2 shards them.
    master = opt.params["param"]
    check_shard(comm, master, my_grad)
    opt.step(my_grad.astype(master.dtype))     # mixed precision: fp16 -> fp32 master
    # Every rank sends its updated shard in the model's precision, receives the others.
    full = ring_allgather(comm, master.astype(grads.data.dtype))
    load_flat(model.named_parameters(), full)
    return loss


def zero1_adam(comm, batches, *, sizes, seed, lr, loss_fn=mse, dtype=np.float64,
               master_dtype=None, flops_per_second=None, **adam):
    """Train ``mlp_model(sizes)`` from ``seed`` with ZeRO-1 Adam on this rank's
    shard of each global batch. ``dtype``: the model's parameters, gradients
    and messages; ``master_dtype``: master weights and Adam's m, v (default
    ``dtype``; ``dtype=np.float16, master_dtype=np.float32`` is the paper's
    mixed precision). ``flops_per_second`` as in ``zero1_step``. Returns
    ``(losses, params)`` like ``data_parallel_adam``."""
    model = mlp_model(sizes, np.random.default_rng(seed), dtype=dtype)
    master = master_shard(model.named_parameters(), comm.rank, comm.world_size,
                          master_dtype or dtype)
    opt = Adam(master, lr, **adam)
    # What this rank holds for the whole run: the full model and gradients in
    # `dtype`, master weights, m and v for 1/N of the parameters.
    comm.alloc("params", sum(a.nbytes for a in model.named_parameters().values()))
    comm.alloc("grads", sum(a.nbytes for a in model.named_grads().values()))
    for label, array in [("master", master), ("adam.m", master), ("adam.v", master)]:
        comm.alloc(label, array)
    losses = []
    for x, y in batches:
        p, r = comm.world_size, comm.rank
        xs, ys = shard(x, r, p).astype(dtype), shard(y, r, p).astype(dtype)
        losses.append(zero1_step(comm, model, opt, xs, ys, len(x), loss_fn,
                                 flops_per_second=flops_per_second))
    return losses, flatten(model.named_parameters()).data
