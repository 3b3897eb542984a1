"""ZeRO-3 / FSDP: shard the parameters too, and gather each layer just in time.

ZeRO stage 3 (Rajbhandari et al. 2020) and PyTorch's FullyShardedDataParallel
(FSDP, Zhao et al. 2023) keep on each of the N ranks only 1/N of everything:
parameters, gradients and optimizer state. The model is cut into *units* (FSDP
wraps modules; here one unit per ``Linear`` layer, with the parameter-free
GeLU after it). A unit's parameters live as one flat vector, FSDP's
``FlatParameter``, padded with zeros to a multiple of N so that it cuts into N
equal shards; rank r stores shard r and nothing else. Each training step:

* forward, unit by unit: AllGather the unit's full parameters, run it, free them;
* backward, last unit first: AllGather them again, run its backward, then
  ReduceScatter its flat gradient (rank r keeps the sum of shard r) and free
  the full parameters and gradients;
* Adam on the shards: each rank updates its 1/N of the parameters with its
  1/N of the gradients and its 1/N of the moments.

Per step a rank sends 3 x (N-1)/N of the padded parameters: two AllGathers and
one ReduceScatter, the ZeRO paper's 3 Psi against data parallelism's 2 Psi
(Sec. 7.2.2). Two options trade memory for time, as FSDP's do:

* ``prefetch=True``: the next unit's AllGather is started on the communication
  stream (``comm.start``) while the current unit computes: in forward the next
  unit, in backward the one before (FSDP's ``forward_prefetch`` and
  ``BackwardPrefetch.BACKWARD_PRE``). Two units are full at a time instead of one.
* ``reshard_after_forward=False`` is FSDP's ``SHARD_GRAD_OP`` (ZeRO-2 plus
  gathering for forward): the parameters gathered for forward stay until
  backward has used them, so there is no second AllGather (2 Psi per step).

Every unit is resharded after forward, the last one too: 2L AllGathers per
step for L units, exactly 3 Psi. (FSDP does not reshard its *root* unit after
forward, since backward needs it at once; in our model every parameter
belongs to a child unit, as with per-layer wrapping.)

Here the parameters are float64 and the shard is itself the master copy; with
mixed precision, FSDP gathers a low-precision copy and keeps a float32 shard.
The step equals plain data-parallel Adam, up to the order of the sums:

    >>> import numpy as np, ringlab
    >>> from ringlab.zero import data_parallel_adam
    >>> data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2)
    >>> batches = [b for _, b in zip(range(3), data.batches(8))]
    >>> kw = dict(sizes=[4, 8, 2], seed=0, lr=0.01)
    >>> res = ringlab.run(zero3_adam, [batches] * 4, kwargs=kw)
    >>> ref = ringlab.run(data_parallel_adam, [batches] * 4, kwargs=kw)
    >>> bool(np.allclose(res.outputs[0][1], ref.outputs[0][1], rtol=0, atol=1e-12))
    True
    >>> calls = [s.name for s in res.trace.spans if s.rank == 0]
    >>> calls.count("ring_allgather"), calls.count("ring_reduce_scatter")
    (14, 6)

3 steps of 2L AllGathers and L ReduceScatters (L = 2 units), and L AllGathers
at the end to return the full parameters.
"""

import numpy as np

from ..collectives import ring_allgather, ring_reduce_scatter
from ..data_parallel.sync_sgd import shard
from ..nn import Adam, FlatBuffer, mlp_model, mse


