"""Timing a ringlab AllReduce against ``torch.distributed.all_reduce``.

    >>> from ringlab.backends.timing import measure               # doctest: +SKIP
    >>> measure(world_size=4, sizes=[1 << 20], repeats=5)         # doctest: +SKIP
    {1048576: {'ring': 0.0116, 'ring_copy': 0.0126, 'torch_ring': 0.011, 'torch': 0.0071, 'ok': True}}

The measuring program is itself a ringlab program run with
``backend="torch"``: on real processes a program may call
``torch.distributed`` directly, so both contenders run in the same,
already initialised process group and process start-up is never timed.

Bandwidths follow nccl-tests (``doc/PERFORMANCE.md``): for an AllReduce of
``S`` bytes taking ``t`` seconds on ``n`` ranks, algbw = S / t and
busbw = algbw * 2(n-1)/n, in GB/s with 1 GB = 1e9 bytes.
"""

import statistics
import time

import numpy as np

from ...collectives import ring_allreduce
from . import supervisor


def torch_ring_allreduce(t, rank, world_size):
    """The same ring, written straight in torch.distributed, in place: the
    baseline that shows what ringlab's own layer costs."""
    import torch
    import torch.distributed as dist

    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = list(torch.tensor_split(t, n))
    for k in range(2 * (n - 1)):
        send_c, recv_c = (rank - k) % n, (rank - k - 1) % n
        got = torch.empty_like(chunks[recv_c])
        req = dist.isend(chunks[send_c], right)
        dist.recv(got, left)
        req.wait()
        if k < n - 1:
            chunks[recv_c] += got
        else:
            chunks[recv_c].copy_(got)
    return t


def time_rank(comm, seed, sizes, repeats):
    """One rank: per size, ``repeats`` timings of ringlab's ``ring_allreduce``,
    of the same ring in plain torch and of ``dist.all_reduce``, on the same
    float32 vector, each after a barrier."""
    import torch
    import torch.distributed as dist

    contenders = {
        # In place, as dist.all_reduce works: the like-for-like comparison.
        "ring": lambda x: ring_allreduce(comm, x, out=x),
        "ring_copy": lambda x: ring_allreduce(comm, x),      # the sum in a new array
        "torch_ring": lambda x: torch_ring_allreduce(torch.from_numpy(x), comm.rank, comm.world_size),
        "torch": lambda x: dist.all_reduce(torch.from_numpy(x)),
    }
    out = {}
    for nbytes in sizes:
        x = np.random.default_rng([seed, comm.rank]).standard_normal(nbytes // 4).astype(np.float32)
        ours, mine, theirs = ring_allreduce(comm, x), x.copy(), x.copy()   # warm-up, and the check below
        ring_allreduce(comm, mine, out=mine)
        dist.all_reduce(torch.from_numpy(theirs))
        ok = all(np.allclose(a, theirs, rtol=1e-4, atol=1e-4) for a in (ours, mine))
        out[nbytes] = {"ok": ok, **{name: [] for name in contenders}}
        # Take turns, so that a busy moment of the machine hits all three alike.
        for _ in range(repeats):
            for name, fn in contenders.items():
                y = x.copy()                       # most contenders work in place
                dist.barrier()
                t0 = time.perf_counter()
                fn(y)
                out[nbytes][name].append(time.perf_counter() - t0)
    return out


def measure(world_size=4, sizes=(1 << 20, 16 << 20, 64 << 20), repeats=5, seed=0, timeout=600):
    """``{nbytes: {"ring": s, "ring_copy": s, "torch_ring": s, "torch": s, "ok": bool}}``:
    the median over ``repeats`` of each repetition's slowest rank, for ringlab's
    ring in place (``out=x``) and into a new array, the same ring in plain
    torch, and ``dist.all_reduce``; ``ok`` says ringlab's sum agrees with torch's."""
    res = supervisor.run("gloo", time_rank, [seed] * world_size, args=(list(sizes), repeats),
                         timeout=timeout)
    table = {}
    for nbytes in sizes:
        per_rank = [r[nbytes] for r in res.outputs]
        table[nbytes] = {k: statistics.median(max(r[k][i] for r in per_rank) for i in range(repeats))
                         for k in ("ring", "ring_copy", "torch_ring", "torch")}
        table[nbytes]["ok"] = all(r["ok"] for r in per_rank)
    return table


def bandwidths(nbytes, seconds, world_size):
    """``(algbw, busbw)`` in GB/s of an AllReduce of ``nbytes`` in ``seconds``.

    >>> bandwidths(4e9, 2.0, 4)
    (2.0, 3.0)
    """
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size
