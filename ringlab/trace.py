"""The trace: one event per message, in a canonical order.

A trace is what the grader checks and what the book draws. Each event records
*when* (the causal ``step``), *who* (``src`` -> ``dst``), *what* (``chunk``,
``nbytes``) and *what the receiver does with it* (``op``: ``"reduce"``,
``"copy"``, ...). Collective calls appear as named spans: an event sent inside
``ring_allreduce`` has ``span == "ring_allreduce"``; one sent by a
tensor-parallel layer's all-reduce might have ``span == "mlp.forward/ring_allreduce"``.

Example::

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> res = ringlab.run(ring_allreduce, [np.ones(4)] * 2)
    >>> res.trace[0]
    Event(step=1, src=0, dst=1, chunk=0, op='reduce', nbytes=16, span='ring_allreduce')
    >>> res.trace.steps
    2
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, asdict
from typing import NamedTuple
from collections import defaultdict


class Event(NamedTuple):
    """One message: sent at causal ``step`` from ``src`` to ``dst``.

    A named tuple: cheap to make (a big run has hundreds of thousands), compared
    field by field, and immutable.
    """

    step: int
    src: int
    dst: int
    chunk: object = None       # which piece of the logical buffer (an int, or None)
    op: str | None = None      # what the receiver does with it: "reduce", "copy", ...
    nbytes: int = 0
    span: str = ""             # the collective call(s) it belongs to, outermost first
    tag: int = 0
    shape: tuple = ()
    dtype: str = ""
    seq: int = 0               # n-th message on its channel (group, stream, src, dst, tag)
    group: object = None       # the group it was sent in: its name or ranks; None: the world
    stream: int = 0            # 0: the program; 1: the communication stream (comm.start)
    start: float | None = None  # simulated seconds, when the run has a network model
    end: float | None = None

    def __repr__(self):
        return (f"Event(step={self.step}, src={self.src}, dst={self.dst}, chunk={self.chunk!r}, "
                f"op={self.op!r}, nbytes={self.nbytes}, span={self.span!r})")

    def describe(self):
        label = "" if self.chunk is None else f" chunk {self.chunk}"
        op = "" if self.op is None else f" ({self.op})"
        return (f"step {self.step}: rank {self.src} -> rank {self.dst}{label}{op}, "
                f"{self.nbytes} bytes, shape {self.shape} {self.dtype}")

    def to_dict(self):
        d = self._asdict()
        d["shape"] = list(self.shape)
        if isinstance(self.group, tuple):
            d["group"] = list(self.group)
        return d

    @staticmethod
    def from_dict(d):
        d = dict(d)
        d["shape"] = tuple(d.get("shape", ()))
        d["chunk"] = _tuples(d.get("chunk"))     # JSON has no tuples: (src, dst) labels come back as lists
        d["group"] = _tuples(d.get("group"))
        return Event(**d)


def _tuples(value):
    """``value`` with every list turned back into a tuple (labels must stay hashable)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _order(e: Event):
    # Canonical order: by step, then sender, receiver, and position on the
    # channel. It does not depend on which rank happened to run first, so the
    # simulator and real processes give the same sequence.
    # In the one-port model (step, src) alone is unique; the rest breaks ties
    # in traces made by hand.
    return (e.step, e.src, e.dst, e.tag, _label_key(e.group), e.stream, e.seq)


def _replace_rank(span, rank):
    from dataclasses import replace
    return replace(span, rank=rank)


def _label_key(group):
    return "" if group is None else repr(group)


@dataclass(frozen=True, slots=True)
class Span:
    """One rank's call of a collective: ``name`` ran on ``rank`` over steps
    ``start`` (its clock on entry) to ``end`` (its clock on exit), in
    ``group``, from simulated second ``t_start`` to ``t_end``."""

    rank: int
    path: str      # e.g. "mlp.forward/ring_allreduce"
    start: int
    end: int
    group: object = None
    stream: int = 0
    t_start: float = 0.0
    t_end: float = 0.0

    @property
    def name(self):
        return self.path.rsplit("/", 1)[-1]


class Compute(NamedTuple):
    """``rank`` computed ``label`` from ``start`` to ``end`` (simulated seconds);
    ``step`` is its step clock then, ``meta`` what the program said about it."""

    rank: int
    label: str
    start: float
    end: float
    step: int = 0
    stream: int = 0
    meta: tuple = ()      # sorted (key, value) pairs: hashable, comparable

    @property
    def duration(self):
        return self.end - self.start

    def get(self, key, default=None):
        return dict(self.meta).get(key, default)


