"""FSDP's units as data: each unit's flat layout and this rank's shard, no communication.

A unit is a layer with parameters and the parameter-free layers after it; its
parameters live as one flat vector padded to a multiple of N (FSDP's
``FlatParameter``), of which rank r keeps shard r. ``zero3.Unit`` adds what moves
a unit's data between the ranks (gather, reshard, reduce-scatter); the ZeRO-3 and
HSDP exercises get these data-only units and write that communication themselves.

    >>> import numpy as np
    >>> from ringlab.nn import mlp_model
    >>> m = UnitShards(mlp_model([4, 8, 2], np.random.default_rng(0)), rank=0, world_size=3)
    >>> [(u.name, u.numel, u.padded, len(u.shard)) for u in m.units]   # 40 and 18 numbers
    [('0', 40, 42, 14), ('2', 18, 18, 6)]
    >>> m.units[0].layer.params["weight"] is None          # only the shard is kept
    True
"""

import numpy as np

from ..nn import FlatBuffer


class UnitShard:
    """One unit: ``layers`` (a layer with parameters, then those without),
    ``layer`` (the first), ``numel``/``padded`` its parameters without/with
    padding, ``shard`` this rank's 1/N of them, ``grad_shard`` its 1/N of the
    summed gradient (zeros: to be filled), ``shapes``/``sizes``/``offsets`` the
    layout of the flat vector. ``views(flat)``: ``{name: view}`` into a full one.
    The layer's ``params`` and ``grads`` are None: the full vectors are not kept."""

    def __init__(self, name, layers, rank, world_size):
        self.name, self.layers = name, layers
        self.rank, self.world_size = rank, world_size
        flat = FlatBuffer(layers[0].params, pad_to=world_size)   # FSDP's FlatParameter
        self.shapes, self.offsets, self.sizes = flat.shapes, flat.offsets, flat.sizes
        self.numel, self.padded = flat.numel, len(flat)
        self.shard = flat.shard(rank, world_size).copy()   # mine: the parameters gathered
        self.grad_shard = np.zeros_like(self.shard)        # my part of the summed gradient
        for name in self.shapes:                            # the full init is not kept
            self.layer.params[name] = self.layer.grads[name] = None

    @property
    def layer(self):
        return self.layers[0]

    def views(self, flat):
        """The layer's named arrays as views into a full flat vector."""
        return {name: flat[start:start + self.sizes[name]].reshape(self.shapes[name])
                for name, start in self.offsets.items()}


def unit_layers(model, rank):
    """``[(unit name, layers)]``: one unit per layer with parameters, the
    parameter-free layers after it (GeLU & co.) joining it."""
    groups = []
    for i, layer in enumerate(model.layers):
        if layer.params:
            groups.append((str(i), [layer]))
        elif groups:
            groups[-1][1].append(layer)
        else:
            raise ValueError(f"rank {rank}: layer {i} ({type(layer).__name__}) has no "
                             f"parameters and no unit before it; the first layer must "
                             f"have some")
    return groups


class UnitShards:
    """A ``Sequential`` cut into ``units`` (``UnitShard``); ``shards()`` /
    ``grad_shards()``: ``{unit name: array}``."""

    def __init__(self, model, rank, world_size):
        self.units = [UnitShard(name, layers, rank, world_size)
                      for name, layers in unit_layers(model, rank)]

    def shards(self):
        """``{unit name: parameter shard}``: what the optimizer updates."""
        return {u.name: u.shard for u in self.units}

    def grad_shards(self):
        return {u.name: u.grad_shard for u in self.units}
