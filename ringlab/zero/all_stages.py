"""DP and the three ZeRO stages side by side: the same training, four programs.

``run_stages`` trains one model with ``data_parallel_adam``, ``zero1_adam``,
``zero2_adam`` and ``zero3_adam`` on ``ringlab.run``, with simulated compute
and network time, so that each run's memory events form a timeline over its
steps. ``comm_per_step`` reads back from a trace the bytes each rank sent per
training step, collective by collective: what ``accounting`` predicts.

    >>> import numpy as np, ringlab
    >>> data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=8, out=8)
    >>> batches = [b for _, b in zip(range(2), data.batches(16))]
    >>> runs = run_stages([8] + [32] * 6 + [8], batches, 4)
    >>> {name: res.trace.peak_memory(0) for name, res in runs.items()}
    {'DP': 186624, 'ZeRO-1': 128304, 'ZeRO-2': 104064, 'ZeRO-3': 72000}
    >>> comm_per_step(runs["ZeRO-3"].trace, steps=2)[0]     # 3/4 of 5832 numbers, 8 bytes
    {'ring_allgather': 69984, 'ring_reduce_scatter': 34992}

In the book, one line draws them: ``plot_memory_side_by_side({name:
res.trace for name, res in runs.items()})`` (``ringlab.show.memory``).
"""

from collections import defaultdict

import numpy as np

from ..data_parallel.sync_sgd import shard
from ..runner import run
from ..cost.alpha_beta import AlphaBeta
from .reference import data_parallel_adam
from .zero1 import zero1_adam
from .zero2 import zero2_adam
from .zero3 import zero3_adam

STAGE_NAMES = {"dp": "DP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def unit_compute_times(sizes, local_batch, flops_per_second):
    """Seconds of each ``Linear``'s forward on ``local_batch`` samples: the
    ``compute_time`` per unit that ``zero3_adam`` takes, matching the
    ``flops_per_second`` of the other stages (2 x rows x in x out flops)."""
    return [2 * local_batch * n_in * n_out / flops_per_second
            for n_in, n_out in zip(sizes[:-1], sizes[1:])]


def run_stages(sizes, batches, n, *, seed=0, lr=1e-3, dtype=np.float64, master_dtype=None,
               flops_per_second=1e9, network=None, cap_bytes=None, prefetch=True,
               backend="sim"):
    """Train ``mlp_model(sizes)`` on ``batches`` over ``n`` ranks with DP,
    ZeRO-1, ZeRO-2 and ZeRO-3: ``{"DP": result, "ZeRO-1": ..., "ZeRO-2": ...,
    "ZeRO-3": ...}``, each a ``ringlab.run`` result. Compute is timed at
    ``flops_per_second`` (ZeRO-3: per unit, for rank 0's share of the first
    batch); ``network`` prices messages (default ``AlphaBeta(1e-6, 1e-9)``).
    ``cap_bytes``: ZeRO-2's bucket size, by default an eighth of the model's
    bytes (DDP's 25 MiB would hold a small model in one bucket, and a bucket
    that holds all the gradients saves nothing); ``prefetch``: ZeRO-3's."""
    network = network or AlphaBeta(alpha=1e-6, beta=1e-9)
    if cap_bytes is None:
        numel = sum((n_in + 1) * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:]))
        cap_bytes = numel * np.dtype(dtype).itemsize // 8
    common = dict(sizes=sizes, seed=seed, lr=lr, dtype=dtype, master_dtype=master_dtype)
    local = len(shard(batches[0][0], 0, n)) if batches else 0
    programs = {
        "DP": (data_parallel_adam, dict(flops_per_second=flops_per_second)),
        "ZeRO-1": (zero1_adam, dict(flops_per_second=flops_per_second)),
        "ZeRO-2": (zero2_adam, dict(flops_per_second=flops_per_second, cap_bytes=cap_bytes)),
        "ZeRO-3": (zero3_adam, dict(prefetch=prefetch, compute_time=unit_compute_times(
            sizes, local, flops_per_second))),
    }
    return {name: run(program, [batches] * n, kwargs=dict(common, **extra), network=network,
                      backend=backend)
            for name, (program, extra) in programs.items()}


def comm_per_step(trace, steps, *, skip=("full_parameters",)):
    """``{rank: {collective: bytes sent per training step}}`` over a run of
    ``steps`` training steps; a message counts toward the innermost span it was
    sent in ("ring_allgather", ...). Spans under a name in ``skip`` are left
    out (``zero3_adam``'s final gather, which only returns the result)."""
    sent = defaultdict(lambda: defaultdict(int))
    for e in trace.events:
        if e.span.split("/", 1)[0] in skip:
            continue
        sent[e.src][e.span.rsplit("/", 1)[-1]] += e.nbytes
    return {rank: {name: b // steps if b % steps == 0 else b / steps
                   for name, b in sorted(sent[rank].items())}
            for rank in range(trace.world_size)}
