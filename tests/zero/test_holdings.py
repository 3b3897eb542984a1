"""ringlab.zero.holdings: the who-holds-what pieces agree with the run's own memory."""

import numpy as np
import pytest

import ringlab
from ringlab.show.ownership import held_fraction
from ringlab.zero.holdings import COLUMNS, zero3_moment

SIZES = [4, 7, 6, 2]                       # units of 35, 48 and 14 numbers
DATA = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2, seed=1)
BATCH = next(iter(DATA.batches(10, seed=2)))


def kinds(pieces, column, kind):
    return [(p.start, p.stop) for p in pieces if p.tensor == column and p.kind == kind]


@pytest.mark.parametrize("n", [3, 4])
def test_the_peak_of_a_step_is_what_the_pieces_say(n):
    # Unit 1's backward, unit 0 prefetched: the step's peak (padded 36 + 48 + 16
    # on 4 ranks, 36 + 48 + 15 on 3), read once from the units, once from memory.
    res = ringlab.run(zero3_moment, [BATCH] * n, kwargs=dict(sizes=SIZES, unit=1))
    padded = [-(-m // n) * n for m in (35, 48, 14)]
    total, item = sum(padded), 8
    for r, pieces in enumerate(res.outputs):
        peak = res.trace.memory_by_label(r)
        h = {r: pieces}
        gathered = sum(b - a for a, b in kinds(pieces, "parameters", "gathered"))
        full_grad = sum(b - a for a, b in kinds(pieces, "gradients", "full gradients"))
        assert round(gathered * total) * item == peak["params.full"] == \
            (padded[0] + padded[1]) * item
        assert round(full_grad * total) * item == peak["grads.full"] == padded[1] * item
        assert held_fraction(h, r, "parameters") == pytest.approx(
            (padded[0] + padded[1] + padded[2] // n) / total)
        for column, kind in zip(COLUMNS, ("parameters", "gradients", "optimizer")):
            shards = kinds(pieces, column, kind)           # rank r's of every unit
            starts = np.cumsum([0] + padded[:-1])
            assert [(round(a * total), round(b * total)) for a, b in shards] == \
                [(s + r * m // n, s + (r + 1) * m // n) for s, m in zip(starts, padded)]


@pytest.mark.parametrize("prefetch, gathered", [(True, 2), (False, 1)])
def test_in_forward_the_next_unit_is_gathered_only_with_prefetch(prefetch, gathered):
    res = ringlab.run(zero3_moment, [BATCH] * 4,
                      kwargs=dict(sizes=SIZES, unit=0, phase="forward", prefetch=prefetch))
    for pieces in res.outputs:
        assert len(kinds(pieces, "parameters", "gathered")) == gathered
        assert kinds(pieces, "gradients", "full gradients") == []

