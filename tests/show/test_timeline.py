"""ringlab.show.timeline: time models and the Chrome Trace Event export.

The export is checked with an independent validator of the Trace Event format
(as documented for chrome://tracing and Perfetto's JSON importer): required
fields, durations on complete events, time order per track, and a JSON round trip.
"""

import json
from collections import defaultdict

import numpy as np
import pytest

import ringlab
from ringlab import Event, Trace
from ringlab.collectives import ring_allreduce
from ringlab.show.timeline import AlphaBeta, StepTime, event_times, to_chrome_trace
from ringlab.show.views import alpha_beta_time

PHASES = {"X", "B", "E", "i", "I", "M", "s", "t", "f", "C", "b", "e", "n"}


def validate(doc):
    """Raise AssertionError unless ``doc`` is valid Trace Event JSON; returns the events."""
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    last = {}
    for ev in events:
        for field in ("ph", "ts", "pid", "tid", "name"):
            assert field in ev, f"{field} missing in {ev}"
        assert ev["ph"] in PHASES
        assert isinstance(ev["ts"], (int, float)) and isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
        if ev["ph"] in "stf":
            assert "id" in ev
        if ev["ph"] != "M":
            track = ev["pid"], ev["tid"]
            assert ev["ts"] >= last.get(track, float("-inf")), f"time goes back on track {track}"
            last[track] = ev["ts"]
    return events


def ring(n, length=8):
    return ringlab.run(ring_allreduce, [np.ones(length)] * n).trace


def slices(events, cat):
    return [e for e in events if e["ph"] == "X" and e["cat"] == cat]


def test_step_time():
    trace = ring(3)
    assert event_times(trace, StepTime(unit=2.0)) == [((e.step - 1) * 2.0, 2.0) for e in trace]
    assert event_times(trace)[0] == (0.0, 1e-3)                # default: a step is 1 ms


def test_alpha_beta_matches_closed_form():
    # Ring AllReduce of n bytes on N ranks: 2(N-1) steps of n/N bytes per port:
    # 2(N-1) alpha + 2(N-1)/N n beta. 16 float64 = 128 bytes on N=4.
    alpha, beta, n_bytes, world = 3e-6, 1e-9, 128, 4
    trace = ring(world, 16)
    times = event_times(trace, AlphaBeta(alpha, beta))
    end = max(s + d for s, d in times)
    assert end == pytest.approx(2 * (world - 1) * alpha + 2 * (world - 1) / world * n_bytes * beta)
    assert end == pytest.approx(alpha_beta_time(trace, alpha, beta))


def test_custom_time_models_and_errors():
    trace = ring(2)
    assert event_times(trace, lambda e: (10 * e.step, 1)) == [(10.0 * e.step, 1.0) for e in trace]

    class Fixed:
        def times(self, trace):
            return [(0, 5)] * len(trace)
    assert event_times(trace, Fixed()) == [(0.0, 5.0)] * len(trace)
    with pytest.raises(ValueError, match="duration >= 0"):
        event_times(trace, lambda e: (0, -1))
    with pytest.raises(ValueError, match="expected \\(start, duration\\)"):
        event_times(trace, lambda e: "soon")
    with pytest.raises(TypeError, match="time_model"):
        event_times(trace, 3)


def test_chrome_trace_ring_validates_and_round_trips():
    trace = ring(4)
    doc = trace.to_chrome_trace()
    events = validate(doc)
    again = json.loads(json.dumps(doc))
    assert len(again["traceEvents"]) == len(events)
    validate(again)
    # one track group per rank, named
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == [f"rank {r}" for r in range(4)]
    sends, recvs, spans = slices(events, "send"), slices(events, "recv"), slices(events, "span")
    assert len(sends) == len(recvs) == len(trace) == 24
    assert len(spans) == 4                                     # one ring_allreduce per rank
    by_rank = {name: pid for pid, name in names.items()}
    for e, s in zip(sorted(trace, key=lambda e: (e.src, e.step)),
                    sorted(sends, key=lambda s: (s["pid"], s["ts"]))):
        assert s["pid"] == by_rank[f"rank {e.src}"]
        assert s["args"] == {"step": e.step, "src": e.src, "dst": e.dst, "chunk": e.chunk, "op": e.op,
                             "bytes": e.nbytes, "span": "ring_allreduce", "tag": 0,
                             "group": None, "stream": 0}
        assert (s["ts"], s["dur"]) == pytest.approx(((e.step - 1) * 1000.0, 1000.0))   # µs
    # flows: one start at each send and one finish at each receive, same ids
    starts = {e["id"] for e in events if e["ph"] == "s"}
    finishes = {e["id"] for e in events if e["ph"] == "f"}
    assert starts == finishes and len(starts) == 24
    # each span encloses its rank's messages: steps 0..6 -> 0..6000 µs
    for sp in spans:
        assert (sp["ts"], sp["dur"]) == (0.0, 6000.0)


def test_nested_spans_enclose():
    def program(comm, x):
        with comm.span("train_step"):
            return ring_allreduce(comm, ring_allreduce(comm, x))
    trace = ringlab.run(program, [np.ones(4)] * 2).trace
    events = validate(to_chrome_trace(trace, AlphaBeta(1.0, 0.0)))
    for rank_pid in (1, 2):
        mine = [e for e in slices(events, "span") if e["pid"] == rank_pid]
        outer = [e for e in mine if e["name"] == "train_step"]
        inner = [e for e in mine if e["name"] == "ring_allreduce"]
        assert len(outer) == 1 and len(inner) == 2
        # alpha = 1 s per step, 2 steps per allreduce: inner [0, 2 s], [2 s, 4 s]; outer [0, 4 s]
        assert (outer[0]["ts"], outer[0]["dur"]) == (0.0, 4e6)
        assert sorted((e["ts"], e["dur"]) for e in inner) == [(0.0, 2e6), (2e6, 2e6)]


