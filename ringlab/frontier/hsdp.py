"""Hybrid sharding (HSDP, FSDP2 on a 2-D mesh): shard inside a node, replicate across nodes.

ZeRO-3 over all N ranks (``ringlab.zero.zero3``) gathers every unit from
everyone, so every AllGather and ReduceScatter crosses the slow links between
nodes. HSDP lays the N = R x S ranks out as a ``(replicate, shard)``
``DeviceMesh``: a row of S ranks (a node, say) shards the model as ZeRO-3
does, and the R rows are replicas of each other. Per unit and step:

* forward: AllGather the unit in the **shard** group (inside the node), run, free;
* backward: AllGather again, run backward, ReduceScatter the gradient in the
  **shard** group (my shard, summed over my node), then **AllReduce** that
  shard across the **replicate** group (the same shard on every node), free.

Adam then updates my 1/S of the model (rank (i, j) and every (i', j) hold shard
j). The step equals data-parallel Adam over all N ranks (each rank its own
samples); what changes is where the bytes go. Per step, for padded unit sizes
P_u (to a multiple of S) and Psi = sum_u P_u numbers of ``itemsize`` bytes
(``hsdp_bytes``):

* in each node: 3 (S-1)/S Psi per rank (ZeRO-3's 3 Psi, over S ranks);
* across nodes: 2 (R-1)/R Psi/S per rank, **2 (R-1) Psi in all**;

while ZeRO-3 on one ring of N ranks, node-major, crosses between nodes on R of
its N links, each carrying (N-1)/N of every AllGather and ReduceScatter: **3R
(N-1)/N Psi'** in all (Psi' padded to a multiple of N), every byte of it on the
R ranks at the nodes' edges (``zero3_cross_node_bytes``). The price is memory:
each rank holds 1/S of the parameters, gradients and Adam moments instead of
ZeRO-3's 1/N, R times as much.

``hsdp_step(comm, mesh, model, opt, x, y, batch_size)`` is one step (the
reference answer of the exercise of that name), ``hsdp_adam`` a training run.

    >>> import numpy as np, ringlab
    >>> from ringlab.zero import data_parallel_adam
    >>> data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2)
    >>> batches = [b for _, b in zip(range(3), data.batches(8))]
    >>> kw = dict(sizes=[4, 8, 2], seed=0, lr=0.01)
    >>> res = ringlab.run(hsdp_adam, [batches] * 4, kwargs=dict(kw, shape=(2, 2)))
    >>> ref = ringlab.run(data_parallel_adam, [batches] * 4, kwargs=kw)
    >>> bool(np.allclose(res.outputs[0][1], ref.outputs[0][1], rtol=0, atol=1e-12))
    True
    >>> sorted({(s.name, str(s.group).split("[")[0]) for s in res.trace.spans
    ...         if not s.path.startswith("full_parameters")})
    [('ring_allgather', 'shard'), ('ring_allreduce', 'replicate'), \
('ring_reduce_scatter', 'shard')]
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allreduce, ring_reduce_scatter
from ..data_parallel.sync_sgd import shard as batch_shard
from ..mesh import DeviceMesh
from ..nn import Adam, mlp_model, mse
from ..zero import ShardedModel
from ..zero.sharding import padded_size

NAMES = ("replicate", "shard")


@answer("hsdp_step")
def hsdp_step(comm, mesh, model, opt, x, y, batch_size, loss_fn=mse):
    """One hybrid-sharded step on this rank's samples ``(x, y)`` of a global batch
    of ``batch_size``. ``mesh``: a ``DeviceMesh`` with axes ``("replicate",
    "shard")``; ``model``: a ``ringlab.zero.ShardedModel`` built for the shard
    group (``rank=mesh.coord("shard")``, ``world_size=mesh.size("shard")``);
    ``opt``: an optimizer over ``model.masters()``. Returns the loss on my samples.

    Collectives, per unit: AllGather (shard group) before forward and again
    before backward, ReduceScatter (shard group) after backward, then AllReduce
    of the reduced shard (replicate group); one unit is full at a time, two
    while the next one's gather is prefetched (``model.prefetch``)."""
    shard, replicate = mesh.group("shard"), mesh.group("replicate")
    units, n_local = model.units, len(x)
    for i, unit in enumerate(units):                 # forward: gather, compute, free
        unit.unshard(shard)
        if model.prefetch and i + 1 < len(units):
            units[i + 1].prefetch(shard)
        x = unit.forward(shard, x)
        if model.reshard_after_forward:
            unit.reshard(shard)
    loss, dy = loss_fn(x, y)
    for i in reversed(range(len(units))):            # backward, last unit first
        unit = units[i]
        unit.unshard(shard)
        if model.prefetch and i > 0:
            units[i - 1].prefetch(shard)
        dy = unit.backward(shard, dy)
        # Weighted by my share of the batch: the sums below are the global mean.
        unit.full_grad *= n_local / batch_size
        unit.grad_shard[...] = ring_reduce_scatter(shard, unit.full_grad)   # inside my node
        ring_allreduce(replicate, unit.grad_shard, out=unit.grad_shard)    # across the nodes
        unit.reshard(shard)
    opt.step({u.name: u.grad_shard.astype(m.dtype, copy=False)
              for u, m in zip(units, model.masters().values())})
    for unit in units:
        if unit.master is not None:
            unit.shard[...] = unit.master
    return loss