class MemoryEvent(NamedTuple):
    """``rank`` took (``nbytes > 0``, ``comm.alloc``) or gave back (``nbytes < 0``,
    ``comm.free``) memory under ``label`` at simulated second ``time``; ``step``
    is its step clock then, ``stream`` the stream that said so."""

    rank: int
    label: str
    nbytes: int
    time: float
    step: int = 0
    stream: int = 0


def _memory_order(m: MemoryEvent):
    # Sorted stably: events of one rank at one time keep the order they were
    # made in, its program's and its works' interleaved as they ran (a work
    # frees a bucket, then the program takes the next one). Sorting by stream
    # would put that alloc before that free and show a peak that never was.
    return (m.time, m.rank)


def _group(label):
    """"params.layer3" -> "params": the part before the first dot."""
    return label.split(".", 1)[0]


# The views of a trace that its methods hand it to (``show``, ``save_html``,
# ``to_chrome_trace``, and ``RunResult.show``) live in ``ringlab.show``, which
# puts them here when it is imported (``import ringlab`` does): a view imports
# the trace, never the other way round.
VIEWS = {}


class Trace:
    """The events of one run, in canonical order. Iterable, indexable, comparable."""

    def __init__(self, events, world_size, spans=(), unreceived=(), computes=(), groups=None,
                 memory=()):
        self.events = sorted(events, key=_order)
        self.group_ranks = dict(groups or {})     # label -> global ranks, of every group made
        self.unreceived = sorted(unreceived, key=_order)   # sent, never received
        self.world_size = world_size
        self.spans = sorted(spans, key=lambda s: (s.start, s.t_start, s.rank, s.stream, s.path))
        self.computes = sorted(computes, key=lambda c: (c.start, c.rank, c.stream, c.step))
        self.memory = sorted(memory, key=_memory_order)     # MemoryEvents (comm.alloc/free)

    # -- sequence protocol -------------------------------------------------
    def __iter__(self):
        return iter(self.events)

    def __len__(self):
        return len(self.events)

    def __getitem__(self, i):
        return self.events[i]

    def __eq__(self, other):
        return (isinstance(other, Trace) and self.world_size == other.world_size
                and self.events == other.events and self.memory == other.memory)

    def __repr__(self):
        return f"<Trace: {len(self)} messages, {self.steps} steps, world_size={self.world_size}>"

    # -- summaries -----------------------------------------------------------
    @property
    def steps(self):
        """The number of steps: the largest step stamp (0 if nothing was sent)."""
        return max((e.step for e in self.events), default=0)

    def at_step(self, step):
        """The events of one step."""
        return [e for e in self.events if e.step == step]

    def by_step(self):
        """``{step: [events]}`` for every step that has messages."""
        out = defaultdict(list)
        for e in self.events:
            out[e.step].append(e)
        return dict(out)

    def bytes_sent(self):
        """Bytes sent by each rank, a list indexed by rank."""
        out = [0] * self.world_size
        for e in self.events:
            out[e.src] += e.nbytes
        return out

    def bytes_received(self):
        out = [0] * self.world_size
        for e in self.events:
            out[e.dst] += e.nbytes
        return out

    @property
    def total_bytes(self):
        return sum(e.nbytes for e in self.events)

    @property
    def time(self):
        """The simulated makespan in seconds: the last message or compute to end."""
        ends = [e.end for e in self.events if e.end is not None] + [c.end for c in self.computes]
        ends += [s.t_end for s in self.spans]
        return max(ends, default=0.0)

    @property
    def groups(self):
        """The group labels that carried messages, in order of first use (None: the world)."""
        return list(dict.fromkeys(e.group for e in self.events))

    def local(self, group):
        """One group's messages as a trace of its own: ranks renumbered to the
        group's (0 .. size-1), so checks written for a world (ring neighbours,
        steps) apply to a collective that ran in a group. ``group``: a label or
        a ``Comm`` of it."""
        label = getattr(getattr(group, "group", None), "label", group)
        ranks = self.group_ranks.get(label, label)
        if not isinstance(ranks, tuple):
            raise KeyError(f"no group {label!r} in this trace; groups: {list(self.group_ranks)}")
        index = {g: i for i, g in enumerate(ranks)}
        sub = self.filter(group=label)
        events = [e._replace(src=index[e.src], dst=index[e.dst]) for e in sub]
        spans = [_replace_rank(s, index[s.rank]) for s in sub.spans]
        return Trace(events, len(ranks), spans)

    def filter(self, span=None, src=None, dst=None, step=None, group=...):
        """A sub-trace. ``span`` matches a span name anywhere in the path;
        ``group`` keeps one group's messages (its label, or a ``Comm`` of it;
        ``None`` means the whole world's own messages)."""
        if group is not ...:
            group = getattr(getattr(group, "group", None), "label", group)

        def keep(e):
            return ((span is None or span in e.span.split("/"))
                    and (src is None or e.src == src) and (dst is None or e.dst == dst)
                    and (step is None or e.step == step) and (group is ... or e.group == group))
        spans = [s for s in self.spans if (span is None or span in s.path.split("/"))
                 and (group is ... or s.group == group)]
        whole_ranks = span is None and group is ... and src is None
        computes, memory = (self.computes, self.memory) if whole_ranks else ([], [])
        return Trace([e for e in self.events if keep(e)], self.world_size, spans, (), computes,
                     memory=memory)

    def collectives(self):
        """The coarse view: one row per collective call, with its steps and bytes.
        A training step's trace reads as "all_gather, all_gather, reduce_scatter"
        before you zoom into messages.

        A call is the k-th span of one path on every rank of its group; its
        messages are those its ranks sent inside it, nested spans included
        (``tree_allreduce`` counts its reduce's and broadcast's, which also get
        rows of their own, ``tree_allreduce/binomial_reduce``, ...)."""
        calls, seen = {}, defaultdict(int)   # (path, group, stream, k) -> row; (rank, path, ...) -> k
        by_rank = defaultdict(list)
        for s in self.spans:
            k = seen[(s.rank, s.path, _label_key(s.group), s.stream)]
            seen[(s.rank, s.path, _label_key(s.group), s.stream)] = k + 1
            key = (s.path, _label_key(s.group), s.stream, k)
            row = calls.setdefault(key, {"span": s.path, "group": s.group, "ranks": set(),
                                         "start": s.start, "end": s.end, "messages": 0, "bytes": 0})
            row["ranks"].add(s.rank)
            row["start"], row["end"] = min(row["start"], s.start), max(row["end"], s.end)
            by_rank[(s.rank, s.stream)].append((s.start, s.end, s.path, row))
        for e in self.events:
            inside = e.span + "/"
            for start, end, path, row in by_rank.get((e.src, e.stream), ()):
                if start < e.step <= end and inside.startswith(path + "/"):
                    row["messages"] += 1
                    row["bytes"] += e.nbytes
        rows = sorted(calls.values(), key=lambda r: (r["start"], -r["end"], r["span"].count("/")))
        return [dict(r, ranks=sorted(r["ranks"])) for r in rows]

    # -- memory ----------------------------------------------------------------
    def memory_timeline(self, rank):
        """``[(time, bytes held after), ...]``: one pair per ``comm.alloc``/``free``
        of ``rank``, in order. Two events at one time give two pairs, so a
        buffer taken and given back at once still counts toward the peak.

            >>> t = Trace([], 1, memory=[MemoryEvent(0, "params", 800, 0.0),
            ...                          MemoryEvent(0, "grads", 800, 1.0),
            ...                          MemoryEvent(0, "grads", -800, 2.0)])
            >>> t.memory_timeline(0)
            [(0.0, 800), (1.0, 1600), (2.0, 800)]
            >>> t.peak_memory(), t.memory_by_label(0)
            (1600, {'params': 800, 'grads': 800})
        """
        out, held = [], 0
        for m in self.memory:
            if m.rank == rank:
                held += m.nbytes
                out.append((m.time, held))
        return out

    def peak_memory(self, rank=None):
        """The most bytes ``rank`` ever held (``rank=None``: the most of any rank)."""
        ranks = range(self.world_size) if rank is None else [rank]
        return max((b for r in ranks for _, b in self.memory_timeline(r)), default=0)

    def memory_by_label(self, rank, time=None, *, group_labels=False):
        """``{label: bytes}`` that ``rank`` holds at simulated second ``time``
        (after every event at that time), or by default just after the event
        that reached its peak. Labels holding nothing are left out.
        ``group_labels=True`` adds "params.layer3" to "params"."""
        mine = [m for m in self.memory if m.rank == rank]
        if time is None:
            totals = [b for _, b in self.memory_timeline(rank)]
            upto = totals.index(max(totals)) + 1 if totals else 0
            mine = mine[:upto]
        else:
            mine = [m for m in mine if m.time <= time]
        held = defaultdict(int)
        for m in mine:
            held[_group(m.label) if group_labels else m.label] += m.nbytes
        return {label: b for label, b in held.items() if b}

    # -- comparing -----------------------------------------------------------
    def diff(self, other, limit=5):
        """A readable description of how two traces differ ('' if equal)."""
        lines = []
        if self.world_size != other.world_size:
            lines.append(f"world_size {self.world_size} != {other.world_size}")
        for i, (a, b) in enumerate(zip(self.events, other.events)):
            if a != b:
                lines.append(f"event {i}: {a.describe()}  !=  {b.describe()}")
                if len(lines) >= limit:
                    break
        if len(self) != len(other):
            lines.append(f"{len(self)} events != {len(other)} events")
        for a, b in zip(self.memory, other.memory):
            if a != b:
                lines.append(f"memory: {a} != {b}")
                break
        if len(self.memory) != len(other.memory):
            lines.append(f"{len(self.memory)} memory events != {len(other.memory)} memory events")
        return "\n".join(lines)

    # -- export --------------------------------------------------------------
    def to_dict(self):
        return {"world_size": self.world_size,
                "events": [e.to_dict() for e in self.events],
                "spans": [asdict(s) for s in self.spans],
                "computes": [c._asdict() for c in self.computes],
                "memory": [m._asdict() for m in self.memory]}

    def to_json(self, **kw):
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text):
        d = json.loads(text) if isinstance(text, str) else text
        spans = [Span(**dict(s, group=_tuples(s.get("group")))) for s in d.get("spans", [])]
        computes = [Compute(**dict(c, meta=_tuples(c.get("meta", ())))) for c in d.get("computes", [])]
        memory = [MemoryEvent(**m) for m in d.get("memory", [])]
        return cls([Event.from_dict(e) for e in d["events"]], d["world_size"], spans, (), computes,
                   memory=memory)

    def show(self, **options):
        """An interactive player for this trace (displays in a notebook; see
        ``ringlab.show.player``). Options: ``layout=``, ``title=``, ``detail_limit=``,
        ``view=`` ("messages", "lanes" or "memory": the view shown first), ``parts=``
        (what each rank holds, beside its lane)."""
        return VIEWS["player"](self, **options)

    def save_html(self, path, **options):
        """Write the player as a standalone, offline ``.html`` file; returns the path."""
        return VIEWS["save_html"](self, path, **options)

    def to_chrome_trace(self, time_model=None, **options):
        """The trace as Chrome Trace Event JSON (a dict) for Perfetto or
        chrome://tracing; see ``ringlab.show.timeline`` for time models."""
        return VIEWS["chrome_trace"](self, time_model, **options)

    def table(self, limit=None):
        """A table of the events (plain text with ``str()``, HTML in a notebook)."""
        return TraceTable(self, limit)

    def _repr_html_(self):
        return self.table(limit=64)._repr_html_()


_COLUMNS = ("step", "src", "dst", "chunk", "op", "nbytes", "span")


class TraceTable:
    def __init__(self, trace, limit=None):
        self.trace, self.limit = trace, limit

    def rows(self):
        ev = self.trace.events if self.limit is None else self.trace.events[: self.limit]
        return [[getattr(e, c) for c in _COLUMNS] for e in ev]

    def _more(self):
        n = len(self.trace) - len(self.rows())
        return f"... {n} more events" if n > 0 else ""

    def __str__(self):
        rows = [list(_COLUMNS)] + [["-" if v is None else str(v) for v in r] for r in self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
        more = self._more()
        return "\n".join(lines + ([more] if more else []))

    __repr__ = __str__

    def _repr_html_(self):
        head = "".join(f"<th>{c}</th>" for c in _COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape('-' if v is None else str(v))}</td>" for v in r) + "</tr>"
            for r in self.rows())
        more = self._more()
        more = f"<p><em>{more}</em></p>" if more else ""
        return f'<table class="ringlab-trace"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}'


def payload_key(event):
    """How recorded payloads are looked up: the message's channel and position on it."""
    return (event.group, event.stream, event.src, event.dst, event.tag, event.seq)
