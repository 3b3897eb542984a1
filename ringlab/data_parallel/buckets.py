"""Gradient sync inside the training step: DDP's buckets (Li et al., VLDB 2020).

Backward produces gradients layer by layer, the last layer's first. Three ways
to average them over the ranks, each a function
``sync(comm, params, backward) -> {name: averaged gradient}``:

* ``sync_per_parameter``: after backward, one AllReduce per tensor. Correct,
  but every call pays the latency 2(P-1) alpha: latency-bound for many tensors.
* ``sync_flat``: after backward, one AllReduce of one flat buffer. Few alphas,
  but the network idles during backward and backward idles during the AllReduce.
* ``ddp_sync``: PyTorch DDP's design. Gradients are packed into *buckets* in
  reverse layer order (the order backward makes them); as soon as a bucket's
  last gradient is ready, its AllReduce starts on the communication stream
  (``comm.start``) while backward goes on with the earlier layers.

``params`` is ``{name: array}`` in forward (registration) order; it only plans
the buckets. ``backward`` is an iterator standing in for autograd's hooks:
each ``next()`` runs one layer's backward (with a ``comm.compute`` event) and
gives ``{name: gradient}`` for the parameters that layer just finished.
``timed_backward`` makes one from a ``Sequential`` model.

PyTorch's defaults, from ``torch/csrc/distributed/c10d/reducer.hpp``:
``kDefaultBucketBytesCap = 25 * 1024 * 1024`` (``bucket_cap_mb=25`` in
``torch/nn/parallel/distributed.py``) and ``kDefaultFirstBucketBytes = 1024 *
1024`` (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``): the first bucket is
small so the first AllReduce starts early.

    >>> import numpy as np
    >>> params = {"0.weight": np.zeros((4, 8)), "0.bias": np.zeros(8),
    ...           "2.weight": np.zeros((8, 2)), "2.bias": np.zeros(2)}
    >>> assign_buckets(params, cap_bytes=200)   # 16 + 128 + 64 = 208 >= 200: close
    [['2.bias', '2.weight', '0.bias'], ['0.weight']]
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allreduce
from ..nn import FlatBuffer, mse

BUCKET_CAP_BYTES = 25 * 1024 * 1024      # torch: kDefaultBucketBytesCap, bucket_cap_mb=25
FIRST_BUCKET_BYTES = 1024 * 1024         # torch: kDefaultFirstBucketBytes


@answer('bucketed_grad_sync')
def assign_buckets(params, cap_bytes=BUCKET_CAP_BYTES, first_bucket_bytes=None):
    """Names of ``params`` grouped into buckets, in the order backward fills them.

    Walk the tensors in reverse registration order and add each to the open
    bucket; close the bucket as soon as it holds ``cap_bytes`` or more (so only
    its last tensor can take it past the cap; a tensor larger than the cap gets
    a bucket of its own). This is the rule of torch's
    ``compute_bucket_assignment_by_size``. ``first_bucket_bytes``: a smaller
    cap for the first bucket (DDP's 1 MiB); default: ``cap_bytes``.
    """
    limit = cap_bytes if first_bucket_bytes is None else first_bucket_bytes
    buckets, current, size = [], [], 0
    for name in reversed(list(params)):
        current.append(name)
        size += params[name].nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap_bytes
    if current:
        buckets.append(current)
    return buckets


def timed_backward(comm, model, x, y, flops_per_second, loss_fn=mse):
    """Forward (one ``compute`` event per layer) and the loss now; returns the
    backward as an iterator: each ``next()`` computes one layer's backward, last
    layer first (a ``compute`` event of 2x that layer's forward FLOPs), and
    gives ``{name: gradient}`` for its parameters (layers without any are
    skipped). ``model``: a ``Sequential``."""
    return loss_and_backward(comm, model, x, y, flops_per_second, loss_fn)[1]


def loss_and_backward(comm, model, x, y, flops_per_second=None, loss_fn=mse):
    """``timed_backward`` that also returns the loss: ``(loss, backward)``.
    ``flops_per_second=None``: no ``compute`` events (no simulated time)."""
    model.zero_grad()
    shapes = []
    for i, layer in enumerate(model.layers):
        shapes.append(x.shape)
        if flops_per_second and layer.flops(x.shape):   # GeLU & co.: no matmul, no time
            comm.compute(layer.flops(x.shape) / flops_per_second, "forward", layer=i)
        x = layer.forward(x)
    loss, dy = loss_fn(x, y)

    def backward(dy):
        for i in reversed(range(len(model.layers))):
            layer = model.layers[i]
            # Backward does two matmuls per forward one: dW = x^T dy and dx = dy W^T.
            if flops_per_second and layer.flops(shapes[i]):
                comm.compute(2 * layer.flops(shapes[i]) / flops_per_second, "backward", layer=i)
            dy = layer.backward(dy)
            if layer.grads:
                yield {f"{i}.{k}": g for k, g in layer.grads.items()}
    return loss, backward(dy)


def _average(comm, flat):
    """Divide the summed buffer by P: the one place the average is taken."""
    flat /= comm.world_size
    return flat


@answer('bucketed_grad_sync')
def sync_per_parameter(comm, params, backward):
    """After backward, one AllReduce per tensor: len(params) x 2(P-1) alphas."""
    grads = {}
    for ready in backward:                          # let backward run to the end
        grads.update(ready)
    return {name: _average(comm, ring_allreduce(comm, grads[name].ravel())).reshape(
        params[name].shape) for name in params}


@answer('bucketed_grad_sync')
def sync_flat(comm, params, backward):
    """After backward, one AllReduce of one flat buffer: no overlap at all."""
    flat = FlatBuffer({name: np.zeros_like(p) for name, p in params.items()})
    for ready in backward:
        for name, g in ready.items():
            flat.views[name][...] = g
    ring_allreduce(comm, flat.data, out=flat.data)
    _average(comm, flat.data)
    return {name: flat.views[name] for name in params}


@answer('bucketed_grad_sync')
def ddp_sync(comm, params, backward, cap_bytes=BUCKET_CAP_BYTES,
             first_bucket_bytes=FIRST_BUCKET_BYTES):
    """DDP: buckets in reverse layer order, each AllReduced on the communication
    stream as soon as its last gradient is ready, overlapping backward."""
    buckets = assign_buckets(params, cap_bytes, first_bucket_bytes)
    flats = [FlatBuffer({n: np.zeros_like(params[n]) for n in names})
             for names in buckets]
    where = {name: b for b, names in enumerate(buckets) for name in names}
    missing = [len(names) for names in buckets]
    works = []
    for ready in backward:
        for name, g in ready.items():
            b = where[name]
            flats[b].views[name][...] = g            # the "autograd hook": copy in
            missing[b] -= 1
        # Start buckets strictly in order, as DDP does: every rank must launch
        # the same collectives in the same order, or they would pair up wrongly.
        while len(works) < len(buckets) and missing[len(works)] == 0:
            data = flats[len(works)].data
            works.append(comm.start(ring_allreduce, data, out=data))
    out = {}
    for work, flat in zip(works, flats):
        _average(comm, work.wait())          # wait only when the optimizer needs it
        out.update(flat.views)
    return {name: out[name] for name in params}


def training_step(comm, batch, *, model_fn, sync, flops_per_second, **sync_kw):
    """One data-parallel step: build the model (same seed everywhere), forward,
    backward with ``sync``; returns the averaged gradients as one flat vector."""
    x, y = batch
    model = model_fn()
    params = model.named_parameters()
    grads = sync(comm, params, timed_backward(comm, model, x, y, flops_per_second), **sync_kw)
    return np.concatenate([grads[n].ravel() for n in params])


def accumulate(comm, model, micro_batches, *, sync_every=False, loss_fn=mse):
    """Gradient accumulation over ``k`` micro-batches, then one averaged gradient.

    ``sync_every=False`` is DDP's ``no_sync()`` for the first k-1 micro-steps:
    backward adds into the local gradients, and one AllReduce at the end syncs
    the sum. ``sync_every=True`` AllReduces after every micro-step (k times the
    bytes). Both return the same flat gradient, up to rounding."""
    k, p = len(micro_batches), comm.world_size
    model.zero_grad()
    total = None
    for x, y in micro_batches:
        _, dpred = loss_fn(model.forward(x), y)
        model.backward(dpred / k)                    # += : the k means, weighted 1/k
        if sync_every:
            g = np.concatenate([v.ravel() for v in model.named_grads().values()])
            g = ring_allreduce(comm, g) / p
            total = g if total is None else total + g
            model.zero_grad()
    if not sync_every:
        g = np.concatenate([v.ravel() for v in model.named_grads().values()])
        total = ring_allreduce(comm, g) / p          # the one sync, on the last micro-step
    return total
