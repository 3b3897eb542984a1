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
    seq: int = 0               # n-th message on the (src, dst, tag) channel

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
        return d

    @staticmethod
    def from_dict(d):
        d = dict(d)
        d["shape"] = tuple(d.get("shape", ()))
        d["chunk"] = _tuples(d.get("chunk"))     # JSON has no tuples: (src, dst) labels come back as lists
        return Event(**d)


def _tuples(value):
    """``value`` with every list turned back into a tuple (labels must stay hashable)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _order(e: Event):
    # Canonical order: by step, then sender, receiver, and position on the
    # channel. It does not depend on which rank happened to run first, so the
    # simulator and real processes give the same sequence.
    return (e.step, e.src, e.dst, e.tag, e.seq)


@dataclass(frozen=True, slots=True)
class Span:
    """One rank's call of a collective: ``name`` ran on ``rank`` over steps
    ``start`` (its clock on entry) to ``end`` (its clock on exit)."""

    rank: int
    path: str      # e.g. "mlp.forward/ring_allreduce"
    start: int
    end: int

    @property
    def name(self):
        return self.path.rsplit("/", 1)[-1]


class Trace:
    """The events of one run, in canonical order. Iterable, indexable, comparable."""

    def __init__(self, events, world_size, spans=(), unreceived=()):
        self.events = sorted(events, key=_order)
        self.unreceived = sorted(unreceived, key=_order)   # sent, never received
        self.world_size = world_size
        self.spans = sorted(spans, key=lambda s: (s.start, s.rank, s.path))

    # -- sequence protocol -------------------------------------------------
    def __iter__(self):
        return iter(self.events)

    def __len__(self):
        return len(self.events)

    def __getitem__(self, i):
        return self.events[i]

    def __eq__(self, other):
        return (isinstance(other, Trace) and self.world_size == other.world_size
                and self.events == other.events)

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

    def filter(self, span=None, src=None, dst=None, step=None):
        """A sub-trace. ``span`` matches a span name anywhere in the path."""
        def keep(e):
            return ((span is None or span in e.span.split("/"))
                    and (src is None or e.src == src) and (dst is None or e.dst == dst)
                    and (step is None or e.step == step))
        return Trace([e for e in self.events if keep(e)], self.world_size,
                     [s for s in self.spans if span is None or span in s.path.split("/")])

    def collectives(self):
        """The coarse view: one row per collective call (spans at top level of
        each rank), with its steps and bytes. A training step's trace reads as
        "all_gather, all_gather, reduce_scatter" before you zoom into messages."""
        rows = defaultdict(lambda: {"ranks": set(), "start": None, "end": 0, "messages": 0, "bytes": 0})
        for s in self.spans:
            key = s.path
            r = rows[key]
            r["ranks"].add(s.rank)
            r["start"] = s.start if r["start"] is None else min(r["start"], s.start)
            r["end"] = max(r["end"], s.end)
        for e in self.events:
            if e.span in rows:
                rows[e.span]["messages"] += 1
                rows[e.span]["bytes"] += e.nbytes
        return [dict(span=k, ranks=sorted(v["ranks"]), start=v["start"], end=v["end"],
                     messages=v["messages"], bytes=v["bytes"]) for k, v in rows.items()]

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
        return "\n".join(lines)

    # -- export --------------------------------------------------------------
    def to_dict(self):
        return {"world_size": self.world_size,
                "events": [e.to_dict() for e in self.events],
                "spans": [asdict(s) for s in self.spans]}

    def to_json(self, **kw):
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text):
        d = json.loads(text) if isinstance(text, str) else text
        return cls([Event.from_dict(e) for e in d["events"]], d["world_size"],
                   [Span(**s) for s in d.get("spans", [])])

    def show(self, **options):
        """An interactive player for this trace (displays in a notebook; see
        ``ringlab.player``). Options: ``layout=``, ``title=``, ``detail_limit=``."""
        from .player import TracePlayer       # lazy: the trace itself needs no HTML
        return TracePlayer(self, **options)

    def save_html(self, path, **options):
        """Write the player as a standalone, offline ``.html`` file; returns the path."""
        from .player import save_html
        return save_html(self, path, **options)

    def to_chrome_trace(self, time_model=None, **options):
        """The trace as Chrome Trace Event JSON (a dict) for Perfetto or
        chrome://tracing; see ``ringlab.timeline`` for time models."""
        from .timeline import to_chrome_trace
        return to_chrome_trace(self, time_model, **options)

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
