"""Cutting a flat buffer into N equal shards, one per rank.

ZeRO keeps the model's numbers in one flat vector (``FlatBuffer``, in
``named_parameters()`` order) and gives rank r the r-th of N equal, contiguous
slices of it. A parameter count that does not divide by N is padded: zeros at
the *end*, at most N-1 of them, so the last rank(s) own some padding. The
padding takes part in every ReduceScatter and AllGather (so that the chunks
are equal) but never reaches the model: ``load_flat`` copies only the real
entries back, and Adam leaves a zero with zero gradient at zero.

    >>> import numpy as np
    >>> padded_size(59, 4), [shard_range(59, r, 4) for r in range(4)]
    (60, [(0, 15), (15, 30), (30, 45), (45, 60)])
    >>> params = {"w": np.arange(4.0).reshape(2, 2), "b": np.array([4.0])}
    >>> master_shard(params, rank=1, world_size=2)   # 5 numbers + 1 zero of padding
    array([3., 4., 0.])
    >>> load_flat(params, np.array([9., 9., 9., 9., 8., 0.]))
    >>> params["b"]
    array([8.])
"""

import math

import numpy as np

from ..nn import FlatBuffer


def padded_size(numel, world_size):
    """``numel`` rounded up to a multiple of ``world_size``: the flat buffer's length."""
    return math.ceil(numel / world_size) * world_size


def shard_range(numel, rank, world_size):
    """(start, stop) of rank's slice of the padded buffer of ``numel`` numbers."""
    size = padded_size(numel, world_size) // world_size
    return rank * size, (rank + 1) * size


def master_shard(named_params, rank, world_size, dtype=None):
    """A *copy* of rank's shard of the flat, padded parameters, in ``dtype``
    (default: the parameters'): the master weights this rank's optimizer updates.
    A copy, not a view: in mixed precision it is float32 while the model is
    float16, and even in float64 the model's arrays are overwritten by the
    AllGather, not by the optimizer."""
    flat = FlatBuffer(named_params, pad_to=world_size)
    return flat.shard(rank, world_size).astype(dtype or flat.data.dtype, copy=True)


def load_flat(named_params, flat):
    """Copy a flat vector (padded or not) into the named arrays, in order, in place.
    The padding at the end is ignored."""
    need = sum(p.size for p in named_params.values())
    if len(flat) < need:
        raise ValueError(f"flat vector has {len(flat)} numbers, the parameters need {need}")
    offset = 0
    for p in named_params.values():
        p[...] = flat[offset:offset + p.size].reshape(p.shape)   # casts to p's dtype
        offset += p.size


def check_shard(comm, master, grad_shard):
    """The optimizer's shard must be the one the ReduceScatter delivers: same length."""
    if len(master) != len(grad_shard):
        raise ValueError(f"rank {comm.rank}, step {comm.step}: the optimizer holds "
                         f"{len(master)} master weights but this rank's gradient shard has "
                         f"{len(grad_shard)}; build it from master_shard(..., rank, world_size) "
                         f"with this world's size")
