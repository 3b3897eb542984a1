"""Right, wrong and cheating programs for the ``hsdp_step`` grader
(tests/grading/frontier/test_grade_hsdp_step.py). Each wrong one makes one
mistake: a collective over all ranks, the groups swapped, the replica
AllReduce forgotten or done first, every unit gathered at once, the batch
scaled wrongly."""

import numpy as np

from ringlab.collectives import ring_allgather, ring_allreduce, ring_reduce_scatter
from ringlab.frontier.hsdp import hsdp_step as reference_step
from ringlab.nn import mse
from ringlab.zero import zero3_step

# ZeRO-3's unit helpers: HSDP is ZeRO-3 inside each shard group
from programs.zero import (_free, _gather, _reduce_scatter_into, _unit_backward as _backward,
                           z3_gather_once, z3_prefetch)

KEPT = {}       # what a cheat keeps between steps: id(opt) -> (opt, {unit name: full})


def _forward(group, units, x, gather=None):
    for unit in units:
        (gather or _gather)(group, unit)
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    return x


def _shard_group_only(shard, model, x, y, batch_size):
    """ZeRO-3's forward and backward in the shard group, each unit's gradient
    ReduceScattered there and nothing more (no replica AllReduce, no Adam): the loss."""
    loss, dy = mse(_forward(shard, model.units, x), y)
    for unit in reversed(model.units):
        _gather(shard, unit)
        dy, grad = _backward(unit, dy)
        _reduce_scatter_into(shard, unit, grad, len(x) / batch_size)
        _free(unit)
    return loss


def solution(comm, mesh, model, opt, x, y, batch_size, *, sync=None, weight=None, after=1.0,
             gather=None):
    """The notebook's solution; ``sync(mesh, unit, grad)`` replaces the two
    gradient collectives, ``weight`` the batch weight, ``after`` divides the
    synced shard, ``gather(group, unit)`` the AllGather."""
    shard, replicate = mesh.group("shard"), mesh.group("replicate")
    loss, dy = mse(_forward(shard, model.units, x, gather), y)
    for unit in reversed(model.units):
        (gather or _gather)(shard, unit)
        dy, grad = _backward(unit, dy)
        grad *= len(x) / batch_size if weight is None else weight(len(x), batch_size, mesh)
        if sync is None:
            unit.grad_shard[...] = ring_reduce_scatter(shard, grad)
            ring_allreduce(replicate, unit.grad_shard, out=unit.grad_shard)
        else:
            sync(mesh, unit, grad)
        unit.grad_shard /= after
        _free(unit)
    opt.step(model.grad_shards())
    return loss


# ------------------------------------------------------------------------ right
def sum_then_divide(comm, mesh, model, opt, x, y, batch_size):
    """Weights len(x) (row counts), divides the summed shard by batch_size."""
    return solution(comm, mesh, model, opt, x, y, batch_size,
                    weight=lambda rows, b, mesh: float(rows), after=batch_size)


def replicas_deferred(comm, mesh, model, opt, x, y, batch_size):
    """Backward with ReduceScatters only, then one AllReduce per unit, then Adam."""
    replicate = mesh.group("replicate")
    loss = _shard_group_only(mesh.group("shard"), model, x, y, batch_size)
    for unit in reversed(model.units):
        unit.grad_shard[...] = ring_allreduce(replicate, unit.grad_shard)
    opt.step(model.grad_shards())
    return loss


def prefetch(comm, mesh, model, opt, x, y, batch_size):
    """FSDP's prefetch in the shard group: the next unit's AllGather on the
    communication stream while this one computes; each unit's shard AllReduced
    across the replicas after its ReduceScatter."""
    replicate = mesh.group("replicate")
    return z3_prefetch(mesh.group("shard"), model, opt, x, y, batch_size, mse,
                       then=lambda unit: ring_allreduce(replicate, unit.grad_shard,
                                                        out=unit.grad_shard))


