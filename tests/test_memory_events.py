"""Memory events: ``comm.alloc``/``comm.free`` notes in the trace, the timeline
and peak they add up to, and the figure that draws them.

Expected values are worked out by hand from the programs below: which bytes
each rank holds after each call, at the simulated time its computes add up to.
"""

import importlib.util
import json

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ringlab  # noqa: E402
from ringlab.collectives import ring_allreduce  # noqa: E402
from ringlab.errors import CommError, RankError  # noqa: E402
from ringlab.show.memory import memory_layers, plot_memory, plot_memory_side_by_side  # noqa: E402
from ringlab.trace import MemoryEvent, Trace  # noqa: E402

NS = [10, 20, 100]      # float64 parameters per rank in `step`


def step(comm, n):
    """A training step in outline: params, activations, grads, half the grads freed."""
    comm.alloc("params", np.zeros(n))                   # 8n bytes
    comm.compute(1.0, "forward")
    comm.alloc("activations", 100 * (comm.rank + 1))
    comm.compute(2.0, "backward")
    comm.free("activations")
    comm.alloc("grads", 8 * n)
    comm.compute(0.5, "update")
    comm.free("grads", 4 * n)


def expected_timeline(rank, n):
    act = 100 * (rank + 1)
    return [(0.0, 8 * n), (1.0, 8 * n + act), (3.0, 8 * n), (3.0, 16 * n), (3.5, 12 * n)]


@pytest.fixture(scope="module")
def trace():
    return ringlab.run(step, NS).trace


def test_known_allocs_and_frees_give_the_exact_timeline_and_peaks(trace):
    for r, n in enumerate(NS):
        assert trace.memory_timeline(r) == expected_timeline(r, n)
    # peaks: max(8n + 100(r+1), 16n) = 180, 360, 1600
    assert [trace.peak_memory(r) for r in range(3)] == [180, 360, 1600]
    assert trace.peak_memory() == 1600
    assert Trace([], 2).peak_memory() == 0 and Trace([], 2).memory_timeline(0) == []


def test_events_are_signed_in_canonical_order_with_compute_times_and_steps(trace):
    computes = {(c.rank, c.label): c for c in trace.computes}
    rank0 = [m for m in trace.memory if m.rank == 0]
    assert rank0 == [MemoryEvent(0, "params", 80, 0.0, 0, 0),
                     MemoryEvent(0, "activations", 100, computes[0, "forward"].end, 0, 0),
                     MemoryEvent(0, "activations", -100, computes[0, "backward"].end, 0, 0),
                     MemoryEvent(0, "grads", 80, 3.0, 0, 0),
                     MemoryEvent(0, "grads", -40, computes[0, "update"].end, 0, 0)]
    # by time, then rank; at one time and rank, in program order
    keys = [(m.time, m.rank) for m in trace.memory]
    assert keys == sorted(keys) and len(trace.memory) == 15


def test_memory_by_label_at_the_peak_and_at_a_time(trace):
    assert trace.memory_by_label(0) == {"params": 80, "activations": 100}
    assert trace.memory_by_label(2) == {"params": 800, "grads": 800}
    assert trace.memory_by_label(0, time=3.0) == {"params": 80, "grads": 80}
    assert trace.memory_by_label(0, time=3.5) == {"params": 80, "grads": 40}
    assert trace.memory_by_label(0, time=0.5) == {"params": 80}


def test_group_labels_adds_sub_labels_to_their_head():
    t = Trace([], 1, memory=[MemoryEvent(0, "params.layer0", 10, 0.0),
                             MemoryEvent(0, "params.layer1", 20, 0.0),
                             MemoryEvent(0, "adam.m", 5, 1.0)])
    assert t.memory_by_label(0, group_labels=True) == {"params": 30, "adam": 5}
    assert t.memory_by_label(0) == {"params.layer0": 10, "params.layer1": 20, "adam.m": 5}
    x, layers = memory_layers(t, 0, group_labels=True)
    assert x == [0.0, 0.0, 0.0, 1.0] and layers == {"params": [0, 10, 30, 30], "adam": [0, 0, 0, 5]}


def test_steps_follow_the_messages():
    def allreduce_grads(comm, g):
        comm.alloc("grads", g)
        out = ring_allreduce(comm, g)
        comm.free("grads")
        return comm.step

    res = ringlab.run(allreduce_grads, [np.ones(8)] * 4)
    frees = [m for m in res.trace.memory if m.nbytes < 0]
    assert [m.step for m in frees] == res.outputs == [6] * 4         # 2(n-1) ring steps
    assert all(m.step == 0 for m in res.trace.memory if m.nbytes > 0)


def bucketed(comm, g):
    """Program allocs the grads; the comm-stream work holds a bucket while it reduces."""
    def reduce_bucket(c, x):
        c.alloc("bucket", x)
        out = ring_allreduce(c, x)
        c.free("bucket")
        return out

    comm.alloc("grads", g)
    comm.compute(1e-3, "backward")
    work = comm.start(reduce_bucket, g)
    comm.compute(2e-3, "backward")
    out = work.wait()
    comm.free("grads")
    return out