class Unit:
    """One FSDP unit: a layer with parameters and the parameter-free layers after
    it. Its parameters are one flat vector of ``padded`` numbers (``numel`` real
    ones, then zeros up to a multiple of N), of which this rank keeps ``shard``.

    ``unshard`` puts the full parameters into the layer, ``reshard`` frees
    them (and the full gradients): in between, the layer runs as usual.

        >>> import numpy as np
        >>> from ringlab.nn import Linear
        >>> unit = Unit("0", [Linear(3, 2, np.random.default_rng(0))], rank=1, world_size=4)
        >>> unit.numel, unit.padded, len(unit.shard)       # 3*2 + 2 = 8: no padding
        (8, 8, 2)
        >>> unit.layers[0].params["weight"] is None       # only the shard is kept
        True
    """

    def __init__(self, name, layers, rank, world_size, compute_time=0.0):
        self.name, self.layers, self.compute_time = name, layers, compute_time
        self.rank, self.world_size = rank, world_size
        flat = FlatBuffer(layers[0].params, pad_to=world_size)   # FSDP's FlatParameter
        self.shapes, self.offsets, self.sizes = flat.shapes, flat.offsets, flat.sizes
        self.numel, self.padded = flat.numel, len(flat)
        self.shard = flat.shard(rank, world_size).copy()   # mine: parameters and master copy
        self.grad_shard = np.zeros_like(self.shard)        # my part of the summed gradient
        self.full = self.full_grad = None                  # the gathered vectors, when held
        self._prefetch = None                               # an AllGather in flight
        self._drop()                                        # the full init is not kept

    @property
    def layer(self):
        return self.layers[0]

    # -- parameters: sharded <-> full --------------------------------------------------------
    def prefetch(self, comm):
        """Start this unit's AllGather on the communication stream (a no-op if
        its parameters are full or on their way)."""
        if self.full is None and self._prefetch is None:
            # mem: alloc full params (the AllGather's output exists from now on)
            self._prefetch = comm.start(ring_allgather, self.shard)

    def unshard(self, comm):
        """Make the full parameters available: wait for the prefetch, or
        AllGather now; a no-op if they are still held."""
        if self.full is not None:
            return
        if self._prefetch is not None:
            full, self._prefetch = self._prefetch.wait(), None
        else:
            full = ring_allgather(comm, self.shard)      # mem: alloc full params
        self.full = full
        self.layer.params.update(self._views(self.full))

    def reshard(self, comm):
        """Free the full parameters and gradients; only the shards stay.
        (``comm``: to record the freed memory.)"""
        self._drop()                                        # mem: free full params (+ grads)

    def _drop(self):
        self.full = self.full_grad = None
        for name in self.shapes:
            self.layer.params[name] = self.layer.grads[name] = None

    def _views(self, flat):
        """The layer's named arrays as views into a full flat vector."""
        return {name: flat[start:start + self.sizes[name]].reshape(self.shapes[name])
                for name, start in self.offsets.items()}

    # -- compute ---------------------------------------------------------------------------------
    def forward(self, comm, x):
        if self.compute_time:
            comm.compute(self.compute_time, "forward", layer=self.name)
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, comm, dy):
        """Backward through the unit into a fresh, full flat gradient
        ``full_grad`` (the layers add into views of it); returns dx."""
        if self.compute_time:         # two matmuls per forward one: dW and dx
            comm.compute(2 * self.compute_time, "backward", layer=self.name)
        self.full_grad = np.zeros(self.padded, self.shard.dtype)   # mem: alloc full grads
        self.layer.grads.update(self._views(self.full_grad))
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy


