"""Views of a trace that the book draws: who holds what, and what it costs.

``holdings(trace)`` replays a *labelled* trace (every message has a ``chunk``
and an ``op``) and says, after each step, which ranks' contributions each rank
holds in each chunk::

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> res = ringlab.run(ring_allreduce, [np.ones(3)] * 3)
    >>> h = holdings(res.trace)
    >>> sorted(h[1][1][0])          # after step 1, rank 1's chunk 0 holds ranks 0 and 1
    [0, 1]
    >>> len(h[-1][2][0])            # at the end every chunk holds all 3 contributions
    3

``alpha_beta_time(trace, alpha, beta)`` prices a trace in the alpha-beta
model: every step costs ``alpha`` (latency) plus ``beta`` times the largest
number of bytes one rank sends or receives in that step.
"""

from __future__ import annotations

import html

from ..cost.alpha_beta import AlphaBeta, step_bytes  # noqa: F401 - step_bytes is a view too

#: What the receiver does with a labelled chunk: add it in, or overwrite.
OPS = ("reduce", "copy")


def holdings(trace, chunks=None):
    """Replay a labelled trace: ``h[s][rank][chunk]`` is the frozenset of ranks
    whose contributions ``rank`` holds in ``chunk`` after step ``s``.

    ``h[0]`` is the start: every rank holds its own contribution in every chunk.
    ``h[s]`` for ``s = 1 .. trace.steps`` applies the messages of step ``s``:
    ``op="reduce"`` adds the sender's set into the receiver's chunk (union),
    ``op="copy"`` replaces it. A message of step ``s`` carries what its sender
    held after step ``s - 1``: in the one-port model a rank's send stamped ``s``
    leaves before anything stamped ``s`` or later reaches it. (This assumes a
    rank receives its messages in step order, as every collective in this book
    does; the trace does not record the order of receives.)

    ``chunks``: the chunk labels to track (default: every label in the trace).
    """
    bad = [e for e in trace if e.chunk is None or e.op is None]
    if bad:
        e = bad[0]
        raise ValueError(
            f"holdings() needs every message labelled with chunk= and op=, but the message "
            f"of step {e.step} from rank {e.src} to rank {e.dst} has chunk={e.chunk!r}, "
            f"op={e.op!r} ({len(bad)} unlabelled message(s)). "
            f"Hint: comm.send(x, dst, chunk=c, op='reduce') or op='copy'.")
    unknown = [e for e in trace if e.op not in OPS]
    if unknown:
        e = unknown[0]
        raise ValueError(f"holdings() knows ops {OPS}; the message of step {e.step} from rank "
                         f"{e.src} to rank {e.dst} has op={e.op!r}")
    labels = _sorted({e.chunk for e in trace}) if chunks is None else list(chunks)
    n = trace.world_size
    state = {r: {c: frozenset([r]) for c in labels} for r in range(n)}
    out = [state]
    by_step = trace.by_step()
    for s in range(1, trace.steps + 1):
        prev, state = state, {r: dict(cs) for r, cs in state.items()}
        for e in by_step.get(s, ()):
            if e.chunk not in prev[e.src]:
                raise ValueError(f"step {e.step}: rank {e.src} sent chunk {e.chunk!r}, "
                                 f"which is not among the chunks tracked: {labels}")
            carried = prev[e.src][e.chunk]          # the sender's state *before* this step
            if e.op == "reduce":
                state[e.dst][e.chunk] = state[e.dst][e.chunk] | carried
            else:
                state[e.dst][e.chunk] = carried
        out.append(state)
    return out


def _sorted(labels):
    try:
        return sorted(labels)           # 0, 1, ..., 10 in numeric order
    except TypeError:                   # mixed kinds of labels
        return sorted(labels, key=repr)


def holdings_table(trace, chunks=None, show="count"):
    """A step-by-step table of ``holdings(trace)``: one row per step, one column
    per rank, and in each cell one entry per chunk (in chunk order).

    ``show="count"``: how many contributions each chunk holds (complete ones are
    marked ``*`` in text, green in HTML); ``show="ranks"``: which ones
    (``all`` when complete).
    ``str()`` gives plain text; in a notebook it displays as HTML.
    """
    return HoldingsTable(trace, holdings(trace, chunks), show)


