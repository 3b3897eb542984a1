"""Timelines: when each message of a trace happens, and a Chrome/Perfetto export.

A trace run with ``network=`` (``ringlab.run(..., network=AlphaBeta(...))``)
knows when every message travelled, in simulated seconds: ``event.start`` and
``event.end``. That is what every view here uses by default (``SimulatedTime``).
A trace without a network knows *steps*, not times; then a **time model** turns
every event into a ``(start, duration)`` pair in seconds. Two are built in:

- ``StepTime(unit)``: step ``s`` is the window ``[(s - 1) * unit, s * unit]``;
  every message of step ``s`` fills it. The default for an untimed trace
  (one step = 1 ms).
- ``AlphaBeta(alpha, beta)``: a step costs ``alpha + beta * bytes`` of the busiest
  port in it (as in ``ringlab.show.views.alpha_beta_time``); a message starts when its
  step starts and lasts ``alpha + beta * nbytes``.

Any function ``event -> (start, duration)`` works too, and so does any object
with a ``times(trace)`` method returning one pair per event (in trace order):
later chapters plug in simulated times that way.

``plot_gantt(trace)`` draws one row per rank: compute as wide bars, each
message as a thin bar on its sender's send port and its receiver's receive port.
It is the picture of overlap (does the gradient AllReduce hide behind the
backward pass?) and of pipeline bubbles.

``to_chrome_trace(trace)`` gives the Trace Event format that Perfetto
(ui.perfetto.dev, works offline once loaded) and ``chrome://tracing`` open::

    >>> import json, numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> trace = ringlab.run(ring_allreduce, [np.ones(8)] * 4).trace
    >>> doc = to_chrome_trace(trace, AlphaBeta(alpha=5e-6, beta=1e-9))
    >>> sum(e["ph"] == "X" and e["cat"] == "send" for e in doc["traceEvents"])
    24
    >>> with open("ring.json", "w") as f:       # doctest: +SKIP
    ...     json.dump(doc, f)                   # then drag ring.json into Perfetto
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict

from ..cost.alpha_beta import AlphaBeta  # noqa: F401 - a time model too
from ..trace import VIEWS
from .views import step_bytes


class StepTime:
    """Step ``s`` lasts from ``(s - 1) * unit`` to ``s * unit`` seconds."""

    def __init__(self, unit=1e-3):
        if not unit > 0:
            raise ValueError(f"StepTime(unit={unit!r}): unit must be > 0 seconds")
        self.unit = unit

    def times(self, trace):
        u = self.unit
        return [((e.step - 1) * u, u) for e in trace]

    def __repr__(self):
        return f"StepTime(unit={self.unit!r})"


class SimulatedTime:
    """The times the simulator recorded: ``(event.start, event.end - event.start)``.
    Only for a trace run with a network model (``network=``)."""

    def times(self, trace):
        if not is_timed(trace):
            raise ValueError("this trace has no simulated message times: run it with "
                             "network=ringlab.AlphaBeta(...), or pass a time model such as StepTime()")
        return [(e.start, e.end - e.start) for e in trace]

    def __repr__(self):
        return "SimulatedTime()"


def is_timed(trace):
    """True if every message of ``trace`` has simulated times (the run had ``network=``)."""
    return all(e.start is not None and e.end is not None for e in trace)


def default_time_model(trace):
    """``SimulatedTime()`` for a trace with simulated times, else ``StepTime()``.
    (A trace without messages counts as timed: its computes carry their own times.)"""
    return SimulatedTime() if is_timed(trace) else StepTime()


def event_times(trace, time_model=None):
    """``[(start, duration), ...]``, one pair per event of ``trace`` in order.
    ``time_model=None``: the simulated times if the trace has them, else ``StepTime()``."""
    model = default_time_model(trace) if time_model is None else time_model
    if hasattr(model, "times"):
        times = list(model.times(trace))
    elif callable(model):
        times = [model(e) for e in trace]
    else:
        raise TypeError(f"time_model must be a function event -> (start, duration) or have a "
                        f"times(trace) method; got {model!r}")
    if len(times) != len(trace):
        raise ValueError(f"time model {model!r} gave {len(times)} times for {len(trace)} events")
    out = []
    for e, pair in zip(trace, times):
        try:
            start, dur = (float(v) for v in pair)
        except (TypeError, ValueError):
            raise ValueError(f"time model {model!r} returned {pair!r} for {e.describe()}; "
                             f"expected (start, duration) in seconds") from None
        if not (math.isfinite(start) and math.isfinite(dur) and dur >= 0):
            raise ValueError(f"time model {model!r} returned start={start}, duration={dur} for "
                             f"{e.describe()}; need finite numbers and duration >= 0")
        out.append((start, dur))
    return out


def step_ends(trace, times):
    """``ends[s]``: when everything of steps ``1..s`` is over (``ends[0] = 0``)."""
    ends = [0.0] * (trace.steps + 1)
    for e, (start, dur) in zip(trace, times):
        ends[e.step] = max(ends[e.step], start + dur)
    for s in range(1, len(ends)):
        ends[s] = max(ends[s], ends[s - 1])      # "steps 1..s", so never earlier than s - 1
    return ends


def span_times(trace, times):
    """``[(span, start, end), ...]``: a span covers its rank's steps ``start+1 .. end``,
    and at least every message that rank sent inside it."""
    ends = step_ends(trace, times)
    sends = defaultdict(list)                    # rank -> [(event, start, end)] of its sends
    for e, (a, d) in zip(trace, times):
        sends[e.src].append((e, a, a + d))
    out = []
    for sp in trace.spans:
        t0, t1 = ends[min(sp.start, trace.steps)], ends[min(sp.end, trace.steps)]
        # Its rank's sends inside it: same path (or nested under it) and within its
        # steps (two calls of one collective have the same path).
        inner = [(a, b) for e, a, b in sends[sp.rank]
                 if sp.start < e.step <= sp.end and (e.span + "/").startswith(sp.path + "/")]
        t0 = min([t0] + [a for a, _ in inner])
        t1 = max([t1] + [b for _, b in inner])
        out.append((sp, t0, t1))
    return out


def _lanes(slices):
    """Give each (start, dur, ...) slice a lane so slices in one lane never overlap
    (a viewer draws one row per lane; overlapping slices in a row would nest wrongly)."""
    lane_end, lanes = [], []
    for i in sorted(range(len(slices)), key=lambda i: (slices[i][0], -slices[i][1])):
        start, dur = slices[i][0], slices[i][1]
        k = next((k for k, end in enumerate(lane_end) if end <= start + 1e-12), None)
        if k is None:
            k = len(lane_end)
            lane_end.append(0.0)
        lane_end[k] = start + dur
        lanes.append((i, k))
    return dict(lanes), len(lane_end)


def to_chrome_trace(trace, time_model=None, *, flows=True):
    """The trace in Chrome's Trace Event format: ``{"traceEvents": [...]}``.

    One process per rank (named ``rank r``) with these tracks (threads):

    - ``calls``: the collective calls (spans) of the program;
    - ``compute``: its ``comm.compute`` slices (only if it has any);
    - ``stream 1 calls``, ``stream 1 compute``: the same for the works started
      with ``comm.start``, which run beside the program (only if there are any);
    - ``send`` and ``recv``: one slice per message (extra ``send 2``/``recv 2``
      lanes only if a time model makes slices overlap);
    - ``memory``: a counter of the bytes it holds, one series per label
      (``comm.alloc``/``free``; only if it has any), stacked in chrome://tracing.

    Messages carry step, chunk, op, bytes, span, tag, group and stream as args;
    ``flows=True`` adds an arrow from each send to its receive. Times are
    microseconds, as the format wants. ``time_model=None``: the simulated times
    when the run had a network model (spans then run from ``t_start`` to
    ``t_end``), else ``StepTime()``. Compute slices always sit at their
    simulated seconds.
    """
    model = default_time_model(trace) if time_model is None else time_model
    times = event_times(trace, model)
    us = 1e6
    out, meta = [], []
    pid = {r: r + 1 for r in range(trace.world_size)}   # pid 0 means "idle" to some viewers
    if isinstance(model, SimulatedTime):     # the simulator's own clock: exact
        spans = [(sp, sp.t_start, sp.t_end) for sp in trace.spans]
    else:                                    # spans follow the modelled message times
        spans = span_times(trace, times)
    # Every slice of a rank, by track: (start, dur, what) with what = an event index,
    # a Span or a Compute.
    tracks = defaultdict(lambda: defaultdict(list))
    for i, (e, (start, dur)) in enumerate(zip(trace, times)):
        tracks[e.src]["send"].append((start, dur, i))
        tracks[e.dst]["recv"].append((start, dur, i))
    for sp, t0, t1 in spans:
        tracks[sp.rank]["stream 1 calls" if sp.stream else "calls"].append((t0, t1 - t0, sp))
    for c in trace.computes:
        tracks[c.rank]["stream 1 compute" if c.stream else "compute"].append((c.start, c.duration, c))
    where = {}                 # (rank, track, index in that track) -> tid
    for r in range(trace.world_size):
        p = pid[r]
        meta += [_meta("process_name", p, 0, name=f"rank {r}"),
                 _meta("process_sort_index", p, 0, sort_index=r),
                 _meta("thread_name", p, p * 1000, name="calls"),
                 _meta("thread_sort_index", p, p * 1000, sort_index=p * 1000)]
        tid = p * 1000 + 1
        for kind in ("calls", "compute", "stream 1 calls", "stream 1 compute", "send", "recv"):
            mine = tracks[r][kind]
            if kind == "calls":     # the program's spans nest: one track, as before
                where.update({(r, kind, j): p * 1000 for j in range(len(mine))})
                continue
            lanes, count = _lanes(mine)
            for k in range(count):
                meta.append(_meta("thread_name", p, tid + k, name=kind if k == 0 else f"{kind} {k + 1}"))
                meta.append(_meta("thread_sort_index", p, tid + k, sort_index=tid + k))
            where.update({(r, kind, j): tid + lanes[j] for j in range(len(mine))})
            tid += count
    message_tid = {}
    for r, kinds in tracks.items():
        for kind in ("send", "recv"):
            for j, (_, _, i) in enumerate(kinds[kind]):
                message_tid[r, kind, i] = where[r, kind, j]
    for i, (e, (start, dur)) in enumerate(zip(trace, times)):
        args = {"step": e.step, "src": e.src, "dst": e.dst, "chunk": _jsonable(e.chunk),
                "op": e.op, "bytes": e.nbytes, "span": e.span, "tag": e.tag,
                "group": _jsonable(e.group), "stream": e.stream}
        what = "" if e.chunk is None else f" c{e.chunk}"
        for kind, rank, peer in (("send", e.src, f"→ {e.dst}"), ("recv", e.dst, f"← {e.src}")):
            out.append({"name": f"{kind}{what} {peer}", "cat": kind, "ph": "X", "ts": start * us,
                        "dur": dur * us, "pid": pid[rank], "tid": message_tid[rank, kind, i],
                        "args": args})
        if flows:   # an arrow in the viewer from the send slice to the receive slice
            common = {"name": "message", "cat": "message", "id": i, "ts": start * us}
            out.append({**common, "ph": "s", "pid": pid[e.src], "tid": message_tid[e.src, "send", i]})
            out.append({**common, "ph": "f", "bp": "e", "pid": pid[e.dst],
                        "tid": message_tid[e.dst, "recv", i]})
    for r, kinds in tracks.items():
        for kind in ("calls", "stream 1 calls", "compute", "stream 1 compute"):
            for j, (t0, dur, x) in enumerate(kinds[kind]):
                if kind.endswith("calls"):
                    name, cat = x.name, "span"
                    args = {"path": x.path, "rank": x.rank, "start_step": x.start,
                            "end_step": x.end, "group": _jsonable(x.group), "stream": x.stream}
                else:
                    name, cat = x.label, "compute"
                    args = {"rank": x.rank, "step": x.step, "stream": x.stream,
                            **{k: _jsonable(v) for k, v in x.meta}}
                out.append({"name": name, "cat": cat, "ph": "X", "ts": t0 * us, "dur": dur * us,
                            "pid": pid[r], "tid": where[r, kind, j], "args": args})
    out += _memory_counters(trace, pid, us)
    # Per track in time order; at equal times the longer slice first, so that an
    # enclosing slice (a span) comes before what it encloses, and a flow after its slice.
    order = {"X": 0, "C": 0, "s": 1, "f": 1}
    out.sort(key=lambda ev: (ev["pid"], ev["tid"], ev["ts"], order[ev["ph"]], -ev.get("dur", 0)))
    return {"traceEvents": meta + out, "displayTimeUnit": "ms",
            "otherData": {"world_size": trace.world_size, "steps": trace.steps,
                          "time_model": repr(model)}}


def _memory_counters(trace, pid, us):
    """One "C" (counter) event per memory event: every label the rank ever
    held, with its bytes after that event (0 once freed, so the series drop)."""
    out, held = [], defaultdict(dict)           # rank -> {label: bytes}
    for m in trace.memory:
        mine = held[m.rank]
        mine[m.label] = mine.get(m.label, 0) + m.nbytes
        out.append({"name": "memory", "cat": "memory", "ph": "C", "ts": m.time * us,
                    "pid": pid[m.rank], "tid": 0, "args": dict(mine)})
    return out


def _meta(what, pid, tid, **args):
    return {"name": what, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _jsonable(label):
    """A chunk label, group label or meta value as JSON: a group's tuple of ranks
    becomes a list, anything else unusual its repr."""
    if hasattr(label, "item"):          # a numpy number used as a label
        label = label.item()
    if isinstance(label, tuple) and all(isinstance(v, int) for v in label):
        return list(label)
    return label if label is None or isinstance(label, (int, float, str, bool)) else repr(label)


# -- the per-rank timeline (Gantt chart) --------------------------------------------------

# Compute in cool colours, messages in warm ones, so the two never get confused.
COMPUTE_COLOURS = ["#4e79a7", "#59a14f", "#76b7b2", "#b07aa1", "#9c755f", "#bab0ac",
                   "#86bcb6", "#8cd17d", "#a0cbe8", "#d4a6c8"]
COMM_COLOURS = ["#f28e2b", "#e15759", "#edc948", "#ff9da7", "#d37295", "#fabfd2", "#b6992d"]
WIDTH = 7.9          # inches: about the 772 px of the book's column at 100 dpi
NO_SPAN = "point-to-point"       # the legend's name for messages sent outside any collective


def gantt_bars(trace, *, color_by="label", time_model=None):
    """What ``plot_gantt`` draws, one dict per bar, in seconds:
    ``rank``, ``kind`` (``"compute"``, ``"send"`` or ``"recv"``), ``stream``,
    ``start``, ``end``, ``key`` (its legend entry) and ``text`` (written in the bar).

    A compute bar's key is its label, or with ``color_by="microbatch"`` (any meta
    key) ``"microbatch 3"``; a compute without that key keeps its label. A message
    gives two bars, one on the sender's send port and one on the receiver's
    receive port, keyed by its innermost collective (``NO_SPAN`` outside any).
    """
    bars = []
    for c in trace.computes:
        if color_by == "label":
            key, text = c.label, c.label
        elif color_by in dict(c.meta):
            value = c.get(color_by)
            key, text = f"{color_by} {value}", str(value)
        else:
            key, text = c.label, c.label
        bars.append(dict(rank=c.rank, kind="compute", stream=c.stream, start=c.start, end=c.end,
                         key=key, text=text))
    for e, (start, dur) in zip(trace, event_times(trace, time_model)):
        key = e.span.rsplit("/", 1)[-1] or NO_SPAN
        for kind, rank in (("send", e.src), ("recv", e.dst)):
            bars.append(dict(rank=rank, kind=kind, stream=e.stream, start=start, end=start + dur,
                             key=key, text=""))
    return bars


def _time_unit(seconds):
    """A readable unit for a span of ``seconds``: (factor, name)."""
    if seconds < 1e-3:
        return 1e6, "µs"
    if seconds < 1:
        return 1e3, "ms"
    return 1.0, "s"


def plot_gantt(trace, ax=None, *, color_by="label", ranks=None, title=None, time_model=None):
    """A per-rank timeline: time to the right, one band per rank (rank 0 on top).

    Each band has a ``compute`` lane (``comm.compute`` bars, coloured by label or
    by a meta key: ``color_by="microbatch"``), a ``stream 1`` lane if works
    started with ``comm.start`` compute, and a ``send``/``recv`` lane pair: the
    rank's two ports in the one-port model, each busy with at most one message at
    a time. A message is a thin bar on its sender's send port and its receiver's
    receive port, coloured by its collective; hatched if it travels on the
    communication stream (``comm.start``). The dashed line is the makespan.

    Times: the simulated seconds of a run with ``network=``; for an untimed
    trace ``StepTime()`` (one step = 1 ms), or pass ``time_model``.
    ``ranks``: which ranks to draw (default all). Returns the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    from .style import PT
    model = default_time_model(trace) if time_model is None else time_model
    bars = gantt_bars(trace, color_by=color_by, time_model=model)
    ranks = list(range(trace.world_size)) if ranks is None else list(ranks)
    shown = set(ranks)
    bars = [b for b in bars if b["rank"] in shown]
    end = max([b["end"] for b in bars] + [trace.time if set(ranks) == set(range(trace.world_size))
                                          else 0.0], default=0.0) or 1e-3

    # Lanes: y positions, rank 0 on top. A lane is 1 unit tall; ranks 0.6 apart.
    lanes = ["compute"] if any(b["kind"] == "compute" for b in bars) else []
    if any(b["kind"] == "compute" and b["stream"] for b in bars):
        lanes.append("stream 1")
    lanes += ["send", "recv"]
    band = len(lanes) + 0.6
    lane_y = {(r, lane): i * band + j for i, r in enumerate(ranks) for j, lane in enumerate(lanes)}

    if ax is None:      # margins in inches, for 12-point text (ringlab.show.style)
        height = min(9.0, 1.3 + 0.26 * band * len(ranks))
        fig, ax = plt.subplots(figsize=(WIDTH, height))
        fig.subplots_adjust(left=1.6 / WIDTH, right=1 - 2.05 / WIDTH, bottom=0.65 / height,
                            top=1 - 0.4 / height)

    def colours(keys, palette):
        return {k: palette[i % len(palette)] for i, k in enumerate(keys)}
    compute_keys = list(dict.fromkeys(b["key"] for b in sorted(bars, key=lambda b: b["start"])
                                      if b["kind"] == "compute"))
    if color_by != "label":       # microbatch 0, 1, 2, ... in numeric order
        compute_keys.sort(key=lambda k: (not k.startswith(color_by + " "), _natural(k)))
    comm_keys = list(dict.fromkeys(b["key"] for b in sorted(bars, key=lambda b: b["start"])
                                   if b["kind"] != "compute"))
    colour = {**colours(compute_keys, COMPUTE_COLOURS), **colours(comm_keys, COMM_COLOURS)}

    # A character's share of the axis width (the axes' width in points, as laid out now).
    char = 0.62 * PT / max(ax.get_position().width * ax.figure.get_figwidth() * 72, 1.0)
    for b in bars:
        if b["kind"] == "compute":
            y, h = lane_y[b["rank"], "stream 1" if b["stream"] else "compute"], 0.8
        else:
            y, h = lane_y[b["rank"], b["kind"]], 0.55      # thinner: a port, not the rank's work
        rect = ax.barh(y, b["end"] - b["start"], left=b["start"], height=h, color=colour[b["key"]],
                       edgecolor="white", linewidth=1.0,    # white gaps between back-to-back bars
                       hatch="////" if b["kind"] != "compute" and b["stream"] else None,
                       hatchcolor=(1, 1, 1, 0.7), zorder=2)[0]
        rect.set_gid(b["kind"])
        # A label only where it fits (a character about 0.62 em wide); a clipped
        # label reads as noise.
        if b["text"] and b["end"] - b["start"] >= char * (len(b["text"]) + 1) * end:
            txt = _bar_label_class()(b["start"], b["end"], y, b["text"], h, ha="center",
                                      va="center", fontsize=PT, color="white", zorder=3)
            ax._add_text(txt)
            txt.set_clip_path(rect)         # never spill over a short bar,
            txt.set_clip_box(ax.bbox)       # nor out of a zoomed-in axis
            # Inside its bar, which the axes clip: it never needs room of its own, and a
            # label off a zoomed-in axis must not widen the saved figure.
            txt.set_in_layout(False)

    # The makespan: when the last rank is done.
    ax.axvline(end, color="0.35", ls="--", lw=0.9, zorder=1)
    scale, unit = _time_unit(end)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x * scale:g}"))
    timed = isinstance(model, SimulatedTime)
    ax.set_xlabel(f"simulated time ({unit})" if timed else f"time ({unit}; messages: {model!r})")
    ax.set_xlim(0, end * 1.02)

    # y: the lane names, and "rank r" further left (past the longest lane name).
    # Lane names only where a 12-point name has its room (0.17 in a lane; else the bars'
    # height tells compute from the ports).
    ys = sorted(lane_y.items(), key=lambda kv: kv[1])
    units = lane_y[ranks[-1], lanes[-1]] + 1.4
    room = ax.get_position().height * ax.figure.get_figheight() / units >= 0.17
    ax.set_yticks([y for _, y in ys], [lane if room else "" for (_, lane), _ in ys], fontsize=PT)
    ax.tick_params(axis="y", length=0)
    left = -(0.62 * PT * max(len(lane) for lane in lanes) + 10) if room else -6
    for r in ranks:
        middle = (lane_y[r, lanes[0]] + lane_y[r, lanes[-1]]) / 2
        ax.annotate(f"rank {r}", xy=(0, middle), xycoords=("axes fraction", "data"),
                    xytext=(left, 0), textcoords="offset points", ha="right", va="center",
                    fontsize=PT, fontweight="bold")
    ax.set_ylim(lane_y[ranks[-1], lanes[-1]] + 0.7, -0.7)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="0.92", zorder=0)
    ax.set_axisbelow(True)

    handles = [Patch(color=colour[k], label=k) for k in compute_keys + comm_keys]
    if any(b["kind"] != "compute" and b["stream"] for b in bars):
        handles.append(Patch(facecolor="0.6", edgecolor="white", hatch="////", hatchcolor="white",
                             label="comm.start stream"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=PT,
                  frameon=False, handlelength=1.2, handletextpad=0.4, borderaxespad=0)
    scale_t, unit_t = _time_unit(trace.time or end)
    ax.set_title(title or f"Timeline: {len(ranks)} ranks, "
                          f"{(trace.time or end) * scale_t:.4g} {unit_t}", fontsize=PT)
    return ax


@functools.cache
def _bar_label_class():
    """``BarLabel`` (made on first use: matplotlib is imported only to draw)."""
    from matplotlib.text import Text

    class BarLabel(Text):
        """A bar's label, drawn in the middle of the bar's visible part, and only
        if it fits there whole (a zoomed-in axis cuts bars, a crowded figure thins
        them: half a word is noise). ``height``: the bar's, in data units."""

        def __init__(self, start, end, y, text, height, **kwargs):
            super().__init__((start + end) / 2, y, text, **kwargs)
            self.span, self.height = (start, end), height

        def draw(self, renderer):
            x0, x1 = sorted(self.axes.get_xlim())
            a, b = max(self.span[0], x0), min(self.span[1], x1)
            if b <= a:
                return
            self.set_x((a + b) / 2)
            y = self.get_position()[1]
            (left, bottom), (right, top) = self.axes.transData.transform(
                [(a, y - self.height / 2), (b, y + self.height / 2)])
            box = self.get_window_extent(renderer)
            if box.width + 6 <= right - left and 0.75 * box.height <= abs(top - bottom):
                super().draw(renderer)
    return BarLabel


def _natural(text):
    """Sort key: "microbatch 10" after "microbatch 9"."""
    head, _, tail = text.rpartition(" ")
    return (head, 0, float(tail), "") if tail.replace(".", "", 1).lstrip("-").isdigit() else (head, 1, 0, tail)


VIEWS["chrome_trace"] = to_chrome_trace         # trace.to_chrome_trace() hands the trace here
