"""ringlab.zero.ownership: the who-holds-what pieces agree with the run's own memory."""

import numpy as np
import pytest

import ringlab
from ringlab.show.ownership import held_fraction
from ringlab.trace import MemoryEvent, Trace
from ringlab.zero import data_parallel_adam, zero1_adam, zero2_adam, zero3_adam
from ringlab.zero.accounting import memory_per_device
from ringlab.zero.ownership import COLUMNS, stage_holdings, zero3_moment
from ringlab.zero.sharding import shard_range

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


STAGES = {"dp": data_parallel_adam, "zero1": zero1_adam, "zero2": zero2_adam,
          "zero3": zero3_adam}
MIXED = dict(seed=0, lr=1e-3, dtype=np.float16, master_dtype=np.float32)


def stage_runs(sizes, n):
    return {key: ringlab.run(program, [[]] * n, kwargs=dict(MIXED, sizes=sizes)).trace
            for key, program in STAGES.items()}


def test_each_stage_holds_the_bytes_its_run_and_the_paper_say():
    traces = stage_runs([8, 32, 32, 8], 4)                  # 1,608 numbers, no padding
    h = stage_holdings(traces, 1608)
    for r in range(4):
        for key in STAGES:
            held = held_fraction(h, r, key) * memory_per_device("dp", 1608, 4)
            assert held == pytest.approx(memory_per_device(key, 1608, 4))
            assert held == pytest.approx(sum(traces[key].memory_by_label(r, float("inf"))
                                             .values()))
        kinds = [p.kind for p in h[r] if p.tensor == "dp"]
        assert kinds == ["parameters", "gradients", "master", "optimizer", "optimizer"]


def test_a_shard_sits_where_shard_range_puts_it_padding_and_all():
    traces = stage_runs([4, 7, 3], 4)                       # 59 numbers, padded to 60
    h = stage_holdings({k: traces[k] for k in ("dp", "zero2")}, 59)
    for r in range(4):
        a, b = shard_range(59, r, 4)
        grads = [p for p in h[r] if p.tensor == "zero2" and p.kind == "gradients"][0]
        assert (grads.start, grads.stop) == pytest.approx(
            ((2 + 2 * a / 60) / 16, (2 + 2 * b / 60) / 16))   # after 2 B/param of params


def test_a_state_neither_whole_nor_a_shard_is_an_error():
    whole = Trace([], 2, memory=[MemoryEvent(r, "params", 80, 0.0) for r in range(2)])
    odd = Trace([], 2, memory=[MemoryEvent(r, "params", 30, 0.0) for r in range(2)])
    with pytest.raises(ValueError, match="odd, rank 0: params holds 30 bytes"):
        stage_holdings({"dp": whole, "odd": odd}, 10)
