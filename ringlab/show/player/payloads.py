"""What each message of a run really carried, read back from its payload.

The player colours chunks from ``chunk=``/``op=`` labels, but a learner's own
program usually sends without them. When the run recorded its payloads
(``ringlab.run(..., record_payloads=True)``) the values themselves say what was
sent, given the inputs:

* a **copy** (AllGather, broadcast): the payload is, piece by piece, equal to
  some rank's input: "rank 2's block";
* a **sum** (AllReduce, reduce-scatter, reduce): the payload equals the same
  slice of several ranks' inputs added up. Which subset? With random float
  inputs only one subset of the ranks' inputs sums to it, so we try them all
  (2^N subsets, fine for the small worlds of the book).

Inputs must differ between ranks for this to work: with ``np.ones`` everywhere
every subset of the same size sums to the same values, and nothing can be told
apart. Use random inputs::

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> inputs = [np.random.default_rng(r).random(8) for r in range(4)]
    >>> res = ringlab.run(ring_allreduce, inputs, record_payloads=True)
    >>> c = contributions(res, inputs)
    >>> c.mode, c.chunks
    ('sum', [0, 1, 2, 3])
    >>> e = res.trace.at_step(2)[0]              # rank 0 passes on what it added up
    >>> e.src, sorted(c.carried[res.trace.events.index(e)][1])
    (0, [0, 3])

``Contributions.holdings`` is then the same table as ``ringlab.show.views.holdings``
gives for a labelled trace (``h[step][rank][chunk]`` = set of ranks), so the
player draws an unlabelled run just like the reference one. A message says
what its sender held; in between, what a receiver does with a message (add it
or overwrite with it) is a guess: "add" when it brings contributions the
receiver lacks and holds none of the receiver's, otherwise "overwrite". The
next time that rank sends the chunk, or at the end its output, shows what it
really held, and the table follows that.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ...sums import SubsetSums

MAX_SUBSET_RANKS = 12          # 2^12 subsets to try per message
MAX_TABLE = 1 << 22            # subsets x vector length: the table of all subset sums
MAX_CELLS = 64                 # as the player's MAX_CHUNKS


@dataclass
class Contributions:
    """What every message of a run carried. ``mode``: ``"sum"`` (chunks are
    pieces of the one vector every rank starts with) or ``"copy"`` (chunks are
    pieces of the ranks' own inputs, numbered by origin rank when each input is
    one piece). ``chunks``: the chunk labels. ``ranges``: per chunk, its
    elements as ``(origin rank or None, start, stop)``. ``carried[i]``: for
    trace event i, ``(chunk indices, frozenset of ranks)`` or None where the
    payload is neither a copy nor a sum of the inputs. ``ops[i]``: "reduce",
    "copy" or None. ``holdings[s][rank][chunk]``: the ranks whose contributions
    it holds after step s. ``note``: what could not be read, if anything."""

    mode: str
    chunks: list
    ranges: list
    carried: list
    ops: list
    holdings: list
    note: str = ""


def contributions(res, inputs):
    """Read back what each message of ``res`` carried, given the run's ``inputs``
    (the list passed to ``ringlab.run``). ``res`` must come from
    ``ringlab.run(..., record_payloads=True)``. See the module docstring."""
    if res.payloads is None:
        raise ValueError("contributions() reads the payloads: run with "
                         "ringlab.run(..., record_payloads=True)")
    trace = res.trace
    n = trace.world_size
    if len(inputs) != n:
        raise ValueError(f"{len(inputs)} inputs for a run of {n} ranks")
    xs = [None if x is None else _flat(x) for x in inputs]      # None: nothing to read back
    payloads = [_flat(res.payloads.get(_key(e))) for e in trace]

    # Copies first: if every message is a piece-by-piece copy of inputs, it is a
    # gather or broadcast (a ring AllReduce's first messages are copies too, but
    # its later ones are sums).
    pieces = [_copy_pieces(p, xs) for p in payloads]
    lengths = {len(x) for x in xs if x is not None}
    summable = all(x is not None for x in xs) and len(lengths) == 1 and n <= MAX_SUBSET_RANKS
    if all(p is not None for p in pieces) or not summable:
        return _copy_mode(trace, xs, pieces)
    return _sum_mode(trace, res, xs, payloads)


def _key(e):
    return (e.group, e.stream, e.src, e.dst, e.tag, e.seq)


def _flat(payload):
    try:
        return np.asarray(payload, dtype=np.float64).ravel()
    except (TypeError, ValueError):       # not numbers: nothing to read back
        return None


# -- copies: pieces of the ranks' inputs, in order ----------------------------------

def _copy_pieces(p, xs):
    """``p`` as consecutive pieces ``(rank, start, stop)`` of the inputs ``xs``, or None.
    Greedy: at each position, the longest run of equal values in some input."""
    if p is None or len(p) == 0:
        return None
    out, i = [], 0
    while i < len(p):
        best = None
        for r, x in enumerate(xs):
            if x is None:
                continue
            for o in np.flatnonzero(x == p[i]):
                k = 1
                while i + k < len(p) and o + k < len(x) and x[o + k] == p[i + k]:
                    k += 1
                if best is None or k > best[2] - best[1]:
                    best = (r, int(o), int(o) + k)
        if best is None:
            return None
        out.append(best)
        i += best[2] - best[1]
    return out


def _cells(bounds_by_origin):
    """Split each origin's ``[0, length)`` at every boundary a message used."""
    return [(origin, a, b) for origin, bounds in bounds_by_origin.items()
            for a, b in itertools.pairwise(sorted(bounds))]


