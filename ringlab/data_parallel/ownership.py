"""Who holds what in data parallelism, read off real runs and the library's own
objects, for ``ringlab.show.ownership.plot_who_holds_what``.

* ``replica_moment``: a ringlab program, one real ``sync_sgd_step``; each rank
  says what it held after its backward: the whole replica, the rows of the
  batch ``shard`` gave it, and its own gradient.
* ``bucket_holdings``: DDP's buckets as ``assign_buckets`` makes them, along
  the gradient in registration order, and each rank's own batch.
* ``one_rank_holdings``: before anything is split, one rank holds everything:
  parameters, gradients, Adam's moments and the activations forward keeps.
* ``ps_holdings``: a parameter server's run, from its log: the server's
  current version, and the version each worker computes its gradient from.
"""

import numpy as np

from ..nn import SGD, count_params, flatten, mlp_model
from ..show.ownership import Piece
from .buckets import BUCKET_CAP_BYTES, assign_buckets
from .sync_sgd import local_gradient, shard, sync_sgd_step


def replica_moment(comm, batch, *, sizes, seed=0, lr=0.1):
    """One ``sync_sgd_step`` of ``mlp_model(sizes)`` (from ``seed``, as
    ``data_parallel_sgd`` builds it) on my shard of ``batch = (x, y)``.
    Returns ``[Piece, ...]``, what this rank held after its backward, before
    the AllReduce: columns "parameters", "batch of B" (its rows, as ``shard``
    cuts them) and "gradient" (its mean over those rows)::

        >>> import numpy as np, ringlab
        >>> batch = (np.ones((10, 3)), np.ones((10, 2)))
        >>> res = ringlab.run(replica_moment, [batch] * 4, kwargs=dict(sizes=[3, 2]))
        >>> [(p.tensor, p.start, p.stop, p.text) for p in res.outputs[1]]
        [('parameters', 0.0, 1.0, 'W, 8 numbers'), ('batch of 10', 0.3, 0.6, '3-5'),\
 ('gradient', 0.0, 1.0, '$g_1$, mean of 3')]
    """
    r, p = comm.rank, comm.world_size
    x, y = batch
    model = mlp_model(list(sizes), np.random.default_rng(seed))
    rows = shard(np.arange(len(x)), r, p).tolist()
    xs, ys = shard(x, r, p), shard(y, r, p)
    n = count_params(model)
    local_gradient(model, xs, ys)
    held = [Piece("parameters", 0.0, flatten(model.named_parameters()).data.size / n,
                  "parameters", f"W, {n:,} numbers"),
            Piece(f"batch of {len(x)}", rows[0] / len(x), (rows[-1] + 1) / len(x), "data",
                  f"{rows[0]}-{rows[-1]}"),
            Piece("gradient", 0.0, flatten(model.named_grads()).data.size / n, "gradients",
                  f"$g_{r}$, mean of {len(rows)}")]
    sync_sgd_step(comm, model, SGD(model.named_parameters(), lr), xs, ys, len(x))
    return held


def bucket_holdings(params, batches, cap_bytes=BUCKET_CAP_BYTES, first_bucket_bytes=None):
    """``{rank: [Piece, ...]}`` under DDP for ``params`` (``named_parameters()``)
    and ``batches`` (rank r's ``(x, y)`` at ``batches[r]``): "parameters",
    the whole replica on every rank; "gradients, in buckets", the same on
    every rank: the gradient in registration order (layer 0 on the left), cut
    where ``assign_buckets(params, cap_bytes, first_bucket_bytes)`` cuts it,
    each bucket written with its number (0: the first backward fills, the
    last layers); "batch": rank r's rows of all the ranks' rows::

        >>> import numpy as np
        >>> from ringlab.nn import mlp_model
        >>> params = mlp_model([4, 4, 4], np.random.default_rng(0)).named_parameters()
        >>> h = bucket_holdings(params, [(np.ones((2, 4)), None)] * 2, cap_bytes=100)
        >>> [(p.text, p.start, p.stop) for p in h[0] if p.kind == "gradients"]
        [('0', 0.5, 1.0), ('1', 0.0, 0.5)]
    """
    buckets = assign_buckets(params, cap_bytes, first_bucket_bytes)
    total = sum(p.nbytes for p in params.values())
    start, at = {}, 0                       # each tensor's first byte, registration order
    for name, p in params.items():
        start[name], at = at, at + p.nbytes
    shared = [Piece("parameters", 0.0, at / total, "parameters", f"{total / 2**20:.2f} MiB")]
    for b, names in enumerate(buckets):     # a bucket's tensors sit side by side
        lo = min(start[n] for n in names)
        hi = max(start[n] + params[n].nbytes for n in names)
        shared.append(Piece("gradients, in buckets", lo / total, hi / total, "gradients", str(b)))
    rows = np.cumsum([0] + [len(x) for x, _ in batches])
    return {r: shared + [Piece("batch", rows[r] / rows[-1], rows[r + 1] / rows[-1], "data",
                               f"{rows[r + 1] - rows[r]} rows")]
            for r in range(len(batches))}


