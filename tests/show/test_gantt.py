"""ringlab.show.timeline.plot_gantt: the bars it draws are the trace's compute events
and messages at their simulated times, on the right rank and lane, with a legend
that names exactly what is drawn."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import ringlab  # noqa: E402
from ringlab.collectives import ring_allreduce  # noqa: E402
from ringlab.show import plot_gantt  # noqa: E402
from ringlab.show.timeline import NO_SPAN, gantt_bars  # noqa: E402

NET = ringlab.AlphaBeta(alpha=1e-5, beta=1e-9)


def overlapped(comm, x):
    comm.compute(2e-3, "forward")
    comm.compute(1e-3, "backward", layer=1)
    work = comm.start(ring_allreduce, x)
    comm.compute(1e-3, "backward", layer=0)
    return work.wait()


def pipeline(comm, x):
    """Four microbatches through a line of stages: each stage computes 1 ms per microbatch."""
    r, n = comm.rank, comm.world_size
    for m in range(4):
        if r > 0:
            x = comm.recv(r - 1)
        comm.compute(1e-3, "forward", microbatch=m)
        if r < n - 1:
            comm.send(x, r + 1)
    return x


def drawn(ax, kind):
    """(left, width, y) of every bar of one kind, sorted."""
    return sorted((p.get_x(), p.get_width(), p.get_y() + p.get_height() / 2)
                  for p in ax.patches if p.get_gid() == kind)


def close(got, expected):
    assert len(got) == len(expected)
    np.testing.assert_allclose(np.array(got, dtype=float).reshape(len(got), -1),
                               np.array(expected, dtype=float).reshape(len(expected), -1),
                               rtol=1e-9, atol=1e-12)
    return True


def legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.fixture(scope="module")
def overlap_trace():
    return ringlab.run(overlapped, [np.ones(4000)] * 4, network=NET).trace


def test_bars_are_the_computes_and_the_messages(overlap_trace):
    trace = overlap_trace
    bars = gantt_bars(trace)
    compute = sorted((b["rank"], b["start"], b["end"], b["key"]) for b in bars if b["kind"] == "compute")
    assert compute == sorted((c.rank, c.start, c.end, c.label) for c in trace.computes)
    for kind, rank in (("send", "src"), ("recv", "dst")):
        mine = sorted((b["rank"], b["start"], b["end"], b["key"], b["stream"]) for b in bars if b["kind"] == kind)
        assert mine == sorted((getattr(e, rank), e.start, e.end, "ring_allreduce", 1) for e in trace)


def test_plot_draws_them_at_their_times(overlap_trace):
    trace = overlap_trace
    ax = plot_gantt(trace)
    # lanes per rank: compute, send, recv, then a 0.6 gap: rank r's compute lane at y = 3.6 r
    assert close(drawn(ax, "compute"), sorted((c.start, c.duration, 3.6 * c.rank)
                                                        for c in trace.computes))
    assert close(drawn(ax, "send"), sorted((e.start, e.end - e.start, 3.6 * e.src + 1)
                                                     for e in trace))
    assert close(drawn(ax, "recv"), sorted((e.start, e.end - e.start, 3.6 * e.dst + 2)
                                                     for e in trace))
    # compute first (in order of appearance), then collectives, then the hatch key
    assert legend(ax) == ["forward", "backward", "ring_allreduce", "comm.start stream"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["compute", "send", "recv"] * 4
    assert ax.figure.get_size_inches()[0] <= 8.5
    assert "simulated time (ms)" == ax.get_xlabel()
    # the makespan line: forward 2 ms + backward 2 ms (the AllReduce hides behind the second)
    assert trace.time == pytest.approx(4e-3)
    assert ax.lines[-1].get_xdata()[0] == pytest.approx(trace.time)


def test_colour_by_microbatch():
    trace = ringlab.run(pipeline, [np.ones(100)] * 3, network=NET).trace
    ax = plot_gantt(trace, color_by="microbatch")
    assert legend(ax) == ["microbatch 0", "microbatch 1", "microbatch 2", "microbatch 3", NO_SPAN]
    # one colour per microbatch, the same on every rank
    colour = {}
    for p, b in zip([p for p in ax.patches if p.get_gid() == "compute"],
                    [b for b in gantt_bars(trace, color_by="microbatch") if b["kind"] == "compute"]):
        colour.setdefault(b["key"], p.get_facecolor())
        assert p.get_facecolor() == colour[b["key"]]
    assert len(set(colour.values())) == 4
    # the numbers written in the bars are the microbatches
    assert sorted(t.get_text() for t in ax.texts if t.get_text().isdigit()) == sorted("0123" * 3)


def test_no_junk_in_the_legend():
    def program(comm, x):
        comm.compute(1e-3)                       # default label "compute", no meta
        if comm.rank == 0:
            comm.send(x, 1)                      # outside any collective
        elif comm.rank == 1:
            comm.recv(0)
        return x
    ax = plot_gantt(ringlab.run(program, [np.ones(2)] * 2, network=NET).trace, color_by="layer")
    assert legend(ax) == ["compute", NO_SPAN]     # no "None", no "layer None"


def test_untimed_trace_falls_back_to_step_time():
    trace = ringlab.run(ring_allreduce, [np.ones(8)] * 4).trace
    ax = plot_gantt(trace, ranks=[0, 2])
    # no compute: no compute lane; send at y = 2.6 i, recv at 2.6 i + 1 for the i-th rank drawn
    assert drawn(ax, "compute") == []
    assert close(drawn(ax, "send"), sorted(((e.step - 1) * 1e-3, 1e-3, 2.6 * [0, 2].index(e.src))
                                                     for e in trace if e.src in (0, 2)))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["send", "recv"] * 2
    assert "StepTime" in ax.get_xlabel()
    assert legend(ax) == ["ring_allreduce"]


def test_draws_into_a_given_axes(overlap_trace):
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(2, 1)
    assert plot_gantt(overlap_trace, ax=b, title="mine") is b
    assert b.get_title() == "mine" and not a.patches
