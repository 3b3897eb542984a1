"""What the graders of sharded data parallelism share (ZeRO-1, -2, -3 and
HSDP, which is ZeRO-3 inside each shard group): the hidden cases, the
data-parallel reference, the labels of the messages, the collectives they add
up to, and the state handed to the learner.

A *segment* is a list of parameter names laid out as one flat vector, padded
with zeros at the end to a multiple of N and cut into N equal shards: the
whole model for ZeRO-1, each bucket for ZeRO-2, each unit for ZeRO-3.
"""

import functools
import tracemalloc
from collections import defaultdict

import numpy as np

from .reductions import ring_members
from .report import Case, Failure, numbers

from .running import run_case
from .driver import problem, problem_text
from ...nn import Adam, mlp_model, mse

STEPS, LR, TOL = 3, 0.01, 1e-10
SEP = "\x1f"          # between the parts of a problem a driver reports


# ------------------------------------------------------------------------- the model
def names_of(sizes):
    """``mlp_model(sizes)``'s parameter names, forward order (GeLUs in between)."""
    return [f"{2 * i}.{k}" for i in range(len(sizes) - 1) for k in ("weight", "bias")]


def shapes_of(sizes):
    return {name: ((sizes[int(name.split(".")[0]) // 2], sizes[int(name.split(".")[0]) // 2 + 1])
                   if name.endswith("weight") else (sizes[int(name.split(".")[0]) // 2 + 1],))
            for name in names_of(sizes)}


def padded(numel, n):
    return -(-numel // n) * n


def flat(named, names, n):
    """The segment ``names`` of ``named`` as one vector, zero-padded to a multiple of n."""
    v = np.concatenate([np.ravel(named[k]) for k in names])
    return np.concatenate([v, np.zeros(padded(len(v), n) - len(v))])


def unflat(vectors, segments, shapes):
    """Segments' vectors back to ``{name: array}``."""
    out = {}
    for v, names in zip(vectors, segments):
        offset = 0
        for k in names:
            size = int(np.prod(shapes[k]))
            out[k] = v[offset:offset + size].reshape(shapes[k])
            offset += size
    return out


def forward_vector(named, sizes):
    return np.concatenate([np.ravel(named[k]) for k in names_of(sizes)])


# ------------------------------------------------------------------------- the cases
def make_case(rng, n, batch, sizes, segments, *, label, measure=False, shards=None, **more):
    """A hidden case: world size n, STEPS global batches of ``batch`` rows, each
    segment padded to a multiple of ``shards`` (default n: every rank a shard)."""
    seed = int(rng.integers(2**31))
    shards = shards or n
    small = [s for s in segments
             if sum(int(np.prod(shapes_of(sizes)[k])) for k in s) < n * shards]
    if small:
        # Then a chunk could be all padding: zeros, which any collective could carry.
        raise ValueError(f"grader: segment {small[0]} too small for world size {n}")
    batches = [(rng.standard_normal((batch, sizes[0])), rng.standard_normal((batch, sizes[-1])))
               for _ in range(STEPS)]
    inputs = [[(np.array_split(x, n)[r], np.array_split(y, n)[r], batch) for x, y in batches]
              for r in range(n)]
    numel = sum(int(np.prod(s)) for s in shapes_of(sizes).values())
    spec = dict(sizes=list(sizes), seed=seed, lr=LR, segments=[list(s) for s in segments],
                measure=measure, **more)
    shapes = shapes_of(sizes)
    pads = [padded(sum(int(np.prod(shapes[k])) for k in s), shards) for s in segments]
    info = dict(spec, batches=batches, batch=batch, numel=numel, pads=pads, shards=shards)
    info["ref"] = reference(info, n)
    rows = sorted({len(a) for a, _, _ in (inp[0] for inp in inputs)})
    shards = "equal" if len(rows) == 1 else "unequal"
    text = (f"world_size={n}, model {sizes} ({numel} parameters), global batch {batch} "
            f"({shards} shards){label}")
    return Case(n, inputs, text, args=(spec,), info=info)


def reference(info, n, combine=None):
    """Data-parallel Adam, one record per step: each segment's vector ``before``
    and ``after`` the update (padded to a multiple of ``info["shards"]``, else
    n), and ``grads[r][s]``: rank r's mean gradient on its shard of the batch
    weighted by its share of it (what it reduce-scatters).
    ``combine(grads, rows, batch, n, s)``: segment s's gradient from the ranks'
    (default: their sum, the batch's mean gradient); the learners' mistakes."""
    sizes, segments = info["sizes"], info["segments"]
    model = mlp_model(sizes, np.random.default_rng(info["seed"]))
    params = model.named_parameters()
    pad = info.get("shards") or n
    vectors = [flat(params, s, pad) for s in segments]
    opt = Adam({str(i): v for i, v in enumerate(vectors)}, info["lr"])
    shapes = shapes_of(sizes)
    record = []
    for x, y in info["batches"]:
        for k, v in unflat(vectors, segments, shapes).items():
            params[k][...] = v
        before = [v.copy() for v in vectors]
        grads, rows = [], []
        for xs, ys in zip(np.array_split(x, n), np.array_split(y, n)):
            model.zero_grad()
            model.backward(mse(model.forward(xs), ys)[1])
            g = model.named_grads()
            grads.append([flat(g, s, pad) * (len(xs) / len(x)) for s in segments])
            rows.append(len(xs))
        total = {str(s): (sum(g[s] for g in grads) if combine is None
                          else combine(grads, rows, len(x), n, s)) for s in range(len(segments))}
        opt.step(total)
        record.append(dict(before=before, after=[v.copy() for v in vectors], grads=grads))
    return record


def final_vector(info, record):
    shapes = shapes_of(info["sizes"])
    return forward_vector(unflat(record[-1]["after"], info["segments"], shapes), info["sizes"])


def _front(info, s, v):
    """Segment s's gradient with its padding at the front instead of the end."""
    numel = sum(int(np.prod(shapes_of(info["sizes"])[k])) for k in info["segments"][s])
    return np.concatenate([np.zeros(len(v) - numel), v[:numel]])


# The usual mistakes, as the segment gradient they produce from the ranks' weighted ones.
MISTAKES = [
    ("each rank's gradient weighted equally (1/N) instead of by its share of the batch",
     lambda g, rows, b, n, s, info: sum(gr[s] * b / k for gr, k in zip(g, rows)) / n,
     "With shards of different sizes the mean of the ranks' means is not the batch's mean: "
     "weight your mean gradient by len(x) / batch_size before the ReduceScatter."),
    ("summed over the ranks, not averaged",
     lambda g, rows, b, n, s, info: sum(gr[s] * b / k for gr, k in zip(g, rows)),
     "The ReduceScatter sums; weight each rank's mean gradient by len(x) / batch_size so "
     "that the sum is the batch's mean gradient."),
    ("averaged twice (weighted by len(x) / batch_size and divided by N)",
     lambda g, rows, b, n, s, info: sum(gr[s] for gr in g) / n,
     "Weight by len(x) / batch_size once, and do not divide by the world size as well."),
    ("the padding put at the front of the flat gradient, so the shards do not line up",
     lambda g, rows, b, n, s, info: _front(info, s, sum(gr[s] for gr in g)),
     "Pad at the END, to a multiple of N (ringlab.nn.flatten(grads, pad_to=N)): shard r of "
     "the gradient must be the same numbers as shard r of the master weights."),
]


def diagnose_params(case, got, mistakes=MISTAKES):
    """Which mistake gives these parameters, if one of ``mistakes`` does."""
    info = case.info
    for words, combine, hint in mistakes:
        wrong = reference(info, case.world_size,
                          combine=lambda g, rows, b, n, s, c=combine: c(g, rows, b, n, s, info))
        if np.allclose(got, final_vector(info, wrong), rtol=0, atol=TOL):
            return f"exactly the parameters you get with the gradient {words}", hint
    return None, None


def compare_params(case, got, who, mistakes=MISTAKES):
    """A Failure unless ``got`` (forward order, unpadded) equals data-parallel Adam;
    ``mistakes``: the usual ones, named when one gives ``got``."""
    want = final_vector(case.info, case.info["ref"])
    if got.shape == want.shape and np.allclose(got, want, rtol=0, atol=TOL):
        return None
    if got.shape != want.shape:
        return Failure(case.label, "parameters equal data-parallel Adam",
                       f"{who} holds {got.size} parameters, the model has {want.size}",
                       expected=f"{want.size} numbers", got=f"{got.size} numbers")
    words, hint = diagnose_params(case, got, mistakes)
    bad = int(np.argmax(np.abs(got - want)))
    return Failure(case.label, "parameters equal data-parallel Adam",
                   f"after {STEPS} steps {who}'s parameters differ from data-parallel Adam's by "
                   f"up to {np.abs(got - want).max():.3g} (tolerance {TOL:g}), most at "
                   f"parameter {bad} of {want.size}" + (f":\n{words}" if words else ""),
                   expected=f"data-parallel Adam: {numbers(want[bad:])}",
                   got=numbers(got[bad:]),
                   hint=hint or "ZeRO changes who stores what, not the arithmetic: Adam on "
                                "your shard of the summed, weighted gradient must give the "
                                "numbers data parallelism gives.")


# ---------------------------------------------------------------------------- running
def run_measured(program, case, backend, **kw):
    """``run_case``; in this process, tracing memory stops afterwards if it was
    started for this run (it slows every allocation down)."""
    was = tracemalloc.is_tracing()
    try:
        # 40 s (120 s under ringlab grade): the measured case is the heaviest. Isolated,
        # ZeRO-3's takes 11 s on an idle 2-core machine, 50 s with it loaded, and once over
        # 60 s in CI. A program that never ends is stopped by the small cases before it.
        return run_case(program, case, backend, timeout=40.0, **kw)
    finally:
        if not was and tracemalloc.is_tracing():
            tracemalloc.stop()


def trained(train, program, case, backend, explain, **kw):
    """Run ``train`` (the grader's rank function) with the learner's ``program``
    on ``case``: (result, None) if it ran and every rank's outputs read, else
    (None, the Failure; a failed run's ``explain``ed)."""
    result, failure = run_measured(functools.partial(train, learner=program), case, backend,
                                   **kw)
    if failure:
        return None, explain(failure)
    failure = read_outputs(result, case)
    return (None, failure) if failure else (result, None)



def explain_padding(failure):
    """A failed run's hint where shapes disagree: the flat gradient unpadded, or
    padded so that a ReduceScatter's chunk is not the master shard's size."""
    text = f"{failure.what}\n{failure.got or ''}"
    if "could not be broadcast" in text or "shape" in text and "(" in text:
        failure.hint = ("Shapes disagree: the flat gradient must be padded with zeros at the "
                        "end to a multiple of N (flatten(grads, pad_to=N)), so that the "
                        "ReduceScatter's chunk r has exactly the size of your master shard. "
                        + (failure.hint or ""))
    return failure


# ---------------------------------------------------------------------------- outputs
def report_problem(check, what, hint=""):
    """What a driver returns when the state it handed over is wrong after a step."""
    return problem(SEP.join([check, what, hint]))


def read_outputs(result, case):
    """A Failure for a driver's problem, else the outputs without the marker."""
    for r, out in enumerate(result.outputs):
        text = problem_text(out)
        if text is not None:
            check, what, hint = (text.split(SEP) + ["", ""])[:3]
            return Failure(case.label, check, what, hint=hint or None)
        if not (isinstance(out, (list, tuple)) and len(out) >= 2):
            return Failure(case.label, "the program runs without error",
                           f"rank {r}'s result could not be read")
    return None


# ------------------------------------------------------------------------- messages
def label_messages(result, case, ag_when):
    """Label every message: ("RS", s, t) if it holds a ring partial sum of the
    ranks' weighted gradients of segment s at step t (a ReduceScatter's, or an
    AllReduce's), ("AG", s, t) if it holds one rank's shard of segment s's
    parameters (``ag_when``: "after" step t's update, ZeRO-1/2, or "before" it,
    ZeRO-3). Returns ({rank: [(label, event), ...] in send order}, None) or
    (None, Failure) for the first message that holds neither."""
    n, info = case.world_size, case.info
    index = _Index(info["ref"], ag_when, n, float(info["batch"]))
    out = defaultdict(list)
    for e in sorted(result.trace, key=lambda e: (e.step, e.stream, e.seq)):
        p = result.payload(e) if result.payloads is not None else None
        label = index.label(p, e)
        if label is None:
            return None, _unlabelled(case, e, p, ag_when)
        out[e.src].append((label, e))
    return out, None


class _Index:
    """The candidates for a message of each size: every segment's chunks of
    parameters (AllGather) and the ranks' gradients (ReduceScatter), per step."""

    def __init__(self, ref, ag_when, n, batch):
        self.n, self.batch = n, batch
        self.by_size = defaultdict(list)
        for t, step in enumerate(ref):
            for s, vec in enumerate(step[ag_when]):
                size = len(vec) // n
                grads = np.array([g[s] for g in step["grads"]])
                # (rank, chunk, element): the chunks each rank's gradients are cut into
                self.by_size[size].append((t, s, vec.reshape(n, size),
                                           grads.reshape(len(grads), n, size),
                                           np.abs(grads).max(axis=1, initial=0)))
        self.sent = defaultdict(int)           # (rank, s, t) -> ReduceScatter messages so far
        self.last = defaultdict(int)           # rank -> the step of its last message
        self.segment = defaultdict(int)        # rank -> the segment of its last message

    def label(self, p, e):
        if not (type(p) is np.ndarray and p.dtype == np.float64 and p.ndim == 1):
            return None
        cands = self.by_size.get(p.size, [])
        # Steps come in order, and a rank's messages of one segment follow each
        # other: look at this rank's current step first, nearest its last segment.
        t0, s0 = self.last[e.src], self.segment[e.src]
        cands = sorted(cands, key=lambda c: (c[0] < t0, c[0], abs(c[1] - s0)))
        # Three elements first: with many segments of one size, the whole-array
        # comparisons only for the candidates that those do not already rule out.
        probe = np.unique([0, p.size // 2, p.size - 1]) if p.size else slice(None)
        every = np.arange(self.n)
        for t, s, chunks, grads, largest in cands:
            # The whole message is compared only with the chunks its three elements
            # match (none: no whole comparison), and with the ranks' partial sums only
            # where that could still decide the label.
            rows = _shard_rows(chunks, p, probe, every)
            ag = rows.size > 0 and _shard_rows(chunks, p, slice(None), rows).size > 0
            i = self.sent[e.src, s, t]
            # A chunk of padding only is zeros either way: it belongs to the
            # ReduceScatter until that has sent its N-1 messages.
            rs = False
            if not ag or i < self.n - 1:
                rows = self._partial_sum_rows(p, e, grads, largest, i, probe, every)
                rs = rows.size > 0 and self._partial_sum_rows(
                    p, e, grads, largest, i, slice(None), rows).size > 0
            if rs:
                self.sent[e.src, s, t] += 1
                self.last[e.src], self.segment[e.src] = t, s
                return ("RS", s, t)
            if ag:
                self.last[e.src], self.segment[e.src] = t, s
                return ("AG", s, t)
        return None

    def _partial_sum_rows(self, p, e, grads, largest, i, where, rows):
        """Those of the chunks ``rows`` whose elements ``where`` ``p[where]`` is: the
        same elements of a chunk of the sum, over the i+1 ranks before the sender on
        the ring (itself included; all N from the N-th message on), of their weighted
        gradients, times 1 or the batch size (weights n_r instead of n_r / B, divided
        after). Rounding allowed relative to the numbers added (``largest``: each
        rank's largest |gradient|)."""
        n = self.n
        members = ring_members(e, n, min(i + 1, n))
        parts = grads[:, :, where][:, rows][members]      # (member, chunk, element)
        total = parts.sum(axis=0)
        tol = 1e-7 * np.abs(parts).sum(axis=0) + 1e-12 * (largest[members].max() + 1e-300)
        got = p[where]
        match = np.zeros(len(rows), dtype=bool)
        for scale in (1.0, self.batch):
            match |= np.all(np.abs(got - scale * total) <= scale * tol, axis=1)
        return rows[match]


def _shard_rows(chunks, p, where, rows):
    """Those of the ``chunks`` (rows, by index) whose elements ``where`` ``p[where]`` is."""
    c = chunks[:, where][rows]
    return rows[np.all(np.abs(c - p[where]) <= 1e-9 * np.abs(c) + 1e-12, axis=1)]


def _unlabelled(case, e, p, ag_when):
    n, info = case.world_size, case.info
    sizes = sorted({len(v) // n for v in info["ref"][0]["before"]})
    what = (f"at step {e.step} rank {e.src} sent rank {e.dst} "
            f"{getattr(p, 'size', '?')} values ({e.nbytes} bytes)")
    hint = ("The grader reads every message: a ReduceScatter must carry your weighted "
            "gradients (partial sums around the ring), an AllGather your shard of the "
            "parameters, float64, one chunk of the zero-padded flat vector per message.")
    whole = _whole_shard(p, info, n, ag_when)
    if whole is not None:
        part = "bucket" if ag_when == "after" else "unit"
        q, t = whole
        what += (f": rank {q}'s whole shard of the parameters, its pieces of all "
                 f"{len(info['segments'])} {part}s in one message (training step {t + 1}): "
                 f"one AllGather of the whole shard, not one per {part}")
        hint = (f"AllGather each {part}'s piece on its own, {part} by {part}: "
                + ("for names, piece in zip(layout.names, layout.pieces(opt.params['param'])):"
                   " ring_allgather(comm, piece) is that bucket's padded flat parameters."
                   if ag_when == "after" else
                   "gather a unit's shard just before the unit's forward (and backward)."))
    elif isinstance(p, np.ndarray) and p.ndim == 1 and p.size not in sizes:
        what += (f": no chunk has that size; the padded flat vectors cut into {n} equal "
                 f"chunks of {', '.join(map(str, sizes))} values")
        hint = ("Pad each flat vector with zeros at the end to a multiple of N before cutting "
                "it: equal chunks, and chunk r lines up with rank r's shard.")
    elif isinstance(p, np.ndarray) and p.ndim == 1 and ag_when == "after" and any(
            np.allclose(p, v[q * p.size:(q + 1) * p.size], rtol=1e-9, atol=1e-12)
            for st in info["ref"] for v in st["before"] if len(v) // n == p.size
            for q in range(n)):
        what += ": a shard of the parameters from BEFORE this step's update"
        hint = ("All-gather after opt.step: every rank must receive the others' UPDATED "
                "shards.")
    else:
        what += (": neither a partial sum of the ranks' weighted gradients (a ReduceScatter's "
                 "chunk) nor one rank's shard of the parameters (an AllGather's)")
    # the whole shard carries the right data in the wrong collectives: say which
    check = ("collectives: which, how many, what size" if whole is not None
             else "every message carries gradients or parameter shards")
    return Failure(case.label, check, what,
                   expected="ReduceScatter: chunk of the summed weighted gradients; "
                            "AllGather: one rank's shard of the parameters"
                            + ("" if whole is None else f" of one {part}, one AllGather per "
                                                        f"{part}"),
                   got=numbers(p) if isinstance(p, np.ndarray) else repr(p)[:80], hint=hint)


def _whole_shard(p, info, n, ag_when):
    """(rank, step) when ``p`` is that rank's pieces of every segment, one after the
    other (the message of one AllGather of a whole shard of several segments), else
    None."""
    if not (isinstance(p, np.ndarray) and p.ndim == 1 and len(info["segments"]) > 1):
        return None
    for t, step in enumerate(info["ref"]):
        vecs = step[ag_when]
        if p.size != sum(len(v) // n for v in vecs):
            return None
        for q in range(n):
            shard = np.concatenate([v[q * (len(v) // n):(q + 1) * (len(v) // n)] for v in vecs])
            if np.allclose(p, shard, rtol=1e-9, atol=1e-12):
                return q, t
    return None


def counted_messages(result, case, ag_when, expected, what_s):
    """(labelled messages, None) if every message is labelled (``label_messages``)
    and each rank sent the ``expected`` calls (``count_failure``), else (None, the
    Failure); with one rank, (None, None) if nothing was sent: nothing to check."""
    if case.world_size == 1:
        return None, (None if len(result.trace) == 0 else Failure(
            case.label, "collectives: which, how many, what size",
            f"world_size=1, yet {len(result.trace)} message(s) were sent"))
    labelled, failure = label_messages(result, case, ag_when)
    failure = failure or count_failure(case, labelled, expected, what_s)
    return (None, failure) if failure else (labelled, None)


def message_sizes(info, n):
    """The bytes of one ring message of each segment, as the reports list them."""
    return ", ".join(f"{p // n * 8}" for p in info["pads"])


def calls_by_step(labelled, n):
    """(rank, step t, ``[(kind, segment)]``: the rank's calls of step t, in order)."""
    for r in range(n):
        calls = calls_of(labelled.get(r, []), n)
        for t in range(STEPS):
            yield r, t, [(k, s) for (k, s, tt), _, _ in calls if tt == t]


def ran(t, r, mine, name):
    """"training step t+1, rank r ran: ReduceScatter(...), AllGather(...)" for the
    calls ``mine`` (``calls_by_step``'s), ``name(segment)`` in the brackets."""
    return f"training step {t + 1}, rank {r} ran: " + ", ".join(
        f"{'ReduceScatter' if k == 'RS' else 'AllGather'}({name(s)})" for k, s in mine)


def calls_of(labelled, n, per_call=None):
    """``[(label, first event, messages)]``: a rank's messages grouped into calls
    of N-1 messages each (``per_call(label)`` each, if given; per label, in
    order), ordered by their first message."""
    by = defaultdict(list)
    for label, e in labelled:
        by[label].append(e)
    calls = []
    for label, events in by.items():
        size = per_call(label) if per_call else n - 1
        for k in range(0, len(events), size):
            part = events[k:k + size]
            calls.append((label, part[0], len(part)))
    calls.sort(key=lambda c: (c[1].step, c[1].stream, c[1].seq))
    return calls


def count_failure(case, labelled, expected, what_s):
    """Each (kind, s, t) in ``expected`` (a dict: label -> calls) must have exactly
    calls x (N-1) messages from every rank. ``what_s(s)``: "the gradients" etc."""
    n = case.world_size
    for r in range(n):
        counts = defaultdict(int)
        for label, _ in labelled.get(r, []):
            counts[label] += 1
        for label, calls in expected.items():
            got, want = counts.get(label, 0), calls * (n - 1)
            if got == want:
                continue
            kind, s, t = label
            name = "ReduceScatter" if kind == "RS" else "AllGather"
            what = (f"training step {t + 1}, rank {r}: {got} message(s) of {what_s(kind, s)}; "
                    f"{calls} ring {name}{'s' if calls > 1 else ''} send{'' if calls > 1 else 's'}"
                    f" {want} (N-1 = {n - 1} each)")
            hint = None
            if kind == "RS" and got == 2 * want:
                what += (": the gradients went round twice, an AllReduce (or a ReduceScatter "
                         "and an AllGather of the gradients)")
                hint = ("ZeRO never all-reduces: ReduceScatter the gradients (rank r keeps the "
                        "sum of shard r only), update your shard, then AllGather the updated "
                        "parameters.")
            elif got == 0:
                what += f": no {name} at all"
            return Failure(case.label, "collectives: which, how many, what size", what,
                           expected=f"{want} messages of {what_s(kind, s)}",
                           got=f"{got} messages", hint=hint)
    return None
