"""The player's views of a strategy, read from the trace's own spans, computes and memory.

The ring view of ``player_data`` shows messages and which contributions each
chunk holds: the collective. Two more views show the training strategy around
it, each built only when the trace has what it draws:

- ``"memory"`` (the trace has ``comm.alloc``/``free`` events): per rank, the
  bytes held under each label over the steps, stacked, with the current step
  marked; a ZeRO-3 / FSDP unit's gathered ``params.full`` appears at its
  AllGather and goes at its reshard. ``memory_frames`` is what it draws.
- ``"lanes"`` (the trace has computes, or more than one span on a rank): per rank (and per stream:
  ``comm.start`` works get a row of their own), a timeline of what it ran: its
  computes and its spans, nested spans one row below their parent, lit while
  the current step's messages are theirs. Pipeline actions (computes with
  ``mb=`` and ``kind=`` "F"/"B"/"W", as ``run_pipeline`` records them, or a
  label "forward"/"backward", as a learner's loop may) are
  coloured by microbatch, forward light and backward dark; a DDP-style run
  (AllReduces launched with ``comm.start`` during computes labelled
  "backward") numbers each AllReduce as a bucket and colours each backward
  compute as the first bucket to start after it, the bucket it completed when
  the stream was free (see ``_buckets``). The x axis is simulated seconds when
  the run has any, else steps.

``default_view`` picks the one a chapter's run is about: memory when there is
any; lanes for a pipeline, a bucketed backward, or collectives inside named
regions (``tp.attention.forward/ring_allreduce``); else the ring view.

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allgather
    >>> def fsdp_like(comm, w):                   # a learner's loop: gather, use, free
    ...     for layer in range(2):
    ...         comm.alloc("params.full", 8 * len(w))
    ...         full = ring_allgather(comm, w)
    ...         comm.free("params.full", 8 * len(w))
    ...     return full
    >>> trace = ringlab.run(fsdp_like, [np.ones(2)] * 2).trace
    >>> default_view(trace)
    'memory'
    >>> [frame[0] for frame in memory_frames(trace)]      # rank 0 after steps 0, 1, 2
    [{'params.full': 16}, {'params.full': 16}, {}]
"""

from __future__ import annotations

from collections import defaultdict

MAX_ITEMS = 5_000           # lanes: computes + spans drawn (~100 B each); beyond, no lanes

# Colours as the library's figures draw them (show.memory.KNOWN, pipeline.drawing.PALETTE,
# show.timeline's compute and communication colours), so a chapter's figure and its player agree.
MEMORY_KNOWN = {"params": "#1f77b4", "params.full": "#aec7e8", "grads": "#ff7f0e",
                "grads.full": "#ffbb78", "bucket": "#d62728", "master": "#2ca02c",
                "adam.m": "#9467bd", "adam.v": "#8c564b", "activations": "#7f7f7f"}
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]
COMPUTE_COLOURS = ["#4e79a7", "#59a14f", "#76b7b2", "#b07aa1", "#9c755f", "#bab0ac",
                   "#86bcb6", "#8cd17d", "#a0cbe8", "#d4a6c8"]
COLLECTIVE_COLOURS = {"allreduce": "#1f77b4", "allgather": "#2ca02c", "reduce_scatter": "#ff7f0e",
                      "broadcast": "#17becf", "reduce": "#9467bd", "alltoall": "#e377c2"}
REGION = ("#d9d9d9", "#c8c8c8")   # a named region's span (tp.mlp.forward) above its collectives; nested
OTHER = "#7f7f7f"
BUCKET, BUCKET_TEXT = "#bbbbbb", "bN: AllReduce N on stream 1, and the backward computed before it starts"
SHORT = {"allreduce": "AR", "allgather": "AG", "reduce_scatter": "RS", "broadcast": "BC",
         "reduce": "R", "alltoall": "A2A"}