def activation_bytes(model):
    """Bytes of the arrays ``model``'s modules keep from their last forward for
    backward (the module attributes that are arrays; parameters and gradients
    live in ``params`` and ``grads``, not there)."""
    return sum(v.nbytes for _, m in model.named_modules() for v in vars(m).values()
               if isinstance(v, np.ndarray))


def _size(nbytes):
    if nbytes < 1e3:
        return f"{nbytes} B"
    return f"{nbytes / 1e3:.0f} kB" if nbytes < 1e6 else f"{nbytes / 1e6:.2f} MB"


def one_rank_holdings(model, opt, x):
    """``{0: [Piece, ...]}``: what one rank holds to train ``model`` with ``opt``
    (an ``Adam`` over its parameters) once ``model.forward(x)`` has run (it is
    run here): "parameters", "gradients", "Adam m, v" and "activations", all
    of each (nothing is split yet), written with their bytes::

        >>> import numpy as np
        >>> from ringlab.nn import Adam, mlp_model
        >>> m = mlp_model([4, 8, 2], np.random.default_rng(0))
        >>> h = one_rank_holdings(m, Adam(m.named_parameters()), np.ones((16, 4)))
        >>> [(p.tensor, p.text) for p in h[0]]          # 58 float64s
        [('parameters', '464 B'), ('gradients', '464 B'), ('Adam m, v', '928 B'),\
 ('activations', '3 kB')]
    """
    model.forward(x)
    held = {"parameters": ("parameters", model.named_parameters().values()),
            "gradients": ("gradients", model.named_grads().values()),
            "Adam m, v": ("optimizer", [s[k] for s in opt.state.values() for k in "mv"])}
    nbytes = {name: (kind, sum(a.nbytes for a in arrays))
              for name, (kind, arrays) in held.items()}
    nbytes["activations"] = ("activations", activation_bytes(model))
    return {0: [Piece(name, 0.0, 1.0, kind, _size(b)) for name, (kind, b) in nbytes.items()]}


def ps_holdings(log, version, workers):
    """``{rank: [Piece, ...]}`` of a parameter-server run (``log``: the server's
    ``(worker, version read)`` per applied gradient, in order) at the moment it
    has applied ``version`` gradients: rank 0 the current parameters; each of
    the ``workers`` (ranks 1..P) the copy it computes its next gradient from,
    and that gradient, written with the update it becomes and its staleness
    (none for a worker that has no gradient left)::

        >>> log = [(1, 0), (2, 0), (1, 1), (2, 2)]
        >>> [[p.text for p in ps] for ps in ps_holdings(log, 1, 2).values()]
        [['version 1'], ['version 1', 'update 2, τ = 1'], ['version 0', 'update 1, τ = 1']]
    """
    held = {0: [Piece("parameters", 0.0, 1.0, "master", f"version {version}")]}
    held.update({w: [] for w in range(1, workers + 1)})
    for i, (w, v) in enumerate(log[version:], start=version):
        if not held[w]:                # w's first gradient from here on: the one it computes
            held[w] = [Piece("parameters", 0.0, 1.0, "parameters", f"version {v}"),
                       Piece("gradient", 0.0, 1.0, "gradients", f"update {i}, τ = {i - v}")]
    return held
