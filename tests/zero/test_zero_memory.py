"""What DP and each ZeRO stage record with comm.alloc/free, against closed forms.

The closed forms here are computed from the layer sizes alone (numbers per
tensor and per layer, rounded up to a multiple of N), not from the library's
layouts; the mixed-precision totals are checked against the paper's formulas
in ringlab.zero.accounting.
"""

import importlib.util
import math

import numpy as np
import pytest

import ringlab
from ringlab.zero import data_parallel_adam, zero1_adam, zero2_adam, zero3_adam
from ringlab.zero.accounting import elements_sent_per_device, memory_per_device
from ringlab.zero.all_stages import comm_per_step, run_stages

PROGRAMS = {"dp": data_parallel_adam, "zero1": zero1_adam, "zero2": zero2_adam,
            "zero3": zero3_adam}
ODD = [4, 7, 3]            # 28 + 7 + 21 + 3 = 59 numbers: no N > 1 divides them
EVEN = [4, 8, 4]           # 32 + 8 + 32 + 4 = 76: every tensor divides by 1, 2 and 4
PRECISIONS = {"float64": (np.float64, None), "mixed": (np.float16, np.float32)}
END = float("inf")


def batches(steps, dim=4, out=3, batch=12):
    data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=dim, out=out)
    return [b for _, b in zip(range(steps), data.batches(batch))]


def tensors(sizes):
    """Numbers per parameter tensor: weight and bias of each Linear."""
    return [t for a, b in zip(sizes[:-1], sizes[1:]) for t in (a * b, b)]


def layers(sizes):
    """Numbers per Linear: ZeRO-3's units."""
    return [(a + 1) * b for a, b in zip(sizes[:-1], sizes[1:])]


def per_rank(numels, n):
    """Numbers per rank when each of ``numels`` is padded to a multiple of n and cut."""
    return sum(math.ceil(k / n) for k in numels)


def expected_persistent(stage, sizes, n, bp, bm):
    """{label: bytes} a rank holds between steps: params, grads, master, adam.m, adam.v."""
    psi = sum(tensors(sizes))
    mixed = bm != bp
    if stage == "dp":
        held = {"params": psi * bp, "grads": psi * bp, "master": psi * bm if mixed else 0}
        state = psi * bm
    elif stage == "zero1":       # one flat buffer, padded: optimizer state on the shard
        shard = math.ceil(psi / n)
        held = {"params": psi * bp, "grads": psi * bp, "master": shard * bm}
        state = shard * bm
    elif stage == "zero2":       # cap_bytes=1: every tensor is a bucket of its own
        shard = per_rank(tensors(sizes), n)
        held = {"params": psi * bp, "grads": shard * bp, "master": shard * bm}
        state = shard * bm
    else:                        # zero3: one unit per Linear; the shard is its own master
        shard = per_rank(layers(sizes), n)
        held = {"params": shard * bp, "grads": shard * bp, "master": shard * bm if mixed else 0}
        state = shard * bm
    held.update({"adam.m": state, "adam.v": state})
    return {label: b for label, b in held.items() if b}


def expected_peak_extra(stage, sizes, n, bp):
    """Bytes above the persistent ones at the peak, in a run without simulated time
    (backward outruns every collective started on the communication stream)."""
    if stage in ("dp", "zero1"):
        return 0
    if stage == "zero2":         # every bucket, padded, is alive before any ReduceScatter ends
        return n * per_rank(tensors(sizes), n) * bp
    full = [n * math.ceil(k / n) * bp for k in layers(sizes)]      # gathered units
    forward = max(f + g for f, g in zip(full, full[1:] + [0]))       # unit i, i+1 prefetched
    backward = max(2 * f + g for f, g in zip(full, [0] + full[:-1]))  # + grads.full, i-1 fetched
    return max(forward, backward)


def run(stage, sizes, n, steps, precision="float64", **kw):
    dtype, master_dtype = PRECISIONS[precision]
    kw = dict(sizes=sizes, seed=0, lr=1e-3, dtype=dtype, master_dtype=master_dtype, **kw)
    if stage == "zero2":
        kw.setdefault("cap_bytes", 1)
    return ringlab.run(PROGRAMS[stage], [batches(steps, sizes[0], sizes[-1])] * n, kwargs=kw)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", PROGRAMS)
