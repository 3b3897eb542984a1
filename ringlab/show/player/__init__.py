"""The trace player: any trace as an interactive diagram you can step through.

``trace.show()`` in a notebook (or a book page) displays it; ``trace.save_html(path)``
writes a standalone page. Either way it is one self-contained piece of HTML with
inline CSS, JavaScript and SVG: nothing is fetched from the network and no
kernel is needed, so it keeps working in the static book and offline::

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> trace = ringlab.run(ring_allreduce, [np.ones(8)] * 4).trace
    >>> player = trace.show()              # in a notebook: the last line of a cell
    >>> player.data["layout"]["kind"], player.data["steps"]
    ('ring', 6)
    >>> path = trace.save_html("ring.html")  # doctest: +SKIP

What the JavaScript (``player.js``, read it!) draws comes from ``player_data``:
the layout (``ringlab.show.player.layouts``), the events of every step and, for a
labelled trace, which ranks' contributions each chunk holds after each step
(``ringlab.show.views.holdings``). Beyond ``detail_limit`` ranks (32) each rank is one
square coloured by the share of all contributions it holds.

**Your own run, without labels.** Chunk colours come from ``chunk=``/``op=``
labels, which a learner's program rarely sets. Run it with
``record_payloads=True`` on random inputs instead, and ``res.show(inputs)``
reads back from the payloads what each message really carried (a sum of which
ranks' inputs, or a copy of whose; ``ringlab.show.player.payloads``)::

    >>> def my_allreduce(comm, x):            # a ring AllReduce with no labels at all
    ...     n, r = comm.world_size, comm.rank
    ...     chunks = np.array_split(x.copy(), n)
    ...     for k in range(n - 1):            # reduce-scatter, then all-gather
    ...         chunks[(r - k - 1) % n] += comm.sendrecv(chunks[(r - k) % n], (r + 1) % n, (r - 1) % n)
    ...     for k in range(n - 1):
    ...         chunks[(r - k) % n][...] = comm.sendrecv(chunks[(r + 1 - k) % n], (r + 1) % n, (r - 1) % n)
    ...     return np.concatenate(chunks)
    >>> inputs = [np.random.default_rng(r).random(8) for r in range(4)]
    >>> res = ringlab.run(my_allreduce, inputs, record_payloads=True)
    >>> player = res.show(inputs)      # = show_run(res, inputs)
    >>> player.data["chunks"], player.data["ops"], player.data["holdings"]["mode"]
    (['0', '1', '2', '3'], ['copy', 'reduce'], 'detail')

The same, in two steps: ``import ringlab.show``, ``c = ringlab.show.contributions(res, inputs)``, then
``res.trace.show(contributions=c)``. Inputs must differ between ranks (random
numbers do): with ``np.ones`` everywhere no sum can be told from another.

**The strategy, not only the collective.** A trace with memory events, computes or
named regions also gets the views of ``ringlab.show.player.strategy``, with buttons to
switch: *lanes* (per rank and stream, what it computed and which collectives ran,
a pipeline's microbatches, a DDP step's buckets, a tensor-parallel region's one
AllReduce lit) and *memory* (per rank the bytes held per label after each step: a
ZeRO-3 unit gathered, used, freed). The player opens on the view the trace is about
(``view=`` chooses); ``parts=`` writes what each rank holds beside its lane::

    >>> from ringlab.nn import MLP
    >>> from ringlab.tensor_parallel import ParallelMLP
    >>> mlp = MLP(dim=4, hidden=8, rng=np.random.default_rng(0))
    >>> def tp_step(comm, x):
    ...     layer = ParallelMLP.from_mlp(mlp, comm)
    ...     layer.backward(layer.forward(x))
    ...     return layer.fc.columns
    >>> res = ringlab.run(tp_step, [np.ones((2, 4))] * 2)
    >>> player = res.trace.show(parts=[{"hidden units": cols} for cols in res.outputs])
    >>> player.data["views"], player.data["view"], player.data["lanes"]["parts"]
    (['messages', 'lanes'], 'lanes', ['hidden units 0–3', 'hidden units 4–7'])
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import numbers
from importlib import resources
from pathlib import Path

from ...trace import VIEWS
from ..views import OPS, holdings
from .layouts import LAYOUTS, infer_layout, layout
from .payloads import Contributions, contributions
from .strategy import default_view, lanes_view, memory_frames, memory_view, views_of

__all__ = ["TracePlayer", "show", "show_run", "save_html", "player_data", "contributions",
           "Contributions", "infer_layout", "layout", "LAYOUTS", "memory_frames", "VIEW_NAMES"]

DETAIL_LIMIT = 32
MAX_EVENTS = 50_000            # ~1 MB of page; beyond that, filter the trace first
MAX_CELLS = 2_000_000          # steps x ranks x chunks replayed for the colours
MAX_CHUNKS = 64                # cells per rank box

VIEW_NAMES = ("messages", "lanes", "memory")   # the ring view, and ringlab.show.player.strategy's
_counter = itertools.count()   # with a content hash: ids unique on a page, stable across builds


def _asset(name):
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _label(chunk):
    return str(chunk.item() if hasattr(chunk, "item") else chunk)


def _title(trace):
    calls = sorted({sp.path.split("/")[0] for sp in trace.spans})
    what = ", ".join(calls) if calls else "trace"
    if len(calls) > 4:        # a pipeline's actions "0F0", "0F1", ...: a few, then how many
        what = ", ".join(calls[:3]) + f", … ({len(calls)} span names)"
    return (f"{what} · {trace.world_size} ranks · {trace.steps} steps · "
            f"{len(trace)} message{'s' if len(trace) != 1 else ''}")


def player_data(trace, *, layout_kind=None, title=None, detail_limit=DETAIL_LIMIT, contributions=None,
                view=None, parts=None):
    """Everything the JavaScript draws, as JSON-ready Python data.

    ``events``: ``[step, src, dst, chunk index, op index, nbytes, span index]``
    (index -1 = none) into ``chunks``, ``ops``, ``spans``; ``eventGroups[i]``:
    the index into ``groups`` (labels as text) of event i's group, -1 for the
    whole world. ``computes``: ``[step, rank, label index, seconds, stream]``, one
    per ``comm.compute``, with labels in ``computeLabels``; ``step`` is the
    rank's step clock when it began, so the player shows it after that step. ``holdings``: None for an
    unlabelled trace (``note`` says why); ``mode="detail"`` with ``start`` (one hex
    bit mask of contributing ranks per rank x chunk) and, for each step, the
    cells that changed ``[rank, chunk index, mask]``; or ``mode="aggregate"`` with
    ``held[step][rank]`` = contributions held, summed over chunks.

    ``contributions`` (from ``contributions(res, inputs)``): chunks, ops and
    holdings come from what the messages carried instead of from their labels,
    and ``carried[i]`` = ``[hex mask of the ranks, [chunk indices]]`` says what
    event i carried (None: not readable).

    ``views``: the views this trace has data for, ``"messages"`` (the ring of
    ranks above) first, then ``"lanes"`` and ``"memory"`` when it has spans or
    computes, memory events (``ringlab.show.player.strategy``; their data under
    those keys, None when absent); ``view``: the one shown first (``view=``, or
    ``default_view``). ``parts``: one text per rank saying what it holds (a
    tensor-parallel rank's heads), shown beside its lane.
    """
    if contributions is not None:
        return _from_contributions(trace, contributions, layout_kind, title, detail_limit, view, parts)
    if len(trace) > MAX_EVENTS:
        raise ValueError(f"this trace has {len(trace)} messages, more than the player draws "
                         f"({MAX_EVENTS}); show part of it, e.g. trace.filter(span=...)")
    n = trace.world_size
    chunks = sorted({e.chunk for e in trace if e.chunk is not None}, key=_sort_key)
    ops = sorted({e.op for e in trace if e.op is not None})
    spans = sorted({e.span for e in trace})
    ci = {c: i for i, c in enumerate(chunks)}
    oi = {o: i for i, o in enumerate(ops)}
    si = {s: i for i, s in enumerate(spans)}
    events = [[e.step, e.src, e.dst, ci.get(e.chunk, -1), oi.get(e.op, -1), e.nbytes, si[e.span]]
              for e in trace]
    groups = [_group(g) for g in dict.fromkeys(e.group for e in trace if e.group is not None)]
    gi = {g: i for i, g in enumerate(groups)}
    labels = sorted({c.label for c in trace.computes})
    li = {lab: i for i, lab in enumerate(labels)}
    computes = [[c.step, c.rank, li[c.label], c.duration, c.stream] for c in trace.computes]
    held, note = _holdings(trace, chunks, detail_limit)
    views = views_of(trace)
    lanes = lanes_view(trace, parts) if "lanes" in views else None
    if lanes is None and "lanes" in views:       # too many computes and spans to draw
        views.remove("lanes")
    if view is None:
        view = default_view(trace, views)
    elif view not in views:
        raise ValueError(f"view={view!r}: this trace has the views {views}"
                         + ("" if view in VIEW_NAMES else f"; views are {VIEW_NAMES}"))
    if parts is not None and "lanes" not in views:
        raise ValueError("parts= is drawn beside each rank's lane: this trace has no spans or computes")
    return {"views": views, "view": view, "lanes": lanes,
            "memory": memory_view(trace), "worldSize": n, "steps": trace.steps, "title": title or _title(trace),
            "layout": layout(trace, layout_kind), "detailLimit": detail_limit,
            "chunks": [_label(c) for c in chunks], "ops": ops, "spans": spans,
            "events": events, "holdings": held, "note": note,
            "groups": groups, "eventGroups": [gi.get(_group(e.group), -1) for e in trace],
            "computes": computes, "computeLabels": labels}


def _from_contributions(trace, c, layout_kind, title, detail_limit, view, parts):
    """player_data for an unlabelled run: the labels are what the payloads say."""
    if len(c.carried) != len(trace):
        raise ValueError("these contributions belong to another run: "
                         f"{len(c.carried)} messages, the trace has {len(trace)}")
    data = player_data(trace, layout_kind=layout_kind, title=title, detail_limit=detail_limit,
                       view=view, parts=parts)
    ops = sorted({op for op in c.ops if op})
    oi = {o: i for i, o in enumerate(ops)}
    for event, carried, op in zip(data["events"], c.carried, c.ops):
        event[3] = carried[0][0] if carried and carried[0] else -1     # the first chunk it covers
        event[4] = oi.get(op, -1)
    held = _encode(c.holdings, trace.world_size, range(len(c.chunks)), detail_limit) if c.holdings else None
    data.update(chunks=[_label(k) for k in c.chunks], ops=ops, holdings=held, note=c.note,
                carried=[None if x is None else [_mask(x[1]), x[0]] for x in c.carried],
                contributionMode=c.mode)
    return data


def _group(label):
    """A group's label as the player writes it: its name, or its ranks "0,1"."""
    return None if label is None else (",".join(map(str, label)) if isinstance(label, tuple) else str(label))


def _mask(ranks):     # a set of ranks as a hex bit mask: bit r = rank r
    return format(sum(1 << r for r in ranks), "x")


def _sort_key(c):     # numbers in numeric order (0, 1, ..., 10), then any other labels
    return (0, c, "") if isinstance(c, numbers.Real) else (1, 0, repr(c))


def _holdings(trace, chunks, detail_limit):
    """The chunk colours (see player_data), or (None, why not)."""
    if len(trace) == 0:
        return None, ""
    if any(e.chunk is None or e.op not in OPS for e in trace):
        return None, f"Chunk colours need every message labelled with chunk= and op= in {OPS}."
    n = trace.world_size
    if len(chunks) > MAX_CHUNKS or not all(isinstance(c, numbers.Integral) for c in chunks):
        return None, "Chunk colours need at most 64 chunk labels, numbered 0, 1, ...; showing messages."
    if (trace.steps + 1) * n * len(chunks) > MAX_CELLS:
        return None, "Too big to replay chunk holdings; showing messages only."
    # The checks above leave holdings() nothing to object to.
    return _encode(holdings(trace, chunks), n, chunks, detail_limit), ""


def _encode(h, n, chunks, detail_limit):
    """``h[step][rank][chunk]`` (sets of ranks) as the JavaScript reads it (see player_data)."""
    if n > detail_limit:
        return {"mode": "aggregate",
                "held": [[sum(len(s) for s in state[r].values()) for r in range(n)] for state in h]}
    start = [_mask(h[0][r][c]) for r in range(n) for c in chunks]
    changes = [[[r, k, _mask(now[r][c])] for r in range(n) for k, c in enumerate(chunks)
                if now[r][c] != before[r][c]]
               for before, now in zip([h[0]] + h[:-1], h)]
    return {"mode": "detail", "start": start, "changes": changes}


class TracePlayer:
    """An interactive player for one trace. Displays itself in a notebook
    (``_repr_html_``); ``html()`` is the snippet, ``page()`` a whole document."""

    def __init__(self, trace, *, layout=None, title=None, detail_limit=DETAIL_LIMIT, contributions=None,
                 view=None, parts=None):
        self.trace = trace
        self.data = player_data(trace, layout_kind=layout, title=title, detail_limit=detail_limit,
                                contributions=contributions, view=view, parts=parts)

    def __repr__(self):
        return f"<TracePlayer: {self.data['title']}>"

    def html(self):
        """A self-contained HTML snippet: style, a fallback text, and the script that
        replaces the fallback with the player (so no JavaScript = readable text)."""
        payload = json.dumps(self.data, separators=(",", ":"))
        uid = f"ringlab-player-{hashlib.sha1(payload.encode()).hexdigest()[:10]}-{next(_counter)}"
        # "<" escaped inside the script, so a chunk label or span name containing
        # "</script>" cannot end the script early.
        payload = payload.replace("<", "\\u003c")
        fallback = html.escape(f"Trace player: {self.data['title']}. It needs JavaScript: in Jupyter, "
                               "trust the notebook and run the cell again.")
        return (f"<style>{_asset('player.css')}</style>\n"
                f'<div class="ringlab-player" id="{uid}"><div class="rlp-fallback">{fallback}</div></div>\n'
                f"<script>\n{_asset('player.js')}\n"
                f'window.RinglabPlayer.mount(document.getElementById("{uid}"), {payload});\n</script>\n')

    def _repr_html_(self):
        return self.html()

    def page(self):
        """A complete HTML document around the player."""
        title = html.escape(self.data["title"])
        return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
                '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
                f"<title>{title}</title>\n</head>\n<body>\n{self.html()}</body>\n</html>\n")

    def save(self, path):
        """Write the standalone page to ``path``; returns the path."""
        path = Path(path)
        path.write_text(self.page(), encoding="utf-8")
        return path


def show(trace, **options):
    """The player for ``trace`` (options: ``layout`` in LAYOUTS, ``title``, ``detail_limit``,
    ``contributions``, ``view`` in VIEW_NAMES, ``parts``: see player_data)."""
    return TracePlayer(trace, **options)


def show_run(res, inputs, **options):
    """The player for a run made with ``record_payloads=True``, coloured by what
    its messages carried (``contributions(res, inputs)``), labels or not."""
    return TracePlayer(res.trace, contributions=contributions(res, inputs), **options)


def save_html(trace, path, **options):
    """Write ``trace``'s player as a standalone ``.html`` page; returns the path."""
    return TracePlayer(trace, **options).save(path)


# The trace's own methods (``trace.show()``, ``trace.save_html()``, ``res.show(inputs)``)
# hand the trace to these.
VIEWS.update(player=TracePlayer, save_html=save_html, run_player=show_run)