def test_overlapping_receives_get_lanes():
    # Three ranks all send to rank 0 in step 1: rank 0's three receives overlap in
    # time, so they go on three lanes ("recv", "recv 2", "recv 3"), one slice each.
    trace = Trace([Event(1, r, 0, nbytes=8) for r in (1, 2, 3)], 4)
    events = validate(to_chrome_trace(trace))
    recvs = slices(events, "recv")
    assert len({(e["pid"], e["tid"]) for e in recvs}) == 3
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(thread_names[e["pid"], e["tid"]] for e in recvs) == ["recv", "recv 2", "recv 3"]
    per_track = defaultdict(list)
    for e in slices(events, "send") + recvs:
        per_track[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in per_track.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "slices overlap on one track"


def test_no_flows_option_and_empty_trace():
    doc = to_chrome_trace(ring(2), flows=False)
    assert not [e for e in doc["traceEvents"] if e["ph"] in "sf"]
    empty = to_chrome_trace(Trace([], 3))
    assert [e for e in empty["traceEvents"] if e["ph"] != "M"] == []


# -- simulated times, compute and groups ------------------------------------------------

NET = ringlab.AlphaBeta(alpha=1e-5, beta=1e-9)


def overlapped(comm, x):
    """A data-parallel step in miniature: the AllReduce of one layer's gradient runs on
    the communication stream while the previous layer's backward computes."""
    comm.compute(2e-3, "forward", microbatch=0)
    comm.compute(1e-3, "backward", layer=1)
    work = comm.start(ring_allreduce, x)
    comm.compute(1e-3, "backward", layer=0)
    return work.wait()


def test_default_times_are_the_simulated_ones():
    trace = ringlab.run(overlapped, [np.ones(4000)] * 4, network=NET).trace
    assert event_times(trace) == [(e.start, e.end - e.start) for e in trace]
    # 4000 float64 on 4 ranks: 8000-byte chunks, each message alpha + 8000 beta = 18 us,
    # starting when the AllReduce starts (3 ms, after forward and the first backward).
    assert trace[0].start == pytest.approx(3e-3) and trace[0].end - trace[0].start == pytest.approx(18e-6)
    untimed = ring(3)
    assert event_times(untimed) == event_times(untimed, StepTime())


def test_chrome_trace_uses_simulated_times_and_shows_compute():
    trace = ringlab.run(overlapped, [np.ones(4000)] * 4, network=NET).trace
    events = validate(to_chrome_trace(trace))
    sends = slices(events, "send")
    assert len(sends) == len(trace) == 24
    expected = sorted((e.src + 1, e.start * 1e6, (e.end - e.start) * 1e6) for e in trace)
    got = sorted((s["pid"], s["ts"], s["dur"]) for s in sends)
    assert got == [pytest.approx(x) for x in expected]
    assert all(s["args"]["stream"] == 1 for s in sends)          # all sent by comm.start's work
    computes = slices(events, "compute")
    assert len(computes) == len(trace.computes) == 12            # 3 per rank
    assert sorted((c["pid"], c["ts"], c["dur"], c["name"]) for c in computes) == [
        pytest.approx((c.rank + 1, c.start * 1e6, c.duration * 1e6, c.label)) for c in
        sorted(trace.computes, key=lambda c: (c.rank, c.start))]
    first = min((c for c in computes if c["pid"] == 1), key=lambda c: c["ts"])
    assert first["args"] == {"rank": 0, "step": 0, "stream": 0, "microbatch": 0}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {threads[c["pid"], c["tid"]] for c in computes} == {"compute"}
    # The AllReduce's span is on the stream's own track, from 3 ms to 3 ms + 6 messages.
    spans = slices(events, "span")
    assert {threads[s["pid"], s["tid"]] for s in spans} == {"stream 1 calls"}
    assert all((s["ts"], s["dur"]) == pytest.approx((3000.0, 6 * 18.0)) for s in spans)
    doc = to_chrome_trace(trace)
    assert doc["otherData"]["time_model"] == "SimulatedTime()"
    # An explicit model still wins: StepTime puts step s at (s - 1) ms.
    steps = slices(validate(to_chrome_trace(trace, StepTime())), "send")
    assert sorted(s["ts"] for s in steps) == sorted((e.step - 1) * 1000.0 for e in trace)


def test_chrome_trace_group_labels():
    def program(comm, x):
        pair = comm.split(comm.rank // 2, name="dp")
        return ring_allreduce(pair, x)
    trace = ringlab.run(program, [np.ones(4)] * 4).trace
    events = validate(to_chrome_trace(trace))
    assert {s["args"]["group"] for s in slices(events, "send")} == {"dp[0]", "dp[1]"}
    assert {s["args"]["group"] for s in slices(events, "span")} == {"dp[0]", "dp[1]"}
    # a group named by its ranks: the tuple becomes a JSON list
    def unnamed(comm, x):
        g = comm.new_group([0, 1])
        return ring_allreduce(g, x) if g else x
    doc = to_chrome_trace(ringlab.run(unnamed, [np.ones(2)] * 3).trace)
    assert {s["args"]["group"] == [0, 1] for s in slices(validate(json.loads(json.dumps(doc))), "send")} == {True}


def test_simulated_time_needs_a_timed_trace():
    from ringlab.show.timeline import SimulatedTime
    with pytest.raises(ValueError, match="network="):
        event_times(ring(2), SimulatedTime())