class ShardedModel:
    """A ``Sequential`` cut into ``units`` (one per layer with parameters), each
    rank holding its shard of each: what ``FSDP(model)`` wraps.

    ``prefetch``, ``reshard_after_forward``: see the module's docstring.
    ``compute_time``: simulated seconds of each unit's forward (a number, or
    one per unit); its backward takes twice as long. 0: no compute events.

        >>> import numpy as np
        >>> from ringlab.nn import mlp_model
        >>> m = ShardedModel(mlp_model([4, 8, 2], np.random.default_rng(0)), rank=0, world_size=3)
        >>> [(u.name, u.numel, u.padded) for u in m.units]    # 40 and 18 numbers
        [('0', 40, 42), ('2', 18, 18)]
        >>> {name: len(s) for name, s in m.shards().items()}
        {'0': 14, '2': 6}
    """

    def __init__(self, model, rank, world_size, *, prefetch=True, reshard_after_forward=True,
                 compute_time=0.0):
        self.prefetch, self.reshard_after_forward = prefetch, reshard_after_forward
        groups = []
        for i, layer in enumerate(model.layers):
            if layer.params:
                groups.append((str(i), [layer]))
            elif groups:
                groups[-1][1].append(layer)         # GeLU & co. join the unit before them
            else:
                raise ValueError(f"rank {rank}: layer {i} ({type(layer).__name__}) has no "
                                 f"parameters and no unit before it; the first layer must "
                                 f"have some")
        times = np.broadcast_to(compute_time, len(groups)) if np.ndim(compute_time) == 0 \
            else np.asarray(compute_time)
        if len(times) != len(groups):
            raise ValueError(f"rank {rank}: compute_time has {len(times)} entries, expected one "
                             f"per unit: {len(groups)} (or one number)")
        self.units = [Unit(name, layers, rank, world_size, t)
                      for (name, layers), t in zip(groups, times)]

    def shards(self):
        """``{unit name: parameter shard}``: what the optimizer updates."""
        return {u.name: u.shard for u in self.units}

    def grad_shards(self):
        return {u.name: u.grad_shard for u in self.units}

    def full_parameters(self, comm):
        """AllGather every unit and return all parameters as one flat vector,
        without padding, in ``named_parameters()`` order (for comparisons)."""
        with comm.span("full_parameters"):
            return np.concatenate([ring_allgather(comm, u.shard)[:u.numel] for u in self.units])


def zero3_step(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """One ZeRO-3 / FSDP step on this rank's shard ``(x, y)`` of a global batch
    of ``batch_size`` samples. ``model``: a ``ShardedModel``; ``opt``: an
    optimizer over ``model.shards()``. Returns the loss on the shard."""
    units, n_local = model.units, len(x)
    # Forward, first unit first: gather, compute, free.
    for i, unit in enumerate(units):
        unit.unshard(comm)
        if model.prefetch and i + 1 < len(units):
            units[i + 1].prefetch(comm)       # its AllGather runs while this unit computes
        x = unit.forward(comm, x)
        if model.reshard_after_forward:
            unit.reshard(comm)
    loss, dy = loss_fn(x, y)
    # Backward, last unit first: gather again (FULL_SHARD), compute, ReduceScatter, free.
    for i in reversed(range(len(units))):
        unit = units[i]
        unit.unshard(comm)
        if model.prefetch and i > 0:
            units[i - 1].prefetch(comm)       # the unit backward reaches next
        dy = unit.backward(comm, dy)
        # Weight my mean gradient by my share of the batch, as sync_sgd_step does:
        # the ReduceScatter's sum is then the mean over all batch_size samples.
        unit.full_grad *= n_local / batch_size
        unit.grad_shard[...] = ring_reduce_scatter(comm, unit.full_grad)
        unit.reshard(comm)
    opt.step(model.grad_shards())             # each rank: Adam on its 1/N
    return loss


def zero3_adam(comm, batches, *, sizes, seed, lr, prefetch=True, reshard_after_forward=True,
               compute_time=0.0, loss_fn=mse, **adam):
    """Train ``mlp_model(sizes)`` (from ``seed``) with ``zero3_step`` and Adam
    (``adam``: betas, eps, weight_decay) on this rank's shard of each global
    batch. Returns ``(losses, params)`` like ``data_parallel_adam``: the full
    parameters, gathered once at the end (in a span ``full_parameters``)."""
    p, r = comm.world_size, comm.rank
    model = ShardedModel(mlp_model(sizes, np.random.default_rng(seed)), r, p,
                         prefetch=prefetch, reshard_after_forward=reshard_after_forward,
                         compute_time=compute_time)
    opt = Adam(model.shards(), lr, **adam)
    losses = []
    for x, y in batches:
        losses.append(zero3_step(comm, model, opt, shard(x, r, p), shard(y, r, p), len(x), loss_fn))
    return losses, model.full_parameters(comm)