def hsdp_adam(comm, batches, *, shape, sizes, seed, lr, prefetch=True,
              reshard_after_forward=True, compute_time=0.0, loss_fn=mse, **adam):
    """Train ``mlp_model(sizes)`` (from ``seed``) with ``hsdp_step`` and Adam on a
    ``shape = (R, S)`` mesh, each rank its shard of every global batch (data
    parallel over all R*S ranks, as ``data_parallel_adam``). Memory as
    ``zero3_adam``'s, for a shard of 1/S. Returns ``(losses, params)``, the full
    parameters gathered once at the end (span ``full_parameters``, shard group)."""
    mesh = DeviceMesh(comm, shape, NAMES)
    model = ShardedModel(mlp_model(sizes, np.random.default_rng(seed)), mesh.coord("shard"),
                         mesh.size("shard"), prefetch=prefetch,
                         reshard_after_forward=reshard_after_forward, compute_time=compute_time)
    opt = Adam(model.masters(), lr, **adam)
    for label in ("params", "grads", "adam.m", "adam.v"):
        comm.alloc(label, sum(s.nbytes for s in model.shards().values()))
    losses = []
    for x, y in batches:
        p, r = comm.world_size, comm.rank
        losses.append(hsdp_step(comm, mesh, model, opt, batch_shard(x, r, p),
                                batch_shard(y, r, p), len(x), loss_fn))
    return losses, model.full_parameters(mesh.group("shard"))


def hsdp_bytes(numels, R, S, itemsize=8):
    """Per step with FULL_SHARD: ``{"shard_per_rank", "replicate_per_rank",
    "cross_node_total"}``, the replicate dimension across nodes. ``numels``: the
    units' parameter counts. Per-rank replicate bytes are exact when R divides
    each shard's length (a ring AllReduce's chunks are then equal); the total
    always is.

    >>> hsdp_bytes([40, 18], R=2, S=2)      # Psi = 58: 3 * 1/2 * 58 * 8, 2 * 1/2 * 29 * 8
    {'shard_per_rank': 696, 'replicate_per_rank': 232, 'cross_node_total': 928}
    """
    psi = sum(padded_size(n, S) for n in numels)
    return {"shard_per_rank": 3 * (S - 1) * psi // S * itemsize,
            "replicate_per_rank": 2 * (R - 1) * (psi // S) // R * itemsize,
            "cross_node_total": 2 * (R - 1) * psi * itemsize}


def zero3_cross_node_bytes(numels, R, S, itemsize=8):
    """Bytes crossing nodes per step when ZeRO-3 runs its ring collectives over
    all N = R*S ranks, node-major (nodes of S ranks): R of the ring's links join
    two nodes (R >= 2), each carries (N-1) chunks of P_u/N of each of the 3
    collectives per unit.

    >>> zero3_cross_node_bytes([40, 18], R=2, S=2)   # 3 * 2 * 3/4 * 60 * 8
    2160
    """
    N = R * S
    if R == 1:
        return 0
    psi = sum(padded_size(n, N) for n in numels)
    return 3 * R * (N - 1) * psi // N * itemsize