# ------------------------------------------------------------------------ wrong
def allreduce_world(comm, mesh, model, opt, x, y, batch_size):
    """An AllReduce of the whole gradient over all ranks, then my shard of it."""
    def sync(mesh, unit, grad):
        S, j = mesh.size("shard"), mesh.coord("shard")
        unit.grad_shard[...] = np.split(ring_allreduce(comm, grad), S)[j]
    return solution(comm, mesh, model, opt, x, y, batch_size, sync=sync)


def groups_swapped(comm, mesh, model, opt, x, y, batch_size):
    """ReduceScatter across the replicas, AllReduce inside the shard group."""
    def sync(mesh, unit, grad):
        unit.grad_shard[...] = ring_reduce_scatter(mesh.group("replicate"), grad)
        ring_allreduce(mesh.group("shard"), unit.grad_shard, out=unit.grad_shard)
    return solution(comm, mesh, model, opt, x, y, batch_size, sync=sync)


def allreduce_first(comm, mesh, model, opt, x, y, batch_size):
    """The whole gradient AllReduced across replicas, then ReduceScattered."""
    def sync(mesh, unit, grad):
        total = ring_allreduce(mesh.group("replicate"), grad)
        unit.grad_shard[...] = ring_reduce_scatter(mesh.group("shard"), total)
    return solution(comm, mesh, model, opt, x, y, batch_size, sync=sync)


def no_replica_allreduce(comm, mesh, model, opt, x, y, batch_size):
    """ZeRO-3 in the shard group only: the replicas never sum."""
    def sync(mesh, unit, grad):
        unit.grad_shard[...] = ring_reduce_scatter(mesh.group("shard"), grad)
    return solution(comm, mesh, model, opt, x, y, batch_size, sync=sync)


def divided_by_replicas(comm, mesh, model, opt, x, y, batch_size):
    """Averages over the replicas after the AllReduce (as if each were a mean)."""
    return solution(comm, mesh, model, opt, x, y, batch_size, after=mesh.size("replicate"))


def replica_batch_weight(comm, mesh, model, opt, x, y, batch_size):
    """Weighted by len(x) / (batch_size / R): the share of one replica's rows."""
    return solution(comm, mesh, model, opt, x, y, batch_size,
                    weight=lambda rows, b, mesh: rows * mesh.size("replicate") / b)


def equal_weights(comm, mesh, model, opt, x, y, batch_size):
    return solution(comm, mesh, model, opt, x, y, batch_size,
                    weight=lambda rows, b, mesh: 1.0 / comm.world_size)


def gather_once(comm, mesh, model, opt, x, y, batch_size):
    """Gathered for forward and kept for backward: one AllGather per unit."""
    replicate = mesh.group("replicate")
    return z3_gather_once(mesh.group("shard"), model, opt, x, y, batch_size, mse,
                          then=lambda unit: ring_allreduce(replicate, unit.grad_shard,
                                                           out=unit.grad_shard))


def gather_all_up_front(comm, mesh, model, opt, x, y, batch_size):
    """Right collectives, right order, but every unit gathered before any runs."""
    shard = mesh.group("shard")
    fulls = [ring_allgather(shard, u.shard) for u in model.units]
    for unit, full in zip(model.units, fulls):
        unit.layer.params.update(unit.views(full))
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    loss, dy = mse(x, y)
    fulls = [ring_allgather(shard, u.shard) for u in reversed(model.units)]
    for unit in reversed(model.units):
        unit.layer.params.update(unit.views(fulls.pop(0)))
        dy, grad = _backward(unit, dy)
        _reduce_scatter_into(shard, unit, grad, len(dy) / batch_size)
        ring_allreduce(mesh.group("replicate"), unit.grad_shard, out=unit.grad_shard)
        _free(unit)
    opt.step(model.grad_shards())
    return loss


# ------------------------------------------------------------------------ cheats
def calls_the_reference(comm, mesh, model, opt, x, y, batch_size):
    return reference_step(comm, mesh, model, opt, x, y, batch_size)