def _shade(colour, kind):
    """Pipeline boxes as ``pipeline.drawing`` draws them: F 45% towards white, B the
    colour, W 35% towards black."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    target, amount = {"F": (255, 0.45), "W": (0, 0.35)}.get(kind, (0, 0.0))
    return "#" + "".join(f"{round(c + (target - c) * amount):02x}" for c in rgb)


def _collective(name):
    """``"ring_reduce_scatter"`` -> ``"reduce_scatter"``: the kind of collective a span
    name says it is, or None."""
    name = name.lower()
    for kind in ("reduce_scatter", "allreduce", "allgather", "alltoall", "broadcast", "reduce"):
        if kind in name or kind.replace("_", "") in name.replace("_", ""):
            return kind
    return None


# -- memory -----------------------------------------------------------------------------------

def memory_frames(trace):
    """``frames[step][rank]`` = ``{label: bytes}`` that ``rank`` holds after ``step``:
    the sum of its ``comm.alloc``/``free`` events at step clocks up to ``step`` (the
    last step also takes any later ones). Labels holding nothing are left out, as in
    ``trace.memory_by_label``."""
    n, steps = trace.world_size, trace.steps
    held = [defaultdict(int) for _ in range(n)]
    by_step = defaultdict(list)
    for m in trace.memory:
        by_step[min(m.step, steps)].append(m)
    frames = []
    for s in range(steps + 1):
        for m in by_step.get(s, ()):
            held[m.rank][m.label] += m.nbytes
        frames.append([{label: b for label, b in h.items() if b} for h in held])
    return frames


def memory_view(trace):
    """The ``"memory"`` view's data, or None without memory events: ``labels`` in order
    of first alloc with their ``colours``, ``deltas`` = ``[step, rank, label index,
    bytes]`` (one per step, rank and label that changed; summing those up to a step
    gives ``memory_frames``), ``peak`` per rank (``trace.peak_memory(rank)``, which
    also counts a buffer taken and given back within one step) and ``max``, the
    largest total after any step."""
    if not trace.memory:
        return None
    labels = list(dict.fromkeys(m.label for m in trace.memory))
    li = {label: i for i, label in enumerate(labels)}
    delta = defaultdict(int)
    for m in trace.memory:
        delta[min(m.step, trace.steps), m.rank, li[m.label]] += m.nbytes
    others = [c for c in COMPUTE_COLOURS if c not in MEMORY_KNOWN.values()]
    unknown = [label for label in labels if label not in MEMORY_KNOWN]
    colours = [MEMORY_KNOWN.get(label) or others[unknown.index(label) % len(others)]
               for label in labels]
    frames = memory_frames(trace)
    return {"labels": labels, "colours": colours,
            "deltas": [[s, r, k, b] for (s, r, k), b in sorted(delta.items()) if b],
            "peak": [trace.peak_memory(r) for r in range(trace.world_size)],
            "max": max(sum(f.values()) for frame in frames for f in frame)}


# -- lanes ------------------------------------------------------------------------------------

KINDS = {"F": "F", "forward": "F", "B": "B", "backward": "B", "W": "W", "weight": "W"}


def _pipeline_kind(c):
    """"F", "B" or "W" for a pipeline action's compute: one with a microbatch ``mb=``
    and a ``kind=`` or label "F"/"forward", "B"/"backward", "W"/"weight"; else None."""
    if c.get("mb") is None:
        return None
    return KINDS.get(c.get("kind", c.label))


def _step_times(trace):
    """``T[s]``: when the last message of steps 1..s ended (simulated seconds), for a
    run whose messages all have times; the last step reaches the end of the run. None
    when messages have no times (then the lanes show whole boxes, step by step)."""
    if not len(trace) or any(e.end is None for e in trace):
        return None
    ends = [0.0] * (trace.steps + 1)
    for e in trace:
        ends[e.step] = max(ends[e.step], e.end)
    for s in range(1, len(ends)):
        ends[s] = max(ends[s], ends[s - 1])
    ends[-1] = max(ends[-1], trace.time)
    return ends


def _first_step(times, t):
    """The first step whose time has passed ``t``."""
    for s in range(len(times)):
        if times[s] > t:
            return s
    return len(times) - 1


def _buckets(trace, computes, spans):
    """``{compute index: bucket}``: in a run whose program launches collectives with
    ``comm.start`` (stream 1) during computes labelled "backward", each backward
    compute gets the number of the first of them to start at or after its end. With
    the stream free, a bucket's AllReduce starts the moment its last gradient is
    ready, so that is the bucket it filled; with the stream still busy with the last
    bucket it starts later, and the trace does not say when it was launched: then a
    number says "computed before AllReduce N started", the most the trace knows."""
    launches = defaultdict(list)
    for s in spans:
        if s.stream == 1 and "/" not in s.path and _collective(s.name):
            launches[s.rank].append(s.t_start)
    if not any(len(v) > 1 for v in launches.values()):
        return {}
    out = {}
    for i, c in enumerate(computes):
        if c.stream == 0 and "backward" in c.label and launches.get(c.rank):
            eps = 1e-9 * max(abs(c.end), 1e-300)
            k = sum(1 for t in launches[c.rank] if t < c.end - eps)
            if k < len(launches[c.rank]):
                out[i] = k
    return out


def lanes_view(trace, parts=None):
    """The ``"lanes"`` view's data, or None when the trace has no spans and no computes
    (or more than MAX_ITEMS of them): ``rows`` = ``[rank, stream, sub-rows]``;
    ``items`` = ``[row, sub-row, x0, x1, at, until, colour, text, title]`` with colour,
    text and title indices into ``colours``, ``texts``, ``titles``: an item is drawn
    after step ``at`` and lit from ``at`` to ``until``; ``time``: x in simulated
    seconds (else steps); ``cursor[step]``: the time reached after each step, when the
    messages have times (items are drawn up to it), else None; ``end``: the x range;
    ``legend``: ``[colour, text]``; ``parts``: one text per rank (who holds what), from
    ``parts=`` (texts, or ``{what: indices}`` per rank, see ``part_text``)."""
    computes, spans = list(trace.computes), list(trace.spans)
    if not computes and not spans or len(computes) + len(spans) > MAX_ITEMS:
        return None
    steps = trace.steps
    timed = trace.time > 0
    times = _step_times(trace) if timed else None
    # A span that is just one compute (a pipeline action "0F1" around its F) is drawn once,
    # as the compute; a region with spans inside it stays.
    coincide = {(c.rank, c.stream, c.start, c.end) for c in computes if c.end > c.start}
    parents = {(s.rank, s.stream, s.path.rsplit("/", 1)[0]) for s in spans if "/" in s.path}
    spans = [s for s in spans if not (s.t_end > s.t_start and (s.rank, s.stream, s.path) not in parents
                                      and (s.rank, s.stream, s.t_start, s.t_end) in coincide)]
    bucket = _buckets(trace, computes, spans)
    labels = sorted({c.label for c in computes})
    pools = {"colours": {}, "texts": {}, "titles": {}}

    def index(pool, value):
        return pools[pool].setdefault(value, len(pools[pool]))

    rows, raw = {}, []
    for s in spans:
        depth = s.path.count("/")
        kind = _collective(s.name)
        if kind is None and (s.rank, s.stream, s.path) in parents:
            colour, text = REGION[min(depth, 1)], s.name   # a named region around other spans
            key = (REGION[0], "named region (span)")
        else:
            colour = COLLECTIVE_COLOURS.get(kind, OTHER)
            text = SHORT.get(kind, s.name)
            key = (colour, s.name if kind is None else f"{text}: {kind}")
        at = min(s.start + 1, s.end) if s.end > s.start else s.start
        x0, x1 = (s.t_start, s.t_end) if timed else (s.start, s.end)
        title = (f"rank {s.rank}: {s.path}" + (f" [group {_group_text(s.group)}]" if s.group is not None else "")
                 + (" on stream 1" if s.stream else "") + f", steps {s.start + 1}–{s.end}"
                 + (f", {_seconds(s.t_start)}–{_seconds(s.t_end)}" if timed else ""))
        raw.append((s.rank, s.stream, depth, x0, x1, at, s.end, colour, text, title, s, key))
    for i, c in enumerate(computes):
        kind = _pipeline_kind(c)
        if kind is not None:
            mb = c.get("mb")
            colour, text = _shade(PALETTE[mb % len(PALETTE)], kind), str(mb)
            key = (_shade("#737373", kind), {"F": "F forward", "B": "B backward",
                                              "W": "W weight grad"}[kind] + ", number: microbatch")
            what = f"stage {c.get('stage')} {kind} of microbatch {mb}" if c.get("stage") is not None \
                else f"{kind} of microbatch {mb}"
        elif i in bucket:
            colour, text = PALETTE[bucket[i] % len(PALETTE)], f"b{bucket[i]}"
            what = f"{c.label} (before AllReduce {bucket[i]} on stream 1 starts)"
            key = (BUCKET, BUCKET_TEXT)
        else:
            colour, text = COMPUTE_COLOURS[labels.index(c.label) % len(COMPUTE_COLOURS)], c.label
            what = c.label
            key = (colour, c.label)
        at = c.step if times is None else max(c.step, _first_step(times, c.start))
        at = min(at, steps)
        x0, x1 = (c.start, c.end) if timed else (c.step, c.step)
        title = (f"rank {c.rank}: {what}" + (" on stream 1" if c.stream else "")
                 + f", {_seconds(c.duration)}" + (f" from {_seconds(c.start)}" if timed else "")
                 + f", after step {c.step}")
        raw.append((c.rank, c.stream, 0, x0, x1, at, at, colour, text, title, None, key))
    # Bucket launches get their bucket's colour and number, like the computes that filled them.
    if bucket:
        per_rank = defaultdict(int)
        for j, r in enumerate(raw):
            s = r[10]
            if s is not None and s.stream == 1 and "/" not in s.path and _collective(s.name):
                k = per_rank[s.rank]
                per_rank[s.rank] += 1
                raw[j] = r[:7] + (PALETTE[k % len(PALETTE)], f"b{k}", r[9], r[10], (BUCKET, BUCKET_TEXT))
    for r in raw:
        key = (r[0], r[1])
        rows[key] = max(rows.get(key, 0), r[2] + 1)
    order = sorted(rows)
    ri = {key: i for i, key in enumerate(order)}
    items = [[ri[r[0], r[1]], r[2], _num(r[3]), _num(r[4]), r[5], r[6], index("colours", r[7]),
              index("texts", r[8]), index("titles", r[9])] for r in raw]
    items.sort(key=lambda it: (it[0], it[1], it[2], it[3]))
    end = max([it[3] for it in items] + [trace.time if timed else steps, 1e-300 if timed else 1])
    if parts is not None:
        parts = [part_text(p) for p in parts]
        if len(parts) != trace.world_size:
            raise ValueError(f"parts= needs one text per rank: {trace.world_size}, got {len(parts)}")
    legend = [[index("colours", c), t] for c, t in dict.fromkeys(r[11] for r in raw)]
    return {"rows": [[r, s, rows[r, s]] for r, s in order], "items": items,
            "colours": list(pools["colours"]), "texts": list(pools["texts"]),
            "titles": list(pools["titles"]), "time": timed,
            "cursor": None if times is None else [_num(t) for t in times], "end": _num(end),
            "legend": legend,
            "parts": parts}


def spans_text(indices):
    """``[0, 1, 2, 3, 8, 9]`` -> ``"0–3, 8–9"``: indices as runs of consecutive ones.

        >>> spans_text(range(4)), spans_text([0, 1, 2, 3, 8, 9, 10, 11, 16]), spans_text([])
        ('0–3', '0–3, 8–11, 16', '')
    """
    out, run = [], []
    for i in (int(i) for i in indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def part_text(part):
    """What one rank holds, as ``parts=`` gives it: a text, or ``{what: indices}``
    (``{"qkv columns": cols, "proj rows": rows}`` -> ``"qkv columns 0–3, 8–11; proj rows 0–3"``)."""
    if isinstance(part, str):
        return part
    if hasattr(part, "items"):
        return "; ".join(f"{what} {spans_text(ix) if not isinstance(ix, str) else ix}"
                         for what, ix in part.items())
    return spans_text(part)


def _num(x):
    """Seconds for the page: 9 significant digits are plenty for a drawing."""
    return float(f"{x:.9g}") if isinstance(x, float) else x


def _group_text(group):
    return ",".join(map(str, group)) if isinstance(group, tuple) else str(group)


def _seconds(t):
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


# -- which view first --------------------------------------------------------------------------

def _region_around_collective(trace):
    """A span around another one whose outer name does not say it is a collective:
    ``tp.mlp.forward/ring_allreduce`` is, ``tree_allreduce/binomial_reduce`` and
    ``hierarchical_allreduce/ring_reduce_scatter`` are not (a collective made of
    collectives: the ring view shows it)."""
    return any("/" in s.path and _collective(s.path.split("/", 1)[0]) is None for s in trace.spans)


def default_view(trace, views=("messages", "memory", "lanes")):
    """The view a trace is about (see the module doc), among ``views``."""
    if "memory" in views and trace.memory:
        return "memory"
    if "lanes" in views:
        pipeline = any(_pipeline_kind(c) for c in trace.computes)
        if pipeline or _buckets(trace, list(trace.computes), list(trace.spans)) \
                or _region_around_collective(trace):
            return "lanes"
    return "messages"


def views_of(trace):
    """The views this trace has data for, the ring view first: lanes when some rank
    computes or runs more than one span (one collective alone is all in the ring
    view), memory when some rank allocates."""
    spans = defaultdict(int)
    for s in trace.spans:
        spans[s.rank] += 1
    lanes = bool(trace.computes) or any(k > 1 for k in spans.values())
    return ["messages"] + (["lanes"] if lanes else []) + (["memory"] if trace.memory else [])
