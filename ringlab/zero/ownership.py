"""Who holds what under ZeRO, read off the library's own objects and runs,
for ``ringlab.show.ownership.plot_who_holds_what``.

``stage_holdings`` reads, from the memory each stage's run recorded, which of
the model states (parameters, gradients, master weights, Adam's m and v) a
rank keeps whole and which only its shard of: one bar per stage, the states
side by side in proportion to their bytes (see its docstring).

``zero3_moment`` runs one real ``zero3_step`` and stops to look at the moment
one unit has computed: every bar is the model's flat parameters, padded, unit
after unit (FSDP's ``FlatParameter`` of each), and a rank's pieces are read
from its ``ShardedModel``: its shard of every unit, the units whose full
parameters it holds (gathered, or on their way by prefetch), the full gradients
it holds, and its Adam moments::

    >>> import numpy as np, ringlab
    >>> batch = (np.ones((8, 4)), np.ones((8, 2)))
    >>> res = ringlab.run(zero3_moment, [batch] * 4, kwargs=dict(sizes=[4, 8, 2]))
    >>> [(p.tensor, p.kind, round(p.start, 3), round(p.stop, 3)) for p in res.outputs[1]][:3]
    [('parameters', 'gathered', 0.0, 0.667), ('parameters', 'parameters', 0.167, 0.333),\
 ('gradients', 'gradients', 0.167, 0.333)]

Units of 40 and 18 (+2 of padding) numbers, 60 in all: rank 1 keeps numbers
10-19 of unit 0 and holds all of it, prefetched, while unit 1's backward runs.
"""

import numpy as np

from ..data_parallel.sync_sgd import shard
from ..nn import Adam, mlp_model
from ..show.ownership import Piece
from .sharding import padded_size, shard_range
from .zero3 import ShardedModel, zero3_step

# The model states' memory labels, as every stage's program records them.
STATE_KINDS = {"params": "parameters", "grads": "gradients", "master": "master",
               "adam.m": "optimizer", "adam.v": "optimizer"}

COLUMNS = ("parameters", "gradients", "Adam m, v")


def zero3_holdings(model, opt=None):
    """``[Piece, ...]``: what this rank of ``model`` (a ``ShardedModel``) holds
    now, in the ``COLUMNS`` "parameters", "gradients" and (given ``opt``, an
    ``Adam`` over its shards) "Adam m, v"; each a bar over the padded units
    one after the other. Full parameters count from the start of their
    AllGather (a prefetch's too), as their memory does."""
    total = sum(u.padded for u in model.units)
    pieces, at = [], 0
    for u in model.units:
        k = len(u.shard)
        unit = (at / total, (at + u.padded) / total)
        mine = ((at + u.rank * k) / total, (at + (u.rank + 1) * k) / total)
        if u.full is not None or u._prefetch is not None:
            pieces.append(Piece("parameters", *unit, "gathered"))
        pieces.append(Piece("parameters", *mine, "parameters"))
        if u.full_grad is not None:
            pieces.append(Piece("gradients", *unit, "full gradients"))
        pieces.append(Piece("gradients", *mine, "gradients"))
        if opt is not None and len(opt.state[u.name]["m"]) == k:
            pieces.append(Piece("Adam m, v", *mine, "optimizer"))
        at += u.padded
    return pieces


def zero3_moment(comm, batch, *, sizes, unit=-1, phase="backward", seed=0, **options):
    """One ``zero3_step`` of ``mlp_model(sizes)`` on my shard of ``batch``;
    returns ``zero3_holdings`` at the moment unit ``unit`` (an index) has run
    its ``phase`` ("forward" or "backward"; before the backward's
    ReduceScatter). ``options``: ``ShardedModel``'s (``prefetch``, ...)."""
    r, p = comm.rank, comm.world_size
    model = ShardedModel(mlp_model(list(sizes), np.random.default_rng(seed)), r, p,
                         **options)
    opt = Adam(model.shards(), lr=0.01)
    target, seen = model.units[unit], []
    run = getattr(target, phase)

    def look(comm, z):
        out = run(comm, z)
        seen.append(zero3_holdings(model, opt))
        return out

    setattr(target, phase, look)
    x, y = batch
    zero3_step(comm, model, opt, shard(x, r, p), shard(y, r, p), len(x))
    return seen[0]


def stage_holdings(traces, numel):
    """``{rank: [Piece, ...]}``, one column per entry of ``traces`` (``{name:
    trace}`` of runs of one model of ``numel`` parameters, the first of them
    data parallelism, which keeps everything whole): a bar of the model
    states that DP's run holds at its end, each state as wide as its bytes;
    a stage's piece of a state is the whole state, or rank r's shard of it
    (``shard_range``), as its run's memory at the end says. A state held in
    another amount is an error.

        >>> import numpy as np, ringlab
        >>> from ringlab.zero import data_parallel_adam, zero1_adam
        >>> kw = dict(sizes=[4, 8, 2], seed=0, lr=0.01)        # 58 numbers, padded to 60
        >>> traces = {name: ringlab.run(program, [[]] * 4, kwargs=kw).trace
        ...           for name, program in (("DP", data_parallel_adam), ("ZeRO-1", zero1_adam))}
        >>> [(p.tensor, p.kind, round(p.start, 3), round(p.stop, 3))
        ...  for p in stage_holdings(traces, 58)[1] if p.tensor == "ZeRO-1"][1:3]
        [('ZeRO-1', 'gradients', 0.25, 0.5), ('ZeRO-1', 'optimizer', 0.562, 0.625)]

    In float64 there is no separate master: params, grads, m and v, a quarter
    of the bar each; rank 1 keeps numbers 15-29 of the 60 of m (and of v).
    """
    whole = next(iter(traces.values()))
    n = whole.world_size
    holdings = {}
    for r in range(n):
        full = {k: b for k, b in whole.memory_by_label(r, float("inf")).items()
                if k in STATE_KINDS}
        total, (a, b) = sum(full.values()), shard_range(numel, r, n)
        holdings[r] = []
        for name, trace in traces.items():
            held, at = trace.memory_by_label(r, float("inf")), 0.0
            for label, nbytes in full.items():
                width, got = nbytes / total, held.get(label, 0)
                if got == nbytes:
                    part = (0.0, 1.0)
                elif got * numel == nbytes * (b - a):        # my shard, padding included
                    part = (a / padded_size(numel, n), b / padded_size(numel, n))
                else:
                    raise ValueError(f"{name}, rank {r}: {label} holds {got} bytes, neither "
                                     f"all {nbytes} nor a shard of {(b - a)}/{numel} of them")
                holdings[r].append(Piece(name, at + width * part[0], at + width * part[1],
                                         STATE_KINDS[label]))
                at += width
    return holdings
