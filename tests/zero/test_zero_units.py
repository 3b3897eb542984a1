"""ringlab.zero.units: the data-only FSDP units the ZeRO-3 and HSDP exercises get lay a
model out exactly as ``ShardedModel`` (which builds on them) does, without its gathers."""

import numpy as np
import pytest

from ringlab.grading.kit.units import ShardedModel as Handed
from ringlab.nn import GeLU, mlp_model
from ringlab.zero import ShardedModel, Unit
from ringlab.zero.units import UnitShard, UnitShards


@pytest.mark.parametrize("rank, n", [(0, 1), (1, 3), (3, 4)])
def test_handed_units_hold_the_same_shards_as_sharded_model(rank, n):
    sizes = [5, 7, 3]
    handed = Handed(mlp_model(sizes, np.random.default_rng(1)), rank, n)
    full = ShardedModel(mlp_model(sizes, np.random.default_rng(1)), rank, n)
    assert type(handed) is UnitShards and all(type(u) is UnitShard for u in handed.units)
    assert [isinstance(u, UnitShard) and isinstance(u, Unit) for u in full.units] == [True, True]
    for a, b in zip(handed.units, full.units):
        assert (a.name, a.numel, a.padded, a.offsets, a.sizes) == \
            (b.name, b.numel, b.padded, b.offsets, b.sizes)
        assert np.array_equal(a.shard, b.shard) and a.shard is not b.shard
        assert a.layer.params["weight"] is None and not hasattr(a, "unshard")
    assert handed.shards().keys() == full.shards().keys() == {"0", "2"}


def test_views_read_a_full_vector_back_into_the_layer_shapes():
    unit = UnitShards(mlp_model([2, 3], np.random.default_rng(0)), 0, 2).units[0]
    views = unit.views(np.arange(unit.padded, dtype=float))      # 6 + 3 numbers, 1 of padding
    assert views["weight"].shape == (2, 3) and views["bias"].tolist() == [6.0, 7.0, 8.0]


def test_a_model_that_starts_without_parameters_is_refused_by_both():
    model = mlp_model([2, 3], np.random.default_rng(0))
    model.layers.insert(0, GeLU())
    for make in (UnitShards, ShardedModel):
        with pytest.raises(ValueError, match="rank 1: layer 0 .GeLU. has no parameters"):
            make(model, 1, 2)