def calls_zero3(comm, mesh, model, opt, x, y, batch_size):
    """ZeRO-3's reference in the shard group."""
    return zero3_step(mesh.group("shard"), model, opt, x, y, batch_size)


def full_params_kept(comm, mesh, model, opt, x, y, batch_size):
    """Right collectives, but a full-size copy of every unit kept on every rank
    between steps (as a rank that holds the unsharded model would)."""
    loss = solution(comm, mesh, model, opt, x, y, batch_size)
    kept = KEPT.setdefault(id(opt), (opt, {}))[1]
    for unit in model.units:
        kept[unit.name] = unit.shard.copy().repeat(mesh.size("shard"))
    return loss


SHARED = {}     # what a cheat shares between ranks without messages (all in one process)


def zeros_and_shared_memory(comm, mesh, model, opt, x, y, batch_size):
    """FSDP's collectives in HSDP's groups, all of zeros; the parameters and the
    gradients pass through SHARED instead: the right numbers, no data sent."""
    n, r = comm.world_size, comm.rank
    S, j = mesh.size("shard"), mesh.coord("shard")
    key = (n, S, opt.state.get(model.units[0].name, {}).get("step", 0))
    shard, replicate = mesh.group("shard"), mesh.group("replicate")

    def gather(unit):
        ring_allgather(shard, np.zeros_like(unit.shard))
        i = model.units.index(unit)
        SHARED[key + ("p", i, r)] = unit.shard.copy()
        comm.barrier()
        unit.layer.params.update(unit.views(np.concatenate(
            [SHARED[key + ("p", i, r - j + q)] for q in range(S)])))
    for unit in model.units:
        gather(unit)
        for layer in unit.layers:
            x = layer.forward(x)
        _free(unit)
    loss, dy = mse(x, y)
    for unit in reversed(model.units):
        gather(unit)
        dy, grad = _backward(unit, dy)
        i = model.units.index(unit)
        SHARED[key + ("g", i, r)] = grad * (len(dy) / batch_size)
        part = ring_reduce_scatter(shard, np.zeros_like(grad))
        ring_allreduce(replicate, part)
        comm.barrier()
        unit.grad_shard[...] = np.split(sum(SHARED[key + ("g", i, q)] for q in range(n)), S)[j]
        _free(unit)
    opt.step(model.grad_shards())
    return loss


def own_shard_repeated(comm, mesh, model, opt, x, y, batch_size):
    """Every AllGather message holds the sender's own shard (real parameters, the
    right sizes and counts); the other shards come through SHARED."""
    n, r = comm.world_size, comm.rank
    S, j = mesh.size("shard"), mesh.coord("shard")
    key = (n, S, opt.state.get(model.units[0].name, {}).get("step", 0))

    def allgather(group, mine):
        i = next(k for k, u in enumerate(model.units) if u.shard is mine)
        SHARED.setdefault(key + ("p", i, r), []).append(mine.copy())
        for _ in range(S - 1):
            group.sendrecv(mine, (j + 1) % S, (j - 1) % S)
        comm.barrier()
        return np.concatenate([SHARED[key + ("p", i, r - j + q)][-1] for q in range(S)])

    def gather(group, unit):
        unit.layer.params.update(unit.views(allgather(group, unit.shard)))
    return solution(comm, mesh, model, opt, x, y, batch_size, gather=gather)


def bucketed_replicate_allreduce(comm, mesh, model, opt, x, y, batch_size):
    """A right HSDP step whose replicate AllReduce is one bucket of every unit's
    gradient shard, after backward (a red team's program): the grader reads one
    unit per AllReduce, and its hint says so."""
    replicate = mesh.group("replicate")
    loss = _shard_group_only(mesh.group("shard"), model, x, y, batch_size)
    flat = ring_allreduce(replicate, np.concatenate([u.grad_shard for u in model.units]))
    ends = np.cumsum([u.grad_shard.size for u in model.units])[:-1]
    for unit, part in zip(model.units, np.split(flat, ends)):
        unit.grad_shard[...] = part
    opt.step(model.grad_shards())
    return loss
