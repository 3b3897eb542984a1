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
