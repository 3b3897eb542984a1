"""Right and wrong programs for the ZeRO graders (tests/grading/zero/test_grade_zero.py).

The wrong ones are the issue's list, one mistake each: an AllReduce instead
of a ReduceScatter, the whole model updated on every rank, the updated
parameters never all-gathered, the master weights kept whole while Adam's
moments are sharded, a layer's parameters freed before its backward, shards
misaligned with the padding; and a few more (equal weights, no overlap...).
"""

import numpy as np

from ringlab.collectives import ring_allgather, ring_allreduce, ring_reduce_scatter
from ringlab.nn import Adam, FlatBuffer, flatten, mse

KEPT = {}       # what a wrong program keeps between steps: id(opt) -> (opt, {...})


def _kept(opt, key, make):
    # opt itself is kept too, so that its id is not reused by another case's
    mine = KEPT.setdefault(id(opt), (opt, {}))[1]
    if key not in mine:
        mine[key] = make()
    return mine[key]


def local_grads(model, x, y):
    model.zero_grad()
    loss, d = mse(model.forward(x), y)
    model.backward(d)
    return loss


def load(model, flat):
    offset = 0
    for p in model.named_parameters().values():
        p[...] = flat[offset:offset + p.size].reshape(p.shape)
        offset += p.size


# ================================================================= ZeRO-1, right
def z1_solution(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """The notebook's solution."""
    model.zero_grad()
    loss, d = loss_fn(model.forward(x), y)
    model.backward(d)
    grads = flatten(model.named_grads(), pad_to=comm.world_size)
    grads.data *= len(x) / batch_size
    my_grad = ring_reduce_scatter(comm, grads.data)
    opt.step(my_grad)
    load(model, ring_allgather(comm, opt.params["param"]))
    return loss


def left_ring_reduce_scatter(comm, x):
    """A ring going LEFT, with isend/irecv: rank r ends with chunk r of the sum."""
    n, r = comm.world_size, comm.rank
    chunks = [c.copy() for c in np.split(x, n)]
    for k in range(n - 1):
        send_c, recv_c = (r + k + 1) % n, (r + k + 2) % n
        req = comm.isend(chunks[send_c], (r - 1) % n)
        chunks[recv_c] += comm.irecv((r + 1) % n).wait()
        req.wait()
    return chunks[r]


def left_ring_allgather(comm, block):
    n, r = comm.world_size, comm.rank
    blocks = [None] * n
    blocks[r] = block.copy()
    for k in range(n - 1):
        send_b, recv_b = (r + k) % n, (r + k + 1) % n
        req = comm.isend(blocks[send_b], (r - 1) % n)
        blocks[recv_b] = comm.irecv((r + 1) % n).wait()
        req.wait()
    return np.concatenate(blocks)


def z1_left_ring_sum_then_divide(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Own rings (isend/irecv, to the left); gradients weighted by len(x), the
    shard divided by batch_size after the ReduceScatter."""
    loss = local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=comm.world_size).data * len(x)
    mine = left_ring_reduce_scatter(comm, g) / batch_size
    opt.step(mine)
    load(model, left_ring_allgather(comm, opt.params["param"]))
    return loss


# ================================================================= ZeRO-1, wrong
def z1_allreduce(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """AllReduce instead of ReduceScatter, then Adam on my slice and an AllGather."""
    local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=comm.world_size).data * (len(x) / batch_size)
    total = ring_allreduce(comm, g)
    size = len(total) // comm.world_size
    opt.step(total[comm.rank * size:(comm.rank + 1) * size])
    load(model, ring_allgather(comm, opt.params["param"]))


def z1_whole_model_adam(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Data parallelism: AllReduce and Adam on the whole model, on every rank."""
    local_grads(model, x, y)
    full = _kept(opt, "adam", lambda: Adam(model.named_parameters(), opt.lr))
    g = flatten(model.named_grads())
    g.data[...] = ring_allreduce(comm, g.data * (len(x) / batch_size))
    full.step(g.views)


def z1_whole_model_adam_rs_ag(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """ReduceScatter + AllGather of the GRADIENTS, then Adam on the whole model
    (and a step of the handed optimizer, for show): right parameters."""
    local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=comm.world_size)
    mine = ring_reduce_scatter(comm, g.data * (len(x) / batch_size))
    opt.step(mine)
    total = ring_allgather(comm, mine)
    full = _kept(opt, "adam", lambda: Adam(model.named_parameters(), opt.lr))
    full.step({k: total[g.offsets[k]:g.offsets[k] + v.size].reshape(v.shape)
               for k, v in g.views.items()})


def z1_no_allgather(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Updates its shard and copies only that back into the model."""
    local_grads(model, x, y)
    n, r = comm.world_size, comm.rank
    g = flatten(model.named_grads(), pad_to=n)
    opt.step(ring_reduce_scatter(comm, g.data * (len(x) / batch_size)))
    flat = flatten(model.named_parameters(), pad_to=n)
    flat.shard(r, n)[...] = opt.params["param"]
    load(model, flat.data)


def z1_master_view_of_full_copy(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Shards Adam's moments but not the master weights: the optimizer's
    parameter becomes a view into a full master copy kept on every rank."""
    n, r = comm.world_size, comm.rank
    master = _kept(opt, "master", lambda: flatten(model.named_parameters(), pad_to=n))
    opt.params["param"] = master.shard(r, n)
    local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=n)
    opt.step(ring_reduce_scatter(comm, g.data * (len(x) / batch_size)))
    load(model, ring_allgather(comm, master.shard(r, n)))


def z1_full_master_kept(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Keeps a full master copy between steps and sends its shard from it."""
    n, r = comm.world_size, comm.rank
    master = _kept(opt, "master", lambda: flatten(model.named_parameters(), pad_to=n))
    local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=n)
    opt.step(ring_reduce_scatter(comm, g.data * (len(x) / batch_size)))
    master.shard(r, n)[...] = opt.params["param"]
    load(model, ring_allgather(comm, master.shard(r, n)))


def z1_front_padding(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Pads the flat gradient at the front: its shards do not line up with the master's."""
    local_grads(model, x, y)
    g = flatten(model.named_grads()).data * (len(x) / batch_size)
    pad = -len(g) % comm.world_size
    opt.step(ring_reduce_scatter(comm, np.concatenate([np.zeros(pad), g])))
    load(model, ring_allgather(comm, opt.params["param"]))


def z1_no_padding(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """ReduceScatters the unpadded gradient: chunks of unequal sizes."""
    local_grads(model, x, y)
    g = flatten(model.named_grads()).data * (len(x) / batch_size)
    opt.step(ring_reduce_scatter(comm, g))
    load(model, ring_allgather(comm, opt.params["param"]))


def z1_equal_weights(comm, model, opt, x, y, batch_size, loss_fn=mse):
    local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=comm.world_size).data / comm.world_size
    opt.step(ring_reduce_scatter(comm, g))
    load(model, ring_allgather(comm, opt.params["param"]))


# ================================================================= ZeRO-2
def _backward(comm, model, x, y, flops_per_second, loss_fn=mse):
    from ringlab.data_parallel.buckets import loss_and_backward
    return loss_and_backward(comm, model, x, y, flops_per_second, loss_fn)


def _all_grads(backward):
    """Runs backward to its end: every gradient, copied."""
    grads = {}
    for ready in backward:
        grads.update({k: g.copy() for k, g in ready.items()})
    return grads


def _bucket(layout, b, grads):
    """Bucket b's flat buffer, filled with its gradients."""
    flat = layout.bucket(b)
    for name in layout.names[b]:
        flat.views[name][...] = grads[name]
    return flat


def _reduce_scatters_in_backward(comm, layout, backward, weight):
    """Each bucket's ReduceScatter (of its gradients times ``weight``) started on
    the stream as soon as backward has yielded all of them: the works."""
    works, grads = [], {}
    for ready in backward:
        grads.update({k: g.copy() for k, g in ready.items()})
        while len(works) < len(layout.names) and all(k in grads
                                                     for k in layout.names[len(works)]):
            flat = _bucket(layout, len(works), grads)
            works.append(comm.start(ring_reduce_scatter, flat.data * weight))
    return works


def _load_buckets(model, layout, fulls):
    """Copies each bucket's full vector (``fulls``, in bucket order) into the model."""
    params = model.named_parameters()
    for names, full in zip(layout.names, fulls):
        offset = 0
        for name in names:
            p = params[name]
            p[...] = full[offset:offset + p.size].reshape(p.shape)
            offset += p.size


def _allgather_buckets(comm, model, layout, opt, allgather=ring_allgather):
    """Every bucket's piece of the master shard AllGathered, one bucket after the
    other, into the model."""
    _load_buckets(model, layout, (allgather(comm, piece)
                                  for piece in layout.pieces(opt.params["param"])))


def z2_solution(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                flops_per_second=None, reduce_scatter=ring_reduce_scatter,
                allgather=ring_allgather, weight=None, divide=1.0):
    """The notebook's solution (with knobs for a variant below)."""
    loss, backward = _backward(comm, model, x, y, flops_per_second, loss_fn)
    buckets, missing, works = {}, [len(b) for b in layout.names], []
    for ready in backward:
        for name, g in ready.items():
            b = layout.where[name]
            if b not in buckets:
                buckets[b] = layout.bucket(b, g.dtype)
            buckets[b].views[name][...] = g
            missing[b] -= 1
        while len(works) < len(layout.names) and missing[len(works)] == 0:
            data = buckets.pop(len(works)).data
            data *= len(x) / batch_size if weight is None else weight(len(x), batch_size)
            works.append(comm.start(reduce_scatter, data))
    opt.step(np.concatenate([w.wait() for w in works]) / divide)
    params = model.named_parameters()
    for names, piece in zip(layout.names, layout.pieces(opt.params["param"])):
        full, offset = allgather(comm, piece), 0
        for name in names:
            p = params[name]
            p[...] = full[offset:offset + p.size].reshape(p.shape)
            offset += p.size
    return loss


def z2_left_ring_sum_then_divide(comm, model, opt, x, y, batch_size, loss_fn=mse, *,
                                 layout, flops_per_second=None):
    """Own rings to the left (isend/irecv); weights len(x), divides by batch_size after."""
    return z2_solution(comm, model, opt, x, y, batch_size, loss_fn, layout=layout,
                       flops_per_second=flops_per_second,
                       reduce_scatter=left_ring_reduce_scatter, allgather=left_ring_allgather,
                       weight=lambda rows, b: rows, divide=batch_size)


def z2_whole_model_adam(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                        flops_per_second):
    """Data parallelism under ZeRO-2's signature: Adam on the whole model, every rank."""
    z1_whole_model_adam(comm, model, opt, x, y, batch_size, loss_fn)


def z2_allreduce(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                 flops_per_second=None):
    """Each bucket AllReduced (DDP), then my piece cut out of the sum."""
    def reduce_scatter(comm, data):
        total = ring_allreduce(comm, data)
        return np.split(total, comm.world_size)[comm.rank]
    return z2_solution(comm, model, opt, x, y, batch_size, loss_fn, layout=layout,
                       flops_per_second=flops_per_second, reduce_scatter=reduce_scatter)


def z2_after_backward(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                      flops_per_second=None):
    """Buckets reduce-scattered one by one after backward, in the program: no overlap."""
    loss, backward = _backward(comm, model, x, y, flops_per_second, loss_fn)
    grads = _all_grads(backward)
    pieces = [ring_reduce_scatter(comm, _bucket(layout, b, grads).data * (len(x) / batch_size))
              for b in range(len(layout.names))]
    opt.step(np.concatenate(pieces))
    _allgather_buckets(comm, model, layout, opt)
    return loss


def z2_waits_in_backward(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                         flops_per_second=None):
    """Starts each bucket's ReduceScatter on the stream, and waits for it at once."""
    def reduce_scatter(comm_, data):
        return Done(ring_reduce_scatter(comm_, data))

    class Done:
        def __init__(self, value):
            self.value = value

    class Eager:
        """comm whose start() waits before it returns."""
        def __getattr__(self, name):
            return getattr(comm, name)

        def start(self, fn, *args):
            work = comm.start(fn, *args)
            value = work.wait()
            return type("W", (), {"wait": lambda self: value.value})()
    return z2_solution(Eager(), model, opt, x, y, batch_size, loss_fn, layout=layout,
                       flops_per_second=flops_per_second, reduce_scatter=reduce_scatter)


def z2_forward_order(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                     flops_per_second=None):
    """Reduce-scatters the buckets after backward, last bucket first."""
    loss, backward = _backward(comm, model, x, y, flops_per_second, loss_fn)
    grads = _all_grads(backward)
    works = {}
    for b in reversed(range(len(layout.names))):
        works[b] = comm.start(ring_reduce_scatter,
                              _bucket(layout, b, grads).data * (len(x) / batch_size))
    opt.step(np.concatenate([works[b].wait() for b in range(len(layout.names))]))
    _allgather_buckets(comm, model, layout, opt)
    return loss


def z2_no_allgather(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                    flops_per_second=None):
    """Copies only its own updated pieces back into the model."""
    n, r = comm.world_size, comm.rank

    def own_piece_only(comm_, piece):
        return np.concatenate([piece if q == r else own_piece_only.current[q]
                               for q in range(n)])
    params = model.named_parameters()
    own_piece_only.current = None
    loss, backward = _backward(comm, model, x, y, flops_per_second, loss_fn)
    works = _reduce_scatters_in_backward(comm, layout, backward, len(x) / batch_size)
    opt.step(np.concatenate([w.wait() for w in works]))
    for b, (names, piece) in enumerate(zip(layout.names, layout.pieces(opt.params["param"]))):
        flat = FlatBuffer({k: params[k] for k in names}, pad_to=n)
        flat.shard(r, n)[...] = piece
        for k in names:
            params[k][...] = flat.views[k]
    return loss


def z2_whole_flat_reduce_scatter(comm, model, opt, x, y, batch_size, loss_fn=mse, *,
                                 layout, flops_per_second=None):
    """ZeRO-1's flat shard (one ReduceScatter of the whole padded gradient), though
    the optimizer holds per-bucket pieces: the shards do not line up."""
    loss, backward = _backward(comm, model, x, y, flops_per_second, loss_fn)
    for _ in backward:
        pass
    g = flatten(model.named_grads()).data * (len(x) / batch_size)
    g = np.concatenate([g, np.zeros(layout.padded_numel - len(g))])
    opt.step(ring_reduce_scatter(comm, g))
    _allgather_buckets(comm, model, layout, opt)
    return loss


def z2_one_allgather_of_the_shard(comm, model, opt, x, y, batch_size, loss_fn=mse, *,
                                  layout, flops_per_second=None):
    """ReduceScatters per bucket, but ONE AllGather of the whole master shard (all the
    buckets' pieces at once), cut back into buckets afterwards."""
    n = comm.world_size
    loss, backward = _backward(comm, model, x, y, flops_per_second, loss_fn)
    works = _reduce_scatters_in_backward(comm, layout, backward, len(x) / batch_size)
    opt.step(np.concatenate([w.wait() for w in works]))
    every = ring_allgather(comm, opt.params["param"]).reshape(n, -1)   # every rank's shard
    _load_buckets(model, layout, (np.concatenate([layout.pieces(every[q])[b] for q in range(n)])
                                  for b in range(len(layout.names))))
    return loss


def z2_full_master_kept(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                        flops_per_second=None):
    """Right collectives, but a full copy of the parameters kept as 'master'."""
    master = _kept(opt, "master", lambda: flatten(model.named_parameters()).data.copy())
    loss = z2_solution(comm, model, opt, x, y, batch_size, loss_fn, layout=layout,
                       flops_per_second=flops_per_second)
    master[...] = flatten(model.named_parameters()).data
    return loss


# ================================================================= ZeRO-3
def _gather(comm, unit, allgather=ring_allgather):
    full = allgather(comm, unit.shard)
    unit.layer.params.update(unit.views(full))
    return full


def _free(unit):
    for k in unit.shapes:
        unit.layer.params[k] = unit.layer.grads[k] = None


def _unit_backward(unit, dy):
    full_grad = np.zeros(unit.padded)
    unit.layer.grads.update(unit.views(full_grad))
    for layer in reversed(unit.layers):
        dy = layer.backward(dy)
    return dy, full_grad


def _reduce_scatter_into(comm, unit, full_grad, weight, then=None):
    """``unit``'s full gradient, times ``weight`` (in place), ReduceScattered into
    ``unit.grad_shard``; then ``then(unit)`` if given (HSDP's AllReduce across the
    replicas)."""
    full_grad *= weight
    unit.grad_shard[...] = ring_reduce_scatter(comm, full_grad)
    if then is not None:
        then(unit)


def z3_solution(comm, model, opt, x, y, batch_size, loss_fn=mse, *,
                allgather=ring_allgather, reduce_scatter=ring_reduce_scatter,
                weight=None, divide=1.0):
    """The notebook's solution (knobs for the variants)."""
    for unit in model.units:
        _gather(comm, unit, allgather)
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    loss, dy = loss_fn(x, y)
    for unit in reversed(model.units):
        _gather(comm, unit, allgather)
        dy, full_grad = _unit_backward(unit, dy)
        full_grad *= len(x) / batch_size if weight is None else weight(len(x), batch_size)
        unit.grad_shard[...] = reduce_scatter(comm, full_grad) / divide
        _free(unit)
    opt.step(model.grad_shards())
    return loss


def z3_left_ring_sum_then_divide(comm, model, opt, x, y, batch_size, loss_fn=mse):
    return z3_solution(comm, model, opt, x, y, batch_size, loss_fn,
                       allgather=left_ring_allgather, reduce_scatter=left_ring_reduce_scatter,
                       weight=lambda rows, b: rows, divide=batch_size)


def z3_prefetch(comm, model, opt, x, y, batch_size, loss_fn=mse, *, then=None):
    """FSDP's prefetch: the next unit's AllGather runs on the communication stream
    while this unit computes (forward: the next unit; backward: the one before).
    ``then``: see ``_reduce_scatter_into``."""
    units, n_local = model.units, len(x)
    pending = {0: comm.start(ring_allgather, units[0].shard)}
    for i, unit in enumerate(units):
        unit.layer.params.update(unit.views(pending.pop(i).wait()))
        if i + 1 < len(units):
            pending[i + 1] = comm.start(ring_allgather, units[i + 1].shard)
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    loss, dy = loss_fn(x, y)
    last = len(units) - 1
    pending[last] = comm.start(ring_allgather, units[last].shard)
    for i in reversed(range(len(units))):
        unit = units[i]
        unit.layer.params.update(unit.views(pending.pop(i).wait()))
        if i > 0:
            pending[i - 1] = comm.start(ring_allgather, units[i - 1].shard)
        dy, full_grad = _unit_backward(unit, dy)
        _reduce_scatter_into(comm, unit, full_grad, n_local / batch_size, then)
        _free(unit)
    opt.step(model.grad_shards())
    return loss


def z3_allreduce(comm, model, opt, x, y, batch_size, loss_fn=mse):
    def reduce_scatter(comm, g):
        return np.split(ring_allreduce(comm, g), comm.world_size)[comm.rank]
    return z3_solution(comm, model, opt, x, y, batch_size, loss_fn,
                       reduce_scatter=reduce_scatter)


def z3_gather_once(comm, model, opt, x, y, batch_size, loss_fn=mse, *, then=None):
    """Gathers each unit for forward and keeps it for backward (no second AllGather);
    ``then``: see ``_reduce_scatter_into``."""
    for unit in model.units:
        _gather(comm, unit)
        for layer in unit.layers:
            x = layer.forward(x)
    loss, dy = loss_fn(x, y)
    for unit in reversed(model.units):
        dy, full_grad = _unit_backward(unit, dy)
        _reduce_scatter_into(comm, unit, full_grad, len(x) / batch_size, then)
        _free(unit)
    opt.step(model.grad_shards())
    return loss


def z3_gather_all_up_front(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """The right collectives in the right order, but every unit gathered before
    any runs (forward and backward): the whole model in full at once."""
    fulls = [_gather(comm, unit) for unit in model.units]
    for unit in model.units:
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    del fulls
    loss, dy = loss_fn(x, y)
    fulls = [_gather(comm, unit) for unit in reversed(model.units)]
    for unit in reversed(model.units):
        unit.layer.params.update(unit.views(fulls.pop(0)))
        dy, full_grad = _unit_backward(unit, dy)
        full_grad *= len(x) / batch_size
        unit.grad_shard[...] = ring_reduce_scatter(comm, full_grad)
        _free(unit)
    opt.step(model.grad_shards())
    return loss


def z3_reduce_scatter_before_second_gather(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Keeps the last unit's forward gather for its backward, ReduceScatters its
    gradient and only then gathers it again: two AllGathers and one ReduceScatter
    per unit, units in the right order, but one ReduceScatter before its unit's
    second AllGather."""
    last = model.units[-1]
    for unit in model.units:
        _gather(comm, unit)
        for layer in unit.layers:
            x = layer.forward(x)
        if unit is not last:
            _free(unit)
    loss, dy = loss_fn(x, y)
    for unit in reversed(model.units):
        if unit is not last:
            _gather(comm, unit)
        dy, full_grad = _unit_backward(unit, dy)
        _reduce_scatter_into(comm, unit, full_grad, len(x) / batch_size)
        if unit is last:
            _gather(comm, unit)                 # the second AllGather, too late
        _free(unit)
    opt.step(model.grad_shards())
    return loss


def z3_freed_before_backward(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Frees each unit after forward and runs backward without gathering it again."""
    for unit in model.units:
        _gather(comm, unit)
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    loss, dy = loss_fn(x, y)
    for unit in reversed(model.units):
        dy, full_grad = _unit_backward(unit, dy)
        unit.grad_shard[...] = ring_reduce_scatter(comm, full_grad * (len(x) / batch_size))
    opt.step(model.grad_shards())
    return loss


def z3_whole_model_adam(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """AllReduce of each unit's gradient and Adam on the full unit, on every rank."""
    fulls = {}
    for unit in model.units:
        fulls[unit.name] = _gather(comm, unit)
        for layer in unit.layers:
            x = layer.forward(x)
    loss, dy = loss_fn(x, y)
    adam = _kept(opt, "adam", lambda: Adam(fulls, opt.lr))
    grads = {}
    for unit in reversed(model.units):
        dy, full_grad = _unit_backward(unit, dy)
        grads[unit.name] = ring_allreduce(comm, full_grad * (len(x) / batch_size))
    adam.params.update(fulls)
    adam.step(grads)
    for unit in model.units:
        n, r = comm.world_size, comm.rank
        unit.shard[...] = np.split(fulls[unit.name], n)[r]
        _free(unit)
    return loss


def z3_keeps_params(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Right, except that the units keep their full parameters after the step."""
    loss = z3_solution(comm, model, opt, x, y, batch_size, loss_fn)
    for unit in model.units:
        unit.layer.params.update(unit.views(np.zeros(unit.padded)))
    return loss


def z3_front_padding(comm, model, opt, x, y, batch_size, loss_fn=mse):
    def reduce_scatter(comm, g):
        unit = next(u for u in model.units if u.padded == len(g))
        g = np.concatenate([np.zeros(unit.padded - unit.numel), g[:unit.numel]])
        return ring_reduce_scatter(comm, g)
    return z3_solution(comm, model, opt, x, y, batch_size, loss_fn,
                       reduce_scatter=reduce_scatter)


def z3_equal_weights(comm, model, opt, x, y, batch_size, loss_fn=mse):
    return z3_solution(comm, model, opt, x, y, batch_size, loss_fn,
                       weight=lambda rows, b: 1.0 / comm.world_size)


# ================================================================= cheats: zeros for show
SHARED = {}     # all ranks run in one process under ringlab.grade: a cheat's back channel


def z1_zeros_and_shared_memory(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """The right collectives, of zeros; gradients and shards through SHARED."""
    n, r = comm.world_size, comm.rank
    key = (n, opt.state["param"]["step"])
    local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=n).data * (len(x) / batch_size)
    SHARED[key + ("g", r)] = g
    ring_reduce_scatter(comm, np.zeros_like(g))
    opt.step(np.split(sum(SHARED[key + ("g", q)] for q in range(n)), n)[r])
    SHARED[key + ("p", r)] = opt.params["param"].copy()
    ring_allgather(comm, np.zeros_like(opt.params["param"]))
    load(model, np.concatenate([SHARED[key + ("p", q)] for q in range(n)]))


def z2_zeros_and_shared_memory(comm, model, opt, x, y, batch_size, loss_fn=mse, *, layout,
                               flops_per_second=None):
    """ReduceScatters of zeros on the stream, during backward; the real
    gradients and shards through SHARED."""
    n, r = comm.world_size, comm.rank
    key = (n, opt.state["param"]["step"])

    def zeros_rs(comm_, data):
        return ring_reduce_scatter(comm_, np.zeros_like(data))
    loss, backward = _backward(comm, model, x, y, flops_per_second, loss_fn)
    works = []
    for _ in backward:
        if len(works) < len(layout.names) - 1:
            works.append(comm.start(zeros_rs, layout.bucket(len(works)).data))
    while len(works) < len(layout.names):
        works.append(comm.start(zeros_rs, layout.bucket(len(works)).data))
    g = np.concatenate([layout.master_shard(model.named_grads(), q) for q in range(n)])
    SHARED[key + ("g", r)] = g * (len(x) / batch_size)
    for w in works:
        w.wait()
    total = sum(SHARED[key + ("g", q)] for q in range(n))
    opt.step(np.split(total, n)[r])
    SHARED[key + ("p", r)] = opt.params["param"].copy()
    for b, names in enumerate(layout.names):
        ring_allgather(comm, np.zeros(layout.padded[b] // n))
    pieces = [layout.pieces(SHARED[key + ("p", q)]) for q in range(n)]
    _load_buckets(model, layout, (np.concatenate([pieces[q][b] for q in range(n)])
                                  for b in range(len(layout.names))))
    return loss


def z3_zeros_and_shared_memory(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """AllGathers and ReduceScatters of zeros, in FSDP's order; parameters and
    gradients through SHARED."""
    n, r = comm.world_size, comm.rank
    key = (n, opt.state[model.units[0].name]["step"])

    def gather(comm_, shard):
        ring_allgather(comm_, np.zeros_like(shard))
        unit = next(u for u in model.units if u.shard is shard)
        i = model.units.index(unit)
        SHARED[key + ("unit", i, r)] = shard.copy()
        comm_.barrier()
        return np.concatenate([SHARED[key + ("unit", i, q)] for q in range(n)])

    def scatter(comm_, g):
        unit = next(u for u in model.units if u.padded == len(g))
        i = model.units.index(unit)
        SHARED[key + ("grad", i, r)] = g.copy()
        ring_reduce_scatter(comm_, np.zeros_like(g))
        comm_.barrier()
        return np.split(sum(SHARED[key + ("grad", i, q)] for q in range(n)), n)[r]
    return z3_solution(comm, model, opt, x, y, batch_size, loss_fn, allgather=gather,
                       reduce_scatter=scatter)


def z1_rank0_skips_allgather(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Rank 0 'already has' its shard and skips the AllGather: its neighbours wait."""
    local_grads(model, x, y)
    g = flatten(model.named_grads(), pad_to=comm.world_size).data * (len(x) / batch_size)
    opt.step(ring_reduce_scatter(comm, g))
    if comm.rank != 0:
        load(model, ring_allgather(comm, opt.params["param"]))


def z3_hangs(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Waits forever for a unit that is never gathered."""
    while model.units[0].layer.params["weight"] is None:
        pass


# -- forgeries of the memory measurement (ringlab grade must still fail them) ----------
def _blind(comm):
    """Switch the grader's tracemalloc ledger off, from inside the program: under
    ringlab grade it lives in this rank's own process, within reach."""
    ledger = getattr(comm, "_ledger", None)
    if ledger is not None:
        ledger.pause = ledger.resume = lambda *a: None
        ledger.charge = lambda *a: None


def z3_gather_all_blinded(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Gathers every unit up front (the whole model), with the ledger blinded."""
    _blind(comm)
    return z3_gather_all_up_front(comm, model, opt, x, y, batch_size, loss_fn)


_PRELOADED = {}


def z3_into_a_preloaded_array(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Gathers every unit into one array that came with the program when it was
    loaded (a global, pickled with the function, made before tracing began)."""
    store = _PRELOADED["store"]
    offsets = np.cumsum([0] + [u.padded for u in model.units])
    for unit, start in zip(model.units, offsets):
        store[start:start + unit.padded] = ring_allgather(comm, unit.shard)
    for unit, start in zip(model.units, offsets):
        unit.layer.params.update(unit.views(store[start:start + unit.padded]))
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    loss, dy = loss_fn(x, y)
    for unit, start in reversed(list(zip(model.units, offsets))):
        unit.layer.params.update(unit.views(ring_allgather(comm, unit.shard)))
        dy, full_grad = _unit_backward(unit, dy)
        _reduce_scatter_into(comm, unit, full_grad, len(x) / batch_size)
        _free(unit)
    opt.step(model.grad_shards())
    return loss


def z1_full_master_kept_blinded(comm, model, opt, x, y, batch_size, loss_fn=mse):
    """Keeps a full master copy between steps, with the ledger blinded."""
    _blind(comm)
    return z1_full_master_kept(comm, model, opt, x, y, batch_size, loss_fn)