def test_the_communication_stream_records_at_its_own_time():
    res = ringlab.run(bucketed, [np.ones(6)] * 2, network=ringlab.AlphaBeta(1e-4, 1e-8))
    t = res.trace
    ring = {s.rank: s for s in t.spans if s.name == "ring_allreduce"}
    for r in range(2):
        got = [m for m in t.memory if m.rank == r and m.label == "bucket"]
        assert [(m.nbytes, m.stream) for m in got] == [(48, 1), (-48, 1)]
        assert got[0].time == 1e-3                          # when the work was started
        assert got[1].time == ring[r].t_end                 # when its all-reduce ended
        assert got[1].step == ring[r].end
        # the program's free waits for the work: at the later of the two ends
        end = [m for m in t.memory if m.rank == r and m.label == "grads" and m.nbytes < 0][0]
        assert end.time == max(3e-3, ring[r].t_end) and end.stream == 0
        assert t.peak_memory(r) == 96


def test_the_ledger_is_one_per_rank_across_streams():
    def free_in_work(comm, x):
        comm.alloc("params", x)
        comm.start(lambda c: c.free("params")).wait()
        comm.alloc("params", 3)            # freed by the work: starts again from 0

    t = ringlab.run(free_in_work, [np.ones(2)] * 2).trace
    assert [(m.nbytes, m.stream) for m in t.memory if m.rank == 0] == [(16, 0), (-16, 1), (3, 0)]
    assert t.memory_timeline(1) == [(0.0, 16), (0.0, 0), (0.0, 3)]


def _error(program, **kw):
    with pytest.raises(RankError) as err:
        ringlab.run(program, [np.ones(2)] * 2, **kw)
    assert isinstance(err.value.exc, CommError)
    return err.value.rank, str(err.value.exc)


def over_free(comm, x):
    comm.alloc("grads", x)
    comm.send(x, 1 - comm.rank)
    comm.recv(1 - comm.rank)
    if comm.rank == 1:
        comm.free("grads", 100)


def never_allocated(comm, x):
    comm.alloc("params", x)
    if comm.rank == 1:
        comm.free("adam.m")


def test_freeing_too_much_or_what_was_never_allocated_names_rank_step_label():
    assert _error(over_free) == (1, "rank 1, step 1: free('grads', 100): this rank holds only 16 "
                                    "bytes under 'grads' (all it holds: {'grads': 16}). Hint: free "
                                    "what you alloc, under the same label")
    rank, msg = _error(never_allocated)
    assert rank == 1 and msg.startswith("rank 1, step 0: free('adam.m'): this rank holds nothing "
                                        "under 'adam.m' (all it holds: {'params': 16})")


@pytest.mark.parametrize("call, words", [
    (lambda c: c.alloc(3, 8), "alloc(label=3) needs a str label"),
    (lambda c: c.alloc("params", -1), "alloc('params', -1) needs a number of bytes (an int >= 0)"),
    (lambda c: c.alloc("params", 2.5), "alloc('params', 2.5) needs a number of bytes"),
    (lambda c: c.alloc("params", True), "alloc('params', True) needs a number of bytes"),
    (lambda c: c.free("params", [1]), "free('params', [1]) needs a number of bytes"),
])
def test_bad_arguments_are_named(call, words):
    def program(comm, x):
        comm.alloc("params", x)
        call(comm)

    rank, msg = _error(program)
    assert rank == 0 and msg.startswith("rank 0, step 0: ") and words in msg


def test_trace_equality_json_round_trip_and_filter(trace):
    back = Trace.from_json(trace.to_json())
    assert back == trace and back.memory == trace.memory
    assert isinstance(back.memory[0], MemoryEvent)
    assert json.loads(trace.to_json())["memory"][1] == {
        "rank": 1, "label": "params", "nbytes": 160, "time": 0.0, "step": 0, "stream": 0}
    other = Trace(trace.events, trace.world_size, memory=trace.memory[:-1])
    assert other != trace and other.events == trace.events
    assert "15 memory events != 14 memory events" in trace.diff(other)
    assert trace.filter(step=1).memory == trace.memory          # whole ranks: memory stays
    assert trace.filter(span="ring_allreduce").memory == []


def test_chrome_trace_has_a_memory_counter_per_rank(trace):
    doc = trace.to_chrome_trace()
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == len(trace.memory)
    rank0 = [(e["ts"], e["args"]) for e in counters if e["pid"] == 1]
    assert rank0 == [(0.0, {"params": 80}),
                     (1e6, {"params": 80, "activations": 100}),
                     (3e6, {"params": 80, "activations": 0}),
                     (3e6, {"params": 80, "activations": 0, "grads": 80}),
                     (3.5e6, {"params": 80, "activations": 0, "grads": 40})]


