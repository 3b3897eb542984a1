"""Flat buffers: many named arrays laid out in one contiguous 1-D array.

Collectives move one buffer more cheaply than many small ones, and ZeRO gives
each rank a contiguous slice of the buffer. ``FlatBuffer`` copies the arrays in,
one after another in the order given -- ``model.named_parameters()`` order, i.e.
module registration order, which is forward order. (DDP fills its gradient
buckets walking this order in reverse, because backward produces the last
layer's gradients first; ZeRO just cuts the buffer into equal shards.)

``views[name]`` is a view into ``data`` with the original shape: writing either
one changes the other.

    >>> import numpy as np
    >>> flat = FlatBuffer({"w": np.ones((2, 2)), "b": np.zeros(3)}, pad_to=4)
    >>> flat.offsets, flat.numel, len(flat.data)     # 7 numbers, padded to 8
    ({'w': 0, 'b': 4}, 7, 8)
    >>> flat.views["b"][:] = 5
    >>> flat.data
    array([1., 1., 1., 1., 5., 5., 5., 0.])
    >>> flat.shard(1, 2)                             # rank 1 of 2 owns data[4:8]
    array([5., 5., 5., 0.])
"""

import math

import numpy as np


class FlatBuffer:
    """One 1-D ``data`` array holding all arrays, plus per-name views into it.

    ``pad_to``: round the length up to a multiple of this (ZeRO needs the length
    divisible by the world size); the padding is zeros at the end.
    """

    def __init__(self, named_arrays, pad_to=1, dtype=None):
        arrays = dict(named_arrays)
        if dtype is None:
            dtype = np.result_type(*arrays.values()) if arrays else np.float64
        self.shapes = {name: a.shape for name, a in arrays.items()}
        self.sizes = {name: a.size for name, a in arrays.items()}
        self.offsets, offset = {}, 0
        for name, size in self.sizes.items():
            self.offsets[name] = offset
            offset += size
        self.numel = offset                              # without the padding
        self.data = np.zeros(math.ceil(offset / pad_to) * pad_to, dtype)
        self.views = {}
        for name, a in arrays.items():
            start = self.offsets[name]
            # Slicing then reshaping a contiguous array gives a view, not a copy.
            self.views[name] = self.data[start:start + a.size].reshape(a.shape)
            self.views[name][...] = a

    def __len__(self):
        return len(self.data)

    def shard_range(self, rank, world_size):
        """(start, stop) of rank's equal, contiguous slice of ``data``."""
        if len(self.data) % world_size:
            raise ValueError(f"length {len(self.data)} is not divisible by {world_size}; "
                             f"build the buffer with pad_to={world_size}")
        size = len(self.data) // world_size
        return rank * size, (rank + 1) * size

    def shard(self, rank, world_size):
        """Rank's slice of ``data`` (a view: writes reach the buffer)."""
        start, stop = self.shard_range(rank, world_size)
        return self.data[start:stop]


def flatten(named_arrays, pad_to=1):
    """``FlatBuffer(named_arrays, pad_to)``: copy the arrays into one flat buffer."""
    return FlatBuffer(named_arrays, pad_to)