def test_persistent_state_and_peak_equal_closed_forms(stage, n, precision):
    bp, bm = (np.dtype(d or PRECISIONS[precision][0]).itemsize
              for d in PRECISIONS[precision])
    persistent = expected_persistent(stage, ODD, n, bp, bm)
    for steps in (1, 3):             # the end of step 1 and of step 3: nothing leaks
        trace = run(stage, ODD, n, steps, precision).trace
        for r in range(n):
            assert trace.memory_by_label(r, END) == persistent, (steps, r)
            held = [b for _, b in trace.memory_timeline(r)]
            setup = len(persistent)      # the first events: the run's allocations, once
            assert min(held[setup - 1:]) == sum(persistent.values())
            extra = expected_peak_extra(stage, ODD, n, bp)
            assert trace.peak_memory(r) == sum(persistent.values()) + extra


def test_zero2_frees_each_bucket_when_its_reduce_scatter_ends():
    # With compute time and a free network each ReduceScatter ends as it starts,
    # before backward reaches the next layer: the peak adds one layer's buckets
    # (weight and bias: one bucket each here, both filled by the layer's backward).
    n, bp = 4, 8
    trace = run("zero2", ODD, n, 2, flops_per_second=1e9).trace
    persistent = sum(expected_persistent("zero2", ODD, n, bp, bp).values())
    t = tensors(ODD)
    biggest = max(n * (math.ceil(w / n) + math.ceil(b / n)) for w, b in zip(t[::2], t[1::2]))
    assert trace.peak_memory(0) == persistent + biggest * bp
    frees = [m for m in trace.memory if m.label == "bucket" and m.nbytes < 0]
    assert frees and all(m.stream == 1 for m in frees)      # on the communication stream
    assert len(frees) == n * 2 * len(tensors(ODD))


@pytest.mark.parametrize("options, extra_units", [
    (dict(prefetch=False), lambda f: 2 * max(f)),                  # one unit + its grads
    (dict(reshard_after_forward=False, prefetch=False),             # SHARD_GRAD_OP: all
     lambda f: max(sum(f[:i + 1]) + f[i] for i in range(len(f)))),  # gathered, then freed
])
def test_zero3_options_change_the_peak(options, extra_units):
    sizes, n, bp = [4, 12, 6, 3], 4, 8
    trace = run("zero3", sizes, n, 2, **options).trace
    full = [n * math.ceil(k / n) * bp for k in layers(sizes)]
    persistent = expected_persistent("zero3", sizes, n, bp, bp)
    assert trace.memory_by_label(2, END) == persistent
    assert trace.peak_memory(2) == sum(persistent.values()) + extra_units(full)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("stage", PROGRAMS)
def test_mixed_precision_state_is_the_papers_formula(stage, n):
    # fp16 parameters and gradients, fp32 master, m and v: 2 + 2 + 12 bytes a parameter.
    psi = sum(tensors(EVEN))                       # every tensor divides: no padding
    trace = run(stage, EVEN, n, 2, "mixed").trace
    for r in range(n):
        held = trace.memory_by_label(r, END)
        assert sum(held.values()) == memory_per_device(stage, psi, n)
        if stage == "zero1":     # the paper's K = 12 bytes: master, m, v of the shard
            assert held["master"] + held["adam.m"] + held["adam.v"] == 12 * psi / n


@pytest.mark.parametrize("stage", ["dp", "zero3"])
def test_new_mixed_precision_options_train_like_float64(stage):
    # DP and ZeRO-3 gained dtype/master_dtype for the accounting: fp16 model, fp32 Adam.
    from ringlab.zero import single_process_adam
    kw = dict(sizes=ODD, seed=0, lr=1e-2)
    data = batches(5)
    ref, start = single_process_adam(data, **kw)[1], single_process_adam([], **kw)[1]
    ours = ringlab.run(PROGRAMS[stage], [data] * 4, kwargs=dict(
        kw, dtype=np.float16, master_dtype=np.float32)).outputs[0][1]
    assert ours.dtype == np.float16
    assert np.abs(ours - ref).max() < 1e-3 < 0.04 < np.abs(ref - start).max()


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("stage, k, numels", [("zero1", 12, lambda s: [sum(tensors(s))]),
                                              ("zero2", 14, tensors), ("zero3", 16, layers)])