def _covering(cells, origin, a, b):
    return [k for k, (o, lo, hi) in enumerate(cells) if o == origin and a <= lo and hi <= b]


def _copy_mode(trace, xs, pieces):
    n = trace.world_size
    bounds = {r: {0, len(x)} for r, x in enumerate(xs) if x is not None and len(x)}
    for ps in pieces:
        for r, a, b in ps or ():
            bounds[r] |= {a, b}
    cells = _cells(bounds)
    if len(cells) > MAX_CELLS:
        return _too_many(trace, "copy", cells)
    one_each = len(cells) == len(bounds)
    labels = [o for o, _, _ in cells] if one_each else list(range(len(cells)))
    carried = []
    for ps in pieces:
        if ps is None:
            carried.append(None)
            continue
        ks = [k for r, a, b in ps for k in _covering(cells, r, a, b)]
        carried.append((ks, frozenset(r for r, _, _ in ps)))
    # A rank starts with its own input only; everything else it holds arrived.
    start = {r: {k: (frozenset([r]) if o == r else frozenset()) for k, (o, _, _) in enumerate(cells)}
             for r in range(n)}
    h = [start]
    by_step = _indexed_by_step(trace)
    for s in range(1, trace.steps + 1):
        state = {r: dict(cs) for r, cs in h[-1].items()}
        for i, e in by_step.get(s, ()):
            if carried[i]:
                for k in carried[i][0]:
                    state[e.dst][k] = frozenset([cells[k][0]])
        h.append(state)
    bad = sum(c is None for c in carried)
    note = f"{bad} message(s) carry values that are not copies of the inputs." if bad else ""
    return Contributions("copy", labels, cells, carried,
                         [None if c is None else "copy" for c in carried], h, note)


def _indexed_by_step(trace):
    out = {}
    for i, e in enumerate(trace):
        out.setdefault(e.step, []).append((i, e))
    return out


def _too_many(trace, mode, cells):
    return Contributions(mode, [], [], [None] * len(trace), [None] * len(trace), [],
                         f"The messages cut the data into {len(cells)} pieces, more than the "
                         f"player draws ({MAX_CELLS}).")


# -- sums: the same slice of several ranks' inputs, added up --------------------------

def _sum_mode(trace, res, xs, payloads):
    n, length = trace.world_size, len(xs[0])
    if (1 << n) * length > MAX_TABLE:
        return Contributions("sum", [], [], [None] * len(trace), [None] * len(trace), [],
                             f"Too big to read back sums: {n} ranks x {length} elements.")
    # Every subset's sum, for every element: a payload of length m is then the
    # slice o:o+m of one subset's sum (ringlab.sums, as the graders read sums).
    table = SubsetSums(xs)
    found = [table.find(p) for p in payloads]
    outputs = [table.find(_flat(y)) if y is not None else None for y in res.outputs]
    bounds = {0, length}
    for f in found:
        if f:
            bounds |= {f[0], f[1]}
    cells = _cells({None: bounds})
    if len(cells) > MAX_CELLS:
        return _too_many(trace, "sum", cells)
    labels = list(range(len(cells)))        # for np.array_split(x, n)'s chunks: the same numbers
    carried = [None if f is None else (_covering(cells, None, f[0], f[1]), f[2]) for f in found]
    h = _replay_sums(trace, cells, carried, outputs)
    ops = _sum_ops(trace, carried, h)
    bad = sum(c is None for c in carried)
    note = (f"{bad} message(s) carry values that are not a sum of the same slice of some ranks' "
            f"inputs (a rank counted twice? inputs that are not all different?)." if bad else "")
    return Contributions("sum", labels, cells, carried, ops, h, note)


def _replay_sums(trace, cells, carried, outputs):
    n = trace.world_size
    state = {r: {k: frozenset([r]) for k in range(len(cells))} for r in range(n)}
    h = [state]
    by_step = _indexed_by_step(trace)
    for s in range(1, trace.steps + 1):
        # What a rank sends at step s is what it held after step s - 1: a fact, not a guess.
        for i, e in by_step.get(s, ()):
            if carried[i]:
                for k in carried[i][0]:
                    h[-1][e.src][k] = carried[i][1]
        state = {r: dict(cs) for r, cs in h[-1].items()}
        for i, e in by_step.get(s, ()):
            if carried[i]:
                for k in carried[i][0]:
                    held, got = state[e.dst][k], carried[i][1]
                    state[e.dst][k] = held | got if not held & got else got
        h.append(state)
    for r, out in enumerate(outputs):          # the outputs are facts too
        if out is not None:
            for k in _covering(cells, None, out[0], out[1]):
                h[-1][r][k] = out[2]
    return h


def _sum_ops(trace, carried, h):
    """"reduce" where the receiver ends up with more than the message brought, else "copy"."""
    ops = []
    for i, e in enumerate(trace):
        if carried[i] is None:
            ops.append(None)
            continue
        after = h[e.step][e.dst]
        ops.append("reduce" if any(after[k] > carried[i][1] for k in carried[i][0]) else "copy")
    return ops
