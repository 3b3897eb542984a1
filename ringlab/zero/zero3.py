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

By default the parameters are float64 and the shard is itself the master
copy: Adam updates it in place, and the next AllGather sends it. With mixed
precision (``dtype=np.float16, master_dtype=np.float32``) the shard, the
gathers and the gradients are float16 and each unit keeps a separate float32
``master`` shard, copied into the float16 shard after each step, as FSDP's
``MixedPrecision`` does.

Memory (``comm.alloc``): for the whole run (from ``zero3_adam``'s start)
"params" and "grads", this rank's shards of every unit; "master" only with
mixed precision; "adam.m", "adam.v" for the master shards. During a step:
"params.full", a unit's gathered parameters, from the start of its AllGather
(a prefetch's too) to its reshard; "grads.full", its full flat gradient, from
its backward to its reshard. Activations are not recorded, nor is the
final gather of ``full_parameters``, which only returns the result.

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
    >>> res.trace.memory_by_label(0, time=0.0)   # units of 40 and 18 (+2) numbers: 10 + 5 each
    {'params': 120, 'grads': 120, 'adam.m': 120, 'adam.v': 120}
    >>> peak = res.trace.memory_by_label(0)      # backward of unit "2", unit "0" prefetched
    >>> peak["params.full"], peak["grads.full"]  # 8 bytes x (20 + 40), 8 x 20
    (480, 160)

3 steps of 2L AllGathers and L ReduceScatters (L = 2 units), and L AllGathers
at the end to return the full parameters.
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allgather, ring_reduce_scatter
from ..data_parallel.sync_sgd import shard
from ..nn import Adam, mlp_model, mse
from .units import UnitShard, UnitShards, unit_layers


class Unit(UnitShard):
    """One FSDP unit: a layer with parameters and the parameter-free layers after
    it. Its parameters are one flat vector of ``padded`` numbers (``numel`` real
    ones, then zeros up to a multiple of N), of which this rank keeps ``shard``
    (the layout is ``units.UnitShard``'s).

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

    def __init__(self, name, layers, rank, world_size, compute_time=0.0, master_dtype=None):
        super().__init__(name, layers, rank, world_size)
        self.compute_time = compute_time
        # The optimizer's copy: the shard itself, unless the master is in another precision.
        separate = master_dtype is not None and np.dtype(master_dtype) != self.shard.dtype
        self.master = self.shard.astype(master_dtype) if separate else None
        self.full = self.full_grad = None                  # the gathered vectors, when held
        self._prefetch = None                               # an AllGather in flight

    # -- parameters: sharded <-> full --------------------------------------------------------
    @answer('zero3_step')
    def prefetch(self, comm):
        """Start this unit's AllGather on the communication stream (a no-op if
        its parameters are full or on their way)."""
        if self.full is None and self._prefetch is None:
            comm.alloc("params.full", self._full_bytes)   # the AllGather's output, from now on
            self._prefetch = comm.start(ring_allgather, self.shard)

    @answer('zero3_step')
    def unshard(self, comm):
        """Make the full parameters available: wait for the prefetch, or
        AllGather now; a no-op if they are still held."""
        if self.full is not None:
            return
        if self._prefetch is not None:
            full, self._prefetch = self._prefetch.wait(), None
        else:
            comm.alloc("params.full", self._full_bytes)
            full = ring_allgather(comm, self.shard)
        self.full = full
        self.layer.params.update(self.views(self.full))

    @answer('zero3_step')
    def reshard(self, comm):
        """Free the full parameters and gradients; only the shards stay.
        (``comm``: to record the freed memory.)"""
        if self.full is not None:
            comm.free("params.full", self._full_bytes)
        if self.full_grad is not None:
            comm.free("grads.full", self.full_grad)
        self._drop()

    def _drop(self):
        self.full = self.full_grad = None
        for name in self.shapes:
            self.layer.params[name] = self.layer.grads[name] = None

    @property
    def _full_bytes(self):
        return self.padded * self.shard.itemsize

    # -- compute ---------------------------------------------------------------------------------
    @answer('zero3_step')
    def forward(self, comm, x):
        if self.compute_time:
            comm.compute(self.compute_time, "forward", layer=self.name)
        for layer in self.layers:
            x = layer.forward(x)
        return x

    @answer('zero3_step')
    def backward(self, comm, dy):
        """Backward through the unit into a fresh, full flat gradient
        ``full_grad`` (the layers add into views of it); returns dx."""
        if self.compute_time:         # two matmuls per forward one: dW and dx
            comm.compute(2 * self.compute_time, "backward", layer=self.name)
        self.full_grad = np.zeros(self.padded, self.shard.dtype)
        comm.alloc("grads.full", self.full_grad)
        self.layer.grads.update(self.views(self.full_grad))
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy


class ShardedModel(UnitShards):
    """A ``Sequential`` cut into ``units`` (one per layer with parameters), each
    rank holding its shard of each: what ``FSDP(model)`` wraps.

    ``prefetch``, ``reshard_after_forward``, ``master_dtype``: see the module's docstring.
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
                 compute_time=0.0, master_dtype=None):
        self.prefetch, self.reshard_after_forward = prefetch, reshard_after_forward
        groups = unit_layers(model, rank)
        times = np.broadcast_to(compute_time, len(groups)) if np.ndim(compute_time) == 0 \
            else np.asarray(compute_time)
        if len(times) != len(groups):
            raise ValueError(f"rank {rank}: compute_time has {len(times)} entries, expected one "
                             f"per unit: {len(groups)} (or one number)")
        self.units = [Unit(name, layers, rank, world_size, t, master_dtype)
                      for (name, layers), t in zip(groups, times)]

    def masters(self):
        """``{unit name: master shard}``: the shards themselves, or their separate
        copies in ``master_dtype``."""
        return {u.name: u.shard if u.master is None else u.master for u in self.units}

    @answer('zero3_step')
    def full_parameters(self, comm):
        """AllGather every unit and return all parameters as one flat vector,
        without padding, in ``named_parameters()`` order (for comparisons)."""
        with comm.span("full_parameters"):
            return np.concatenate([ring_allgather(comm, u.shard)[:u.numel] for u in self.units])