class HoldingsTable:
    def __init__(self, trace, h, show="count"):
        if show not in ("count", "ranks"):
            raise ValueError(f"show must be 'count' or 'ranks', got {show!r}")
        self.trace, self.h, self.show = trace, h, show
        self.world_size = trace.world_size
        self.chunks = list(h[0][0]) if h[0] else []

    def _cell(self, held):
        if self.show == "count":
            return str(len(held))
        if len(held) == self.world_size:
            return "all"
        return "{" + ",".join(map(str, sorted(held))) + "}"

    def rows(self):
        """``[step, messages, [cells of rank 0], [cells of rank 1], ...]`` per step."""
        by_step = self.trace.by_step()
        messages = {s: ", ".join(f"{e.src}→{e.dst} c{e.chunk} {e.op}" for e in evs)
                    for s, evs in by_step.items()}
        return [[s, messages.get(s, "") if s else "(start)"]
                + [[self._cell(state[r][c]) for c in self.chunks] for r in range(self.world_size)]
                for s, state in enumerate(self.h)]

    def _complete(self, s, r, c):
        return len(self.h[s][r][c]) == self.world_size

    def __str__(self):
        head = ["step"] + [f"rank {r}" for r in range(self.world_size)] + ["messages of the step"]
        body = []
        for s, row in enumerate(self.rows()):
            star = self.show == "count"      # "all" already says complete
            cells = [" ".join(v + ("*" if star and self._complete(s, r, c) else "")
                              for c, v in zip(self.chunks, vals))
                     for r, vals in enumerate(row[2:])]
            body.append([str(s)] + cells + [row[1]])
        table = [head] + body
        widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] for r in table]
        what = (f"contributions held, * = complete ({self.world_size} of {self.world_size})"
                if self.show == "count" else "ranks whose contributions are held")
        note = f"each cell: chunks {', '.join(map(str, self.chunks))} in order; {what}"
        return "\n".join([note] + [line.rstrip() for line in lines])

    __repr__ = __str__

    def _repr_html_(self):
        head = ("<tr><th>step</th>" + "".join(f"<th>rank {r}</th>" for r in range(self.world_size))
                + "<th>messages of the step</th></tr>")
        body = []
        for s, row in enumerate(self.rows()):
            tds = []
            for r, vals in enumerate(row[2:]):
                spans = []
                for c, v in zip(self.chunks, vals):
                    full = self._complete(s, r, c)
                    style = "background:#c8f0c8;font-weight:bold" if full else "background:#f3f3f3"
                    who = ", ".join(map(str, sorted(self.h[s][r][c])))
                    spans.append(f'<span title="chunk {html.escape(str(c))}: ranks {who}" '
                                 f'style="{style};padding:0 4px;margin:0 1px;font-family:monospace">'
                                 f'{html.escape(v)}</span>')
                tds.append('<td style="padding-right:1em;white-space:nowrap">' + "".join(spans) + "</td>")
            body.append(f"<tr><td>{s}</td>{''.join(tds)}<td>{html.escape(row[1])}</td></tr>")
        what = "how many contributions it holds" if self.show == "count" else "whose contributions it holds"
        cap = (f"Each cell: one box per chunk ({', '.join(map(str, self.chunks))}), showing {what}; "
               f"green = complete (all {self.world_size} ranks).")
        return (f'<table class="ringlab-holdings"><caption>{html.escape(cap)}</caption>'
                f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table>")


def alpha_beta_time(trace, alpha, beta):
    """Time of a trace in the alpha-beta model: each step ``s`` that has
    messages costs ``alpha + beta * step_bytes(trace)[s]``.

    For a ring AllReduce of ``n`` bytes with ``n`` divisible by N this is
    ``2(N-1) alpha + 2(N-1)/N n beta``.
    """
    return AlphaBeta(alpha, beta).lockstep_time(trace)