def test_padding_adds_k_bytes_per_padded_number(stage, k, numels, n):
    # The sharded bytes (k a number: 12 for ZeRO-1, 2 + 12 for ZeRO-2, 16 for ZeRO-3)
    # are paid on the padded shard: the formula plus k x (shard - psi/N).
    psi = sum(tensors(ODD))
    trace = run(stage, ODD, n, 1, "mixed").trace
    padding = per_rank(numels(ODD), n) - psi / n
    assert padding > 0
    for r in range(n):
        total = sum(trace.memory_by_label(r, END).values())
        assert math.isclose(total, memory_per_device(stage, psi, n) + k * padding)


@pytest.fixture(scope="module")
def stages():
    sizes = [8] + [32] * 6 + [8]
    return sizes, run_stages(sizes, batches(2, 8, 8, 16), 4)


def test_peaks_fall_stage_by_stage(stages):
    sizes, runs = stages
    assert list(runs) == ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    peaks = [res.trace.peak_memory(r) for res in runs.values() for r in range(4)]
    by_stage = [peaks[i:i + 4] for i in range(0, 16, 4)]
    assert all(a > b for stage, nxt in zip(by_stage, by_stage[1:]) for a, b in zip(stage, nxt))
    for (name, res), stage in zip(runs.items(), PROGRAMS):
        for r in range(4):      # timed runs end where untimed ones do (no padding here)
            assert res.trace.memory_by_label(r, END) == expected_persistent(
                stage, sizes, 4, 8, 8), (name, r)
        assert res.time > 0, name
    # One line for the book: four panels, each drawn against simulated seconds.
    import matplotlib
    matplotlib.use("Agg")
    from ringlab.show.memory import memory_layers, plot_memory_side_by_side
    axes = plot_memory_side_by_side({name: res.trace for name, res in runs.items()})
    assert [ax.get_title().split(":")[0] for ax in axes] == list(runs)
    assert all(ax.get_xlabel().startswith("simulated time") for ax in axes)
    x, held = memory_layers(runs["ZeRO-3"].trace, 0)
    assert "params.full" in held and max(x) > 0


def test_bytes_sent_per_step_are_the_papers(stages):
    sizes, runs = stages
    psi = sum(tensors(sizes))                     # 5832: every tensor divides by 4
    assert all(k % 4 == 0 for k in tensors(sizes))
    expected = {"DP": {"ring_allreduce": 2}, "ZeRO-1": {"ring_allgather": 1,
                                                        "ring_reduce_scatter": 1},
                "ZeRO-2": {"ring_allgather": 1, "ring_reduce_scatter": 1},
                "ZeRO-3": {"ring_allgather": 2, "ring_reduce_scatter": 1}}
    for (name, res), stage in zip(runs.items(), PROGRAMS):
        sent = comm_per_step(res.trace, steps=2)
        one = psi * 3 / 4 * 8                     # one collective: (N-1)/N of psi, 8 bytes
        for r in range(4):
            assert sent[r] == {c: k * one for c, k in expected[name].items()}, (name, r)
            assert sum(sent[r].values()) == elements_sent_per_device(stage, psi, 4) * 8


def test_bytes_sent_with_padding():
    n, steps = 4, 2
    psi = sum(tensors(ODD))
    for stage, padded in [("zero1", n * math.ceil(psi / n)),
                          ("zero2", n * per_rank(tensors(ODD), n)),
                          ("zero3", n * per_rank(layers(ODD), n))]:
        sent = comm_per_step(run(stage, ODD, n, steps).trace, steps)
        for r in range(n):
            assert sum(sent[r].values()) == elements_sent_per_device(stage, padded, n) * 8
    # DP's AllReduce is not padded: uneven chunks, but 2 (N-1) psi numbers in all.
    sent = comm_per_step(run("dp", ODD, n, steps).trace, steps)
    assert sum(sum(s.values()) for s in sent.values()) == 2 * (n - 1) * psi * 8


# -- real processes --------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="backend='torch' needs PyTorch")
def test_zero3_memory_events_are_the_same_on_real_processes():
    from ringlab.backends.torch import pool
    kw = dict(sizes=[4, 6, 3], seed=0, lr=1e-3)
    inputs = [batches(2)] * 2
    try:
        real = ringlab.run(zero3_adam, inputs, kwargs=kw, backend="torch")
    finally:
        pool.shutdown()
    sim = ringlab.run(zero3_adam, inputs, kwargs=kw)
    assert len(sim.trace.memory) > 4 + 2 * 2 * 2 * 2      # setup, then per step and unit
    assert real.trace.memory == sim.trace.memory, real.trace.diff(sim.trace)