@answer('zero3_step')
def zero3_step(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """One ZeRO-3 / FSDP step on this rank's shard ``(x, y)`` of a global batch
    of ``batch_size`` samples. ``model``: a ``ShardedModel``; ``opt``: an
    optimizer over ``model.masters()`` (``model.shards()`` unless it has a
    ``master_dtype``). Returns the loss on the shard."""
    units, n_local = model.units, len(x)
    # Forward, first unit first: gather, compute, free.
    for i, unit in enumerate(units):
        unit.unshard(comm)
        if model.prefetch and i + 1 < len(units):
            units[i + 1].prefetch(comm)   # its AllGather runs while this unit computes
        x = unit.forward(comm, x)
        if model.reshard_after_forward:
            unit.reshard(comm)
    loss, dy = loss_fn(x, y)
    # Backward, last unit first: gather again (FULL_SHARD), compute,
    # ReduceScatter, free.
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
    # Each rank: Adam on its 1/N, in the masters' precision.
    opt.step({u.name: u.grad_shard.astype(m.dtype, copy=False)
              for u, m in zip(units, model.masters().values())})
    for unit in units:
        if unit.master is not None:
            unit.shard[...] = unit.master  # rounded to the gathers' low precision
    return loss


def zero3_adam(comm, batches, *, sizes, seed, lr, prefetch=True, reshard_after_forward=True,
               compute_time=0.0, loss_fn=mse, dtype=np.float64, master_dtype=None, **adam):
    """Train ``mlp_model(sizes)`` (from ``seed``) with ``zero3_step`` and Adam
    (``adam``: betas, eps, weight_decay) on this rank's shard of each global
    batch; ``dtype``, ``master_dtype`` as in ``zero1_adam``. Returns
    ``(losses, params)`` like ``data_parallel_adam``: the full parameters,
    gathered once at the end (in a span ``full_parameters``)."""
    p, r = comm.world_size, comm.rank
    model = ShardedModel(mlp_model(sizes, np.random.default_rng(seed), dtype=dtype), r, p,
                         prefetch=prefetch, reshard_after_forward=reshard_after_forward,
                         compute_time=compute_time, master_dtype=master_dtype)
    opt = Adam(model.masters(), lr, **adam)
    # Held for the whole run: shards only (a master copy only in mixed precision).
    comm.alloc("params", sum(s.nbytes for s in model.shards().values()))
    comm.alloc("grads", sum(g.nbytes for g in model.grad_shards().values()))
    labels = ("master", "adam.m", "adam.v") if master_dtype is not None and \
        np.dtype(master_dtype) != np.dtype(dtype) else ("adam.m", "adam.v")
    for label in labels:
        comm.alloc(label, sum(m.nbytes for m in model.masters().values()))
    losses = []
    for x, y in batches:
        xs, ys = shard(x, r, p).astype(dtype), shard(y, r, p).astype(dtype)
        losses.append(zero3_step(comm, model, opt, xs, ys, len(x), loss_fn))
    return losses, model.full_parameters(comm)