# -- the figure ------------------------------------------------------------------

def _lines(ax):
    return {l.get_gid(): l for l in ax.get_lines() if (l.get_gid() or "").startswith("memory:")}


def test_plot_memory_stacks_the_labels_at_the_right_heights(trace):
    ax = plot_memory(trace, 0)
    lines = _lines(ax)
    assert list(lines) == ["memory:params", "memory:activations", "memory:grads"]
    x = [0.0, 0.0, 1.0, 3.0, 3.0, 3.5]
    for gid, tops in (("memory:params", [0, 80, 80, 80, 80, 80]),
                      ("memory:activations", [0, 80, 180, 80, 80, 80]),
                      ("memory:grads", [0, 80, 180, 80, 160, 120])):   # the top: the total
        assert list(lines[gid].get_xdata()) == x and list(lines[gid].get_ydata()) == tops
        assert lines[gid].get_drawstyle() == "steps-post"
    assert [b for _, b in trace.memory_timeline(0)] == tops[1:]
    assert len(ax.collections) == 3                      # one filled area per label
    assert ax.get_title() == "rank 0: peak 180 B"
    # the legend reads top to bottom, as the layers are stacked
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["grads", "activations", "params"]
    with pytest.raises(ValueError, match="draws one rank"):
        plot_memory(trace, [0, 1])


def test_plot_memory_one_line_per_rank(trace):
    ax = plot_memory(trace, by_label=False)
    lines = _lines(ax)
    for r, n in enumerate(NS):
        assert list(lines[f"memory:rank {r}"].get_ydata()) == [0] + [b for _, b in
                                                                       expected_timeline(r, n)]
    assert ax.get_title() == "3 ranks: peak 1.6 kB"


def test_side_by_side_shares_the_byte_scale_and_the_colours():
    def zero_like(comm, n):           # the same step, with the grads sharded over 2 ranks
        comm.alloc("params", 8 * n)
        comm.compute(1.0)
        comm.alloc("grads", 4 * n)

    def plain(comm, n):
        comm.alloc("params", 8 * n)
        comm.compute(1.0)
        comm.alloc("grads", 8 * n)

    runs = {"DP": ringlab.run(plain, [100] * 2).trace,
            "ZeRO-2": ringlab.run(zero_like, [100] * 2).trace}
    axes = plot_memory_side_by_side(runs, rank=1)
    assert [ax.get_title() for ax in axes] == ["DP: peak 1.6 kB", "ZeRO-2: peak 1.2 kB"]
    assert axes[0].get_ylim() == axes[1].get_ylim() == (0, 1600 * 1.08)
    tops = [list(_lines(ax)["memory:grads"].get_ydata()) for ax in axes]
    assert tops == [[0, 800, 1600], [0, 800, 1200]]
    colour = [_lines(ax)["memory:grads"].get_color() for ax in axes]
    assert colour[0] == colour[1]
    assert axes[0].get_legend() is None and axes[1].get_legend() is None
    (legend,) = axes[0].figure.legends                      # one, for every panel
    assert [t.get_text() for t in legend.get_texts()] == ["params", "grads"]


# -- real processes --------------------------------------------------------------

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="backend='torch' needs PyTorch")


@pytest.fixture(scope="module")
def pool():
    yield
    if importlib.util.find_spec("torch") is not None:
        from ringlab.backends.torch import pool
        pool.shutdown()


@needs_torch
def test_real_processes_give_the_same_memory_events_and_errors(pool):
    inputs = [np.arange(6.0) + r for r in range(3)]
    sim = ringlab.run(bucketed, inputs)
    real = ringlab.run(bucketed, inputs, backend="torch")
    assert len(real.trace.memory) == 3 * 4
    assert real.trace.memory == sim.trace.memory, real.trace.diff(sim.trace)
    assert real.trace == sim.trace
    errors = []
    for backend in ("sim", "torch"):
        with pytest.raises(RankError) as err:
            ringlab.run(over_free, [np.ones(2)] * 2, backend=backend)
        errors.append((err.value.rank, str(err.value.exc)))
    assert errors[0] == errors[1]


def test_a_zero_byte_alloc_is_an_alloc():
    """alloc of an empty array holds its label (0 bytes) until it is freed: it is no
    free (a red team's ring AllReduce of a length-0 vector failed on this)."""
    def program(comm, x):
        comm.alloc("work", np.empty(0))
        comm.free("work")
        comm.alloc("a", 8)
        comm.free("a", 0)                  # freeing nothing changes nothing
        comm.free("a")
        return x
    res = ringlab.run(program, [np.ones(1)] * 2)
    assert [(m.label, m.nbytes) for m in res.trace.memory if m.rank == 0] == [
        ("work", 0), ("work", 0), ("a", 8), ("a", 0), ("a", -8)]
    from ringlab.backends.isolated import run_isolated
    assert run_isolated(program, [np.ones(1)] * 2).trace.memory == res.trace.memory
