"""What the four tensor-parallel graders share: cases, driver, value and message checks.

A grader module describes its layer (see ``column_parallel_linear.py``):
``MODULE(dims[2], dims[3], rng)`` is the unsharded ``ringlab.nn`` layer, whose
parameters ``GRADS`` are the weights, and ``group(weights, rng, dims, t)`` draws
one tensor-parallel group's input and output gradient and returns an
``Expected``: each rank's inputs, the outputs the unsharded ``ringlab.nn``
layer gives for that rank's block, what each pass may communicate (``Pass``)
and the usual mistakes as formulas (``Mistake``). Its table ``OUTPUTS`` says,
of y, dx and each gradient, its shape, which block of the layer's it is and a
hint; ``NO_COMM`` (why a pass needs no message) only where a pass sends none,
``ERROR_HINT`` only where a case requires an error.

The checks, in order, on every case (t = 1 to 4, b and s not multiples of t,
the tp groups of a 2x2 mesh (dp x tp) and of a 3x2 one (tp x dp), whose tp
groups' ranks are strided):

1. it runs: no exception, deadlock or unreceived message;
2. forward returns ``(y, backward)`` and backward ``(dx, grads)`` with every
   gradient named, and every array has its shape;
3. every message is float64 (float32 on the wire rounds the values); then
   ``y``, ``dx`` and every gradient equal the unsharded layer's, per rank's
   block, to relative error 1e-10; a wrong value is matched against the
   mistakes' formulas to say which one it is;
4. the messages of each pass (the driver wraps forward and backward in spans
   of its own) stay in the tensor-parallel group, and each one is read element
   by element (recorded payloads): an element must be a partial sum, over some
   of the group's ranks, of the pass's AllReduce operand (rank r's partial
   product), as any AllReduce algorithm sends; the data a program could ship
   instead (shards of X, of dY, of the weights, hidden activations) are named.
   Then the volume: one bandwidth-optimal AllReduce of N elements on t ranks
   moves 2(t-1) N elements in the group (a ring, a tree, reduce-then-broadcast);
   twice that is two AllReduces. And every rank must have received, in partial
   sums, every other rank's part of every element: the sum travels in the messages.

The last case repeats the first with, on rank r, the weights outside block r
replaced by noise: a program that computes the whole layer on every rank and
all-reduces for show only gives wrong values there.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field

import numpy as np

from ..kit.frames import without_grader_frames
from ..kit.checks import _ranks, ratio
from ..kit.report import Case, Failure, numbers
from ..kit.running import plain_array, run_case
from ..kit.driver import callable_learner, problem, problem_text
from ...errors import DeadlockError, RankError
from ...nn import Linear

TOL = 1e-10
FORWARD, BACKWARD = "tp-grader.forward", "tp-grader.backward"
PASSES = {"forward": FORWARD, "backward": BACKWARD}


@dataclass
class Pass:
    """What one pass (forward or backward) of one group may send.

    ``allreduces``: 0 or 1. ``alternatives``: lists of the t ranks' operands
    (same shape) whose AllReduce is right (several: e.g. the bias added on rank
    0 only before the sum is as right as after it). ``raw``: label -> (the t
    ranks' arrays, words for a message that holds them, hint)."""

    allreduces: int
    operand: str = ""
    alternatives: list = field(default_factory=list)
    raw: dict = field(default_factory=dict)
    hint: str = ""


@dataclass
class Mistake:
    """A usual mistake: the values it gives (output key -> the t ranks' arrays)."""

    outputs: dict
    what: str
    hint: str


@dataclass
class Expected:
    """One tensor-parallel group: inputs and expected outputs per rank (dicts in
    order y, dx, gradients), the passes, the mistakes; or, with ``error``, the
    exception every rank must raise: (type, [words its message must hold], why)."""

    inputs: list
    outputs: list = field(default_factory=list)
    passes: dict = field(default_factory=dict)
    mistakes: list = field(default_factory=list)
    error: tuple | None = None


# ------------------------------------------------------------------------ cases

def make_cases(rng, layer, shapes):
    """Cases for ``layer`` (a grader module): ``shapes`` is a list of
    (t, mesh, dims), mesh None (the world is the tp group) or (shape, names): the
    tp groups of a DeviceMesh, each with its own data (its rank numbers are then
    group-local). Every rank gets its own copies of the arrays."""
    # Last, the first shape again with, on each rank, the weights outside its own block
    # replaced by noise: a program that computes the whole layer on every rank (all the
    # weights are there) and all-reduces only for show gives wrong values there.
    for i, (t, mesh, dims) in enumerate([*shapes, shapes[0]]):
        members = tp_groups(t, mesh)
        unsharded = layer.MODULE(dims[2], dims[3], rng).named_parameters()
        weights = tuple(unsharded[n] for n in layer.GRADS)
        groups = [layer.group(weights, rng, dims, t) for _ in members]
        place = {g: (d, r) for d, ranks in enumerate(members) for r, g in enumerate(ranks)}
        inputs = [copy.deepcopy(groups[d].inputs[r]) for d, r in map(place.get, sorted(place))]
        where = ("the world" if mesh is None else
                 f"the tp groups of a {mesh[0][0]}x{mesh[0][1]} DeviceMesh "
                 f"({mesh[1][0]} x {mesh[1][1]})")
        label = f"t={t} ({where}), {layer.describe(dims)}"
        if i == len(shapes):
            for g, inp in enumerate(inputs):
                _noise_outside(layer, inp[0], layer.mine(dims, t, place[g][1]), rng)
            label += ("; on rank r, the weights outside block r are noise: "
                      "rank r may use only its own block")
        yield Case(len(inputs), inputs, label, args=(mesh, tuple(layer.GRADS)),
                   info=dict(t=t, mesh=mesh, groups=groups, dims=dims, members=members,
                             place=place))


def tp_groups(t, mesh):
    """The global ranks of each tp group, in group-rank order, as ``DeviceMesh``
    makes them (row-major; ``tp[k]``, k counting the other axis' positions):

        >>> tp_groups(2, ((2, 2), ("dp", "tp"))), tp_groups(3, ((3, 2), ("tp", "dp")))
        ([[0, 1], [2, 3]], [[0, 2, 4], [1, 3, 5]])
    """
    if mesh is None:
        return [list(range(t))]
    (rows, cols), names = mesh
    if names.index("tp") == 1:       # tp along a row: contiguous ranks
        return [[d * cols + r for r in range(cols)] for d in range(rows)]
    return [[r * cols + d for r in range(rows)] for d in range(cols)]   # along a column


def _noise_outside(layer, args, mine, rng):
    """Overwrite (in place) each split weight among one rank's arguments ``args`` with
    noise, except the rank's own indices ``mine``."""
    for i, name in enumerate(layer.GRADS):
        if name in layer.SPLIT:
            (axis, part), a = layer.SPLIT[name], args[1 + i]
            index = [slice(None)] * a.ndim
            index[axis] = np.setdiff1d(np.arange(a.shape[axis]), mine[part])
            a[tuple(index)] = rng.standard_normal(a[tuple(index)].shape)


def with_bias(parts, bias, t):
    """The operands of a right forward AllReduce: the partial products, or the bias
    added before the sum on one rank (any one) or as bias/t on every rank."""
    return ([parts] + [[p + bias if r == q else p for r, p in enumerate(parts)] for q in range(t)]
            + [[p + bias / t for p in parts]])


def block(n, t, r):
    """Rank r's equal contiguous block of range(n)."""
    return np.arange(r * n // t, (r + 1) * n // t)


# ----------------------------------------------------------------------- driver

RAISED = "raised"     # what a rank that raised the case's required error returns (as bytes)
RAISED_SPAN = "tp-grader.raised"     # and the span it opens: seen in a failed run's trace too


def drive(comm, inp, mesh, grad_names, learner, raises=None):
    """What every rank runs: forward (in the grader's span), then backward.

    Returns [status, y, dx, grads in ``grad_names`` order]; status is an empty
    array, or a message (uint8 bytes) when the program returned the wrong kind
    of thing, so that the grader can say so without a traceback of this code.
    ``raises``: (exception type, words) of a case that must fail; a rank that
    raises it returns the message "raised\\0TYPE\\0MESSAGE", so that the grader
    learns which ranks raised it, not only the first."""
    from ...mesh import DeviceMesh
    learner = callable_learner(learner)
    tp = comm if mesh is None else DeviceMesh(comm, *mesh).group("tp")
    args, dy = inp
    try:
        with comm.span(FORWARD):
            out = learner(tp, *args)
        if not (isinstance(out, tuple) and len(out) == 2 and callable(out[1])):
            return problem(f"the function returned {_kind(out)}; it must return a tuple "
                           f"(y, backward), backward a function of dy")
        y = out[0].copy() if type(out[0]) is np.ndarray else out[0]   # backward may reuse y
        with comm.span(BACKWARD):
            back = out[1](dy)
    except Exception as exc:
        if raises is None or not _is_required(exc, *raises):
            raise
        with comm.span(RAISED_SPAN):
            pass
        return problem("\0".join([RAISED, type(exc).__name__, str(exc)[:300]]))
    if not (isinstance(back, tuple) and len(back) == 2 and isinstance(back[1], dict)):
        return problem(f"backward(dy) returned {_kind(back)}; it must return a tuple "
                       f"(dx, grads), grads a dict {{name: gradient}}")
    grads = back[1]
    if set(grads) != set(grad_names):
        return problem(f"backward's grads has the keys {sorted(map(str, grads))}; they must be "
                       f"{list(grad_names)}, named as in ringlab.nn")
    values = {"y": y, "dx": back[0], **{f"grads[{n!r}]": grads[n] for n in grad_names}}
    for name, v in values.items():
        if not isinstance(v, np.ndarray):
            return problem(f"{name} is {_kind(v)}, not a numpy array")
    return [np.zeros(0), *values.values()]


def _kind(value):
    return f"a tuple of {len(value)}" if isinstance(value, tuple) else f"a {type(value).__name__}"


def _is_required(exc, kind, words):
    text = str(exc)
    return isinstance(exc, kind) and all(
        re.search(rf"(?<!\d){re.escape(w)}(?!\d)", text) for w in words)


def _raised_of(out):
    """(type name, message) of a rank's output that says it raised the required error."""
    parts = (problem_text(out) or "").split("\0")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == RAISED else None


# ------------------------------------------------------------------------ check

def check(program, case, backend, layer):
    want_error = case.info["groups"][0].error
    run = functools.partial(drive, learner=program,
                            raises=None if want_error is None else tuple(want_error[:2]))
    result, failure = run_case(run, case, backend)
    if want_error is not None:
        return _raised_everywhere(result, failure, case, want_error, layer)
    if failure:
        failure.got = without_grader_frames(failure.got)
        return failure
    return (_returned(result, case, layer) or _wire(result, case)
            or _values(result, case, layer) or _messages(result, case, layer))


def _raised_everywhere(result, failure, case, want, layer):
    """A case whose layer cannot be built: every rank raises the error (each rank is
    its own process, and one rank's exception does not stop the others). Which
    ranks raised it: their outputs, or in a failed run the span each opened."""
    kind, words, why = want
    name, n = kind.__name__, case.world_size
    check = f"raises {name} when {why}"
    expected = f"{name} on every rank, its message naming {' and '.join(words)}"
    hint = (f"{layer.ERROR_HINT} Every rank must raise it, before any communication: one "
            f"rank's exception does not stop the others.")
    if failure is None:
        said = [_raised_of(out) for out in result.outputs]
        raised = [g for g, x in enumerate(said) if x is not None]
        others = [g for g in range(n) if g not in raised]
        if not others:
            return None
        if not raised:
            return Failure(case.label, check, f"the program ran without raising {name}",
                           expected=expected, got="no error", hint=layer.ERROR_HINT)
        return Failure(case.label, check, f"{_ranks(raised)} raised {name} "
                       f"({said[raised[0]][1]!r}), {_ranks(others)} did not: every rank must "
                       f"raise it", expected=expected,
                       got=f"{_ranks(others)} returned without an error", hint=hint)
    err = failure.error
    raised = sorted({s.rank for s in getattr(getattr(err, "trace", None), "spans", ())
                     if s.path == RAISED_SPAN})
    done = f"{_ranks(raised)} raised {name} as required; " if raised else ""
    if isinstance(err, DeadlockError):       # the ranks that raised left; the others wait
        waiting = sorted(err.waiting)
        return Failure(case.label, check,
                       f"{done}{_ranks(waiting)} did not: every rank must raise it, but "
                       f"{_ranks(waiting)} went on past the check and wait for ranks that left:\n"
                       + "\n".join(f"  rank {r}: {w}" for r, w in sorted(err.waiting.items())),
                       expected=expected, got=f"{_ranks(waiting)} raised nothing",
                       hint=hint, error=err)
    if not isinstance(err, RankError):
        return failure
    r, its, text = err.rank, type(err.exc).__name__, str(err.exc)[:200]
    if raised:
        what = (f"{done}rank {r} did not: every rank must raise it, but rank {r} went on past "
                f"the check and failed there with {its}: {text}")
    elif isinstance(err.exc, kind):
        what = (f"rank {r} raised {its} ({text!r}), whose message does not name "
                f"{' and '.join(words)}")
    else:
        what = f"rank {r} raised {its}, not {name}: {text}"
    return Failure(case.label, check, what, expected=expected,
                   got=without_grader_frames(failure.got), hint=hint, error=err)


def who(case, g):
    if case.info["mesh"] is None:
        return f"rank {g}"
    d, r = case.info["place"][g]
    return f"rank {g} (rank {r} of its tp group, tp[{d}])"


def _returned(result, case, layer):
    for g, out in enumerate(result.outputs):
        if not (isinstance(out, (list, tuple)) and out and isinstance(out[0], np.ndarray)):
            return Failure(case.label, "returns (y, backward); backward returns (dx, grads)",
                           f"{who(case, g)} returned nothing the grader can read",
                           hint="Return (y, backward) from the function, (dx, grads) from "
                                "backward.")
        text = problem_text(out)
        if text is not None:
            return Failure(case.label, "returns (y, backward); backward returns (dx, grads)",
                           f"{who(case, g)}: {text}", expected=layer.RETURNS,
                           hint="Follow the signature in the exercise's first cell.")
        d, r = case.info["place"][g]
        for (key, w), v in zip(case.info["groups"][d].outputs[r].items(), out[1:]):
            failure = plain_array(case, f"{who(case, g)}'s {_name(key)}", v,
                                  f"an array of shape {w.shape}")
            if failure or v.shape != w.shape:
                return failure or Failure(
                    case.label, "every output has its shape", f"{who(case, g)}: {_name(key)} has "
                    f"shape {v.shape}", expected=f"shape {w.shape}: {layer.OUTPUTS[key][0]}",
                    got=f"shape {v.shape}", hint=layer.SHAPE_HINT)
    return None


def _name(key):
    return key if key in ("y", "dx") else f'grads["{key}"]'


def rel_error(got, want):
    scale = np.abs(want).max(initial=0.0)
    diff = np.abs(got - want).max(initial=0.0)
    return diff / scale if scale > 0 else diff


def close(got, want):
    return (got.shape == want.shape and bool(np.all(np.isfinite(got)))
            and rel_error(got, want) <= TOL)


def _values(result, case, layer):
    t = case.info["t"]
    for i, key in enumerate(case.info["groups"][0].outputs[0]):
        for g, out in enumerate(result.outputs):
            d, r = case.info["place"][g]
            ex = case.info["groups"][d]
            got, want = out[1 + i], ex.outputs[r][key]
            if close(got, want):
                continue
            known = next((m for m in ex.mistakes
                          if key in m.outputs and close(got, m.outputs[key][r])), None)
            if known:
                what, hint = known.what, known.hint
            else:   # No known mistake's formula: do the messages say more? An AllReduce that
                #     averages; or a right AllReduce of a wrong operand (the local pass).
                what, hint = _relation(ex, key, r, got, want, t), layer.OUTPUTS[key][2]
                what, hint = (_averaging(result, case, key, d)
                              or (None if what else
                                  _right_allreduce_wrong_operand(result, case, layer, key, d))
                              or (what, hint))
            return Failure(
                case.label, f"{_name(key)} equals the unsharded layer's",
                f"{who(case, g)}: {_name(key)} differs from the unsharded ringlab.nn layer's "
                f"{layer.OUTPUTS[key][1]} (relative error {rel_error(got, want):.2g}, "
                f"tolerance {TOL:g})" + (f":\n{what}" if what else ""),
                expected=numbers(want), got=numbers(got), hint=hint)
    return None


def _relation(ex, key, r, got, want, t):
    """How a wrong value ``got`` of no known mistake relates to the right one, or ''."""
    if t > 1 and close(got, t * want):
        return (f"it is t = {t} times the right value: summed over the ranks where it was "
                f"already whole (reduced twice?)")
    if t > 1 and close(got, want / t):
        return (f"it is the right value divided by t = {t}: an AllReduce that averages "
                f"(a mean), where the layer needs the sum?")
    if not np.any(got):
        return "it is all zeros"
    q = next((q for q, o in enumerate(ex.outputs) if q != r and close(got, o[key])), None)
    return "" if q is None else f"it is rank {q}'s block, not this rank's: rank r owns block r"


def _wire(result, case):
    """Every message a float64 array, before the values: an AllReduce in float32 makes
    them wrong by about 1e-7, which no hint about the AllReduce explains."""
    for e in result.trace:
        pay = _payload(result, e)
        if isinstance(pay, np.ndarray) and pay.dtype != np.float64:
            return Failure(case.label, "messages carry float64",
                           f"{who(case, e.src)} sent {who(case, e.dst)} a {pay.dtype} message "
                           f"({pay.size} elements): "
                           # float64 bytes in the other byte order: exact, but not the inputs'
                           + ("float64 in the other byte order, not the inputs' native one"
                              if pay.dtype.kind == "f" and pay.dtype.itemsize == 8 else
                              "it rounds the values on the way"
                              + (f", to about {np.finfo(pay.dtype).eps:.0e} of their size"
                                 if pay.dtype.kind == "f" else "")),
                           expected="float64 messages, like the layer's inputs",
                           got=f"dtype {pay.dtype}", hint="All-reduce the float64 arrays as they "
                           "are: no astype on the way (the grader compares to 1e-10).")
    return None


def _payload(result, e):
    """What message ``e`` carried, when the run recorded payloads; else None."""
    return result.payload(e) if result.payloads is not None else None


def _f64(pay):
    return type(pay) is np.ndarray and pay.dtype == np.float64


def _pass_of(event):
    top = event.span.split("/")[0]
    return next((name for name, span in PASSES.items() if top == span), None)


class _Traffic:
    """Group ``d``'s messages in pass ``name`` (forward or backward) of a run, and
    what that pass may send (its ``Pass``, ``p``)."""

    def __init__(self, result, case, d, name):
        self.result, self.case, self.d, self.name = result, case, d, name
        self.t = case.info["t"]
        self.members = case.info["members"][d]      # global ranks, in group-rank order
        self.p = case.info["groups"][d].passes[name]
        self.events = [e for e in result.trace if e.src in self.members and _pass_of(e) == name]
        self.got_bytes = sum(e.nbytes for e in self.events)

    @functools.cached_property
    def lookup(self):
        return _Lookup(self.p, self.t)

    @property
    def want_bytes(self):
        """What one bandwidth-optimal AllReduce of the pass's operand moves in the group."""
        return 2 * (self.t - 1) * self.p.alternatives[0][0].size * 8

    def fail(self, what, **kw):
        return Failure(self.case.label, f"{self.name} communication", what, **kw)


def _making(result, case, key, d):
    """The traffic of the pass that makes ``key`` (y: forward, dx: backward) in group
    ``d``, or None."""
    name = {"y": "forward", "dx": "backward"}.get(key)
    return _Traffic(result, case, d, name) if name in case.info["groups"][d].passes else None


def _averaging(result, case, key, d):
    """(what, hint) when a message of the pass that makes ``key`` holds partial sums
    of its operand divided by t: the AllReduce averages. Else None."""
    tr = _making(result, case, key, d)
    if tr is None or tr.p.allreduces != 1 or result.payloads is None:
        return None
    for e in tr.events:
        pay = result.payload(e)
        if _f64(pay) and any(x is None for x in tr.lookup.read(pay)):
            mean = _averaged(tr, e, pay)
            if mean is not None:
                return mean, AVERAGE_HINT
    return None


def _right_allreduce_wrong_operand(result, case, layer, key, d):
    """(what, hint) when the pass that makes ``key`` (y: forward, dx: backward) did
    its AllReduce right (every rank of group ``d`` ends with the same value, and
    the pass moved exactly one AllReduce's bytes) but a rank's first message,
    sent before it received anything, is not its own part of the operand: the
    local computation before the AllReduce is wrong, not the AllReduce (whose
    mistakes, a chunk in the wrong slot, show only in later messages). Else None."""
    tr, local = _making(result, case, key, d), getattr(layer, "LOCAL", {}).get(key)
    if tr is None or local is None:
        return None
    if tr.t == 1:
        return (f"with t = 1 nothing is communicated: your {tr.name} itself computes it wrong",
                local)
    i = list(case.info["groups"][d].outputs[0]).index(key)
    values = [result.outputs[g][1 + i] for g in tr.members]
    if (tr.p.allreduces != 1 or tr.got_bytes != tr.want_bytes or result.payloads is None
            or not all(close(v, values[0]) for v in values[1:])):
        return None
    for r, g in enumerate(tr.members):
        # A rank's first message, sent before it received anything in the pass, can hold
        # only its own operand: if it does not, the operand is wrong, not the AllReduce.
        e = min((e for e in tr.events if e.src == g), key=lambda e: e.step, default=None)
        got = [x.step for x in tr.events if x.dst == g]
        if e is None or got and e.step > min(got) or not _f64(pay := result.payload(e)):
            continue
        if any(x is None or x[0] != SUM or x[1] != (r,) for x in tr.lookup.read(pay)):
            return (f"the AllReduce is right (every rank ends with the same {_name(key)}, and "
                    f"your {tr.name} moved exactly one AllReduce's {tr.want_bytes} bytes), but "
                    f"what it sums is not {tr.p.operand}: rank {e.src}'s first message, sent "
                    f"before it received anything, holds values that are not its part of it. "
                    f"The local {tr.name} before the AllReduce is wrong.", local)
    return None


# --------------------------------------------------------------------- messages

AVERAGE_HINT = ("AllReduce with a sum and divide by nothing: tensor parallelism adds the "
                "ranks' parts; a mean (sum / t) is data parallelism's, and multiplying it "
                "back by t only hides it.")
SUM, RAW, RESUM = 0, 1, 2      # what an element of a message is (lower: preferred match)


class _Lookup:
    """Every value a message of one pass may hold, sorted, to read payloads element by element."""

    def __init__(self, p, t):
        vals, self.meta = [np.zeros(0)], []    # meta: (kind, info, element of a SUM or -1)

        def add(arr, kind, what):
            vals.append(np.asarray(arr, dtype=np.float64).ravel())
            self.meta += [(kind, what, i if kind == SUM else -1) for i in range(vals[-1].size)]

        for alt in p.alternatives:
            for mask in range(1, 2 ** t):
                members = tuple(r for r in range(t) if mask >> r & 1)
                add(sum(alt[r] for r in members), SUM, members)
            for k in range(2, t + 1):     # sums of an already reduced value: a second AllReduce
                add(k * sum(alt), RESUM, k)
        for label, (arrays, _, _) in p.raw.items():
            for r, a in enumerate(arrays):
                add(a, RAW, (label, r))
        self.vals = np.concatenate(vals)
        self.order = np.argsort(self.vals, kind="stable")
        self.sorted = self.vals[self.order]
        scale = np.abs(self.vals).max(initial=0.0)
        self.tol = 1e-11 * scale if scale > 0 else 1e-300

    def read(self, payload):
        """For each element: (kind, info, element of the operand) of the best match, or None."""
        v = np.asarray(payload, dtype=np.float64).ravel()
        lo = np.searchsorted(self.sorted, v - self.tol, "left")
        hi = np.searchsorted(self.sorted, v + self.tol, "right")
        # the lowest kind among the matches (SUM before RAW before RESUM), the first of those
        return [None if a >= b else min((self.meta[i] for i in self.order[a:b]), key=lambda m: m[0])
                for a, b in zip(lo, hi)]


def _messages(result, case, layer):
    for e in result.trace:
        if _pass_of(e) is None:
            return Failure(case.label, "messages only in forward and backward",
                           f"rank {e.src} sent rank {e.dst} a message outside the layer's forward "
                           f"and backward (span {e.span!r})",
                           hint="Communicate only inside the function and inside backward.")
    for d, ex in enumerate(case.info["groups"]):
        for name in ex.passes:
            tr = _Traffic(result, case, d, name)
            failure = _group(tr) or _pass(tr, layer)
            if failure:
                return failure
    return None


def _group(tr):
    # By ranks, not by the group's name: a group the learner made of some or all of
    # the tp group's ranks still keeps the layer's messages inside the tp group.
    label = "the world" if tr.case.info["mesh"] is None else f"tp[{tr.d}]"
    for e in tr.events:
        if e.dst not in tr.members:
            return Failure(tr.case.label, "messages stay in the tensor-parallel group",
                           f"{who(tr.case, e.src)} sent {who(tr.case, e.dst)} a message in group "
                           f"{e.group or 'the world'}",
                           expected=f"every message of the layer in comm, the tp group "
                                    f"({label}: ranks {_rank_list(tr.members)})",
                           got=e.describe(),
                           hint="Use only the comm you are given: it is the tensor-parallel group "
                                "(ranks are numbered 0..t-1 in it).")
    return None


def _rank_list(members):
    """"0-2" for contiguous ranks, "0, 2, 4" for strided ones."""
    if members == list(range(members[0], members[-1] + 1)):
        return f"{members[0]}-{members[-1]}"
    return ", ".join(map(str, members))


def _pass(tr, layer):
    """The messages of one pass: none where it needs none; else each one read element
    by element, then their volume, then whether every rank heard every part."""
    if tr.p.allreduces == 0:
        return _silent(tr, layer)
    t = tr.t
    heard = np.zeros((t, t, tr.p.alternatives[0][0].size), dtype=bool)  # [r, q, i]: rank r
    for e in tr.events:                                             # got rank q's part of i
        pay = _payload(tr.result, e)
        if pay is None:
            continue
        read = tr.lookup.read(pay) if _f64(pay) else None
        failure = _wrong_message(tr, e, pay, read)
        if failure:
            return failure
        for _, members, i in read:
            heard[tr.members.index(e.dst), list(members), i] = True
    return _volume(tr) or _heard_all(tr, heard)


def _silent(tr, layer):
    """A pass that needs no communication must send nothing (else: what the first
    message carried, when it is known data)."""
    if not tr.events:
        return None
    e = tr.events[0]
    pay = _payload(tr.result, e)
    read = tr.lookup.read(pay) if _f64(pay) and pay.size else [None]
    carried = (f": {tr.p.raw[read[0][1][0]][1]}"
               if all(x is not None and x[0] == RAW for x in read) else "")
    return tr.fail(f"your {tr.name} sends {len(tr.events)} message(s), {tr.got_bytes} bytes in "
                   f"all; {layer.NO_COMM[tr.name]}", expected="no message in " + tr.name,
                   got=f"first: rank {e.src} -> rank {e.dst}, {e.nbytes // 8} elements{carried}",
                   hint=tr.p.hint)


def _wrong_message(tr, e, pay, read):
    """Message ``e`` (payload ``pay``, its elements ``read``, None if not float64) must
    hold partial sums of the pass's operand, each summed once: else a Failure."""
    p = tr.p
    if read is None:
        return _not_operand(tr, e, pay, f"an array of dtype "
                            f"{getattr(pay, 'dtype', type(pay).__name__)}")
    if any(x is None for x in read):
        mean = _averaged(tr, e, pay)
        if mean is not None:
            return tr.fail(mean, expected=f"one AllReduce that sums "
                           f"{p.operand} (op SUM): partial sums, undivided",
                           got=f"{pay.size} values: {numbers(pay)}", hint=AVERAGE_HINT)
        bad = pay.ravel()[[i for i, x in enumerate(read) if x is None]]
        return _not_operand(tr, e, pay, "zeros" if not np.any(bad)
                            else f"{bad.size} value(s) that are not")
    raw = next((x[1] for x in read if x[0] == RAW), None)
    if raw is not None:
        arrays, words, hint = p.raw[raw[0]]
        return tr.fail(f"your {tr.name} sends {words} (rank {e.src} -> rank {e.dst}, {pay.size} "
                       f"of rank {raw[1]}'s {arrays[raw[1]].size} elements): {hint}",
                       expected=f"one AllReduce of {p.operand}: {tr.want_bytes} bytes in the "
                                f"group, partial sums of it and nothing else",
                       got=f"{tr.got_bytes} bytes, {len(tr.events)} message(s); this one holds "
                           f"{numbers(pay)}", hint=p.hint)
    if any(x[0] == RESUM for x in read):
        return tr.fail(f"your {tr.name} all-reduces {p.operand} twice: rank {e.src}'s message to "
                       f"rank {e.dst} sums values that are already the total over the {tr.t} "
                       f"ranks", expected=f"one AllReduce: {tr.want_bytes} bytes in the group",
                       got=f"{tr.got_bytes} bytes", hint=p.hint)
    return None


def _volume(tr):
    """The pass's messages must add up to one bandwidth-optimal AllReduce's bytes."""
    got, want, op = tr.got_bytes, tr.want_bytes, tr.p.operand
    if got == want:
        return None
    n = tr.p.alternatives[0][0].size
    times = got / want if want else float("inf")
    if got == 0:
        what = f"your {tr.name} has no AllReduce of {op}"
    elif times == int(times):
        what = (f"your {tr.name} moves {int(times)}x the bytes of one AllReduce of {op}: "
                f"{int(times)} AllReduces of it?")
    elif times > 1:
        what = (f"your {tr.name} moves {ratio(got, want)}x the bytes of one bandwidth-optimal "
                f"AllReduce of {op} (every rank sending its whole part to every other rank?)")
    else:
        what = (f"your {tr.name} moves only {ratio(got, want)}x the bytes of one AllReduce of "
                f"{op}: part of it (a ReduceScatter without its AllGather?)")
    return tr.fail(what, expected=f"{want} bytes in the group: one AllReduce of {n} elements on "
                                  f"t = {tr.t} ranks moves 2(t-1) x {n} x 8 bytes (ring_allreduce)",
                   got=f"{got} bytes in {len(tr.events)} message(s)", hint=tr.p.hint)


def _averaged(tr, e, pay):
    """What a report says of message ``e`` (payload ``pay``) when its every element is a
    partial sum of the pass's operand divided by t (an averaging AllReduce's); else None."""
    p, t = tr.p, tr.t
    if t < 2:
        return None
    scaled = Pass(p.allreduces, p.operand, [[a / t for a in alt] for alt in p.alternatives])
    read = _Lookup(scaled, t).read(pay)
    if not read or any(x is None or x[0] != SUM for x in read):
        return None
    widest = max(len(x[1]) for x in read)
    mean = "the sum over all the ranks" if widest == t else f"partial sums over {widest} rank(s)"
    return (f"your {tr.name}'s AllReduce averages: rank {e.src}'s message to rank {e.dst} holds "
            f"{mean}, divided by t = {t}: a mean of {p.operand}, where the layer needs their sum")


def _heard_all(tr, heard):
    """Every rank's messages must bring it every other rank's part of every element: an
    AllReduce's result travels in its messages. Right-looking messages of the right volume
    whose sum reached the ranks some other way (shared Python memory) fail here."""
    for r in range(tr.t):
        heard[r, r] = True
        missing = np.argwhere(~heard[r])
        if missing.size:
            q, i = missing[0]
            return tr.fail(
                f"{who(tr.case, tr.members[r])} returns the sum, but no message it received "
                f"holds rank {q}'s part of element {i} of {tr.p.operand}: the sum did not come "
                f"through the messages",
                expected="every rank receives, in partial sums, every other rank's part of "
                         "every element (what an AllReduce does)",
                got=f"{int((~heard[r]).sum())} (rank, element) parts never received by rank {r}",
                hint=tr.p.hint + " The grader reads every message: data shared some other way "
                                 "does not pass.")
    return None


def _not_operand(tr, e, pay, held):
    op = tr.p.operand
    return tr.fail(f"in your {tr.name}, rank {e.src} sent rank {e.dst} {held}"
                   + ("" if held == "zeros" or held.startswith("an array") else
                      f" {op}, nor a partial sum of it over some of the ranks"),
                   expected=f"pieces of {op}, summed over some of the ranks, as float64 (what "
                            f"every AllReduce algorithm sends)",
                   got=numbers(pay) if isinstance(pay, np.ndarray) else repr(pay)[:100],
                   hint=tr.p.hint + " The grader reads every message: zeros or stand-ins sent "
                                    "for show, with the data shared some other way, do not pass.")


# ------------------------------------------------------- what the four layers describe
# A layer module holds ``SPLIT`` ({output or gradient: (axis, "cols" or "rows")}; absent:
# whole on every rank) and ``mine(dims, t, r)``, rank r's {"cols": ..., "rows": ...}.

# For every layer, ring_allreduce is a tool; ringlab.tensor_parallel (the reference answers) is
# not. Every rank's result needs every rank's data (the causality check: see kit/causality.py).
USES, DEPENDS_ON_ALL = ("collectives",), True
# Every layer is graded on the same groups: t = 1 to 4, and the tp groups of a 2x2 mesh
# (contiguous, as Megatron lays them out) and of a 3x2 one with tp first (strided), where a
# program that takes its tp rank from the global rank (global_rank % t) gets it wrong.
GROUPS = [(2, None), (1, None), (3, None), (4, None), (2, ((2, 2), ("dp", "tp"))),
          (3, ((3, 2), ("tp", "dp"))), (4, None)]


def on_groups(dims):
    """A layer's cases: ``(t, mesh, dims)``, its ``dims`` for each of the GROUPS in turn."""
    return [(*g, d) for g, d in zip(GROUPS, dims)]


def grader(layer):
    """The grader module ``layer``'s ``cases(rng)`` and ``check(program, case, backend)``."""
    def cases(rng):
        return make_cases(rng, layer, layer.CASES)

    def check_layer(program, case, backend="sim"):
        return check(program, case, backend, layer)
    return cases, check_layer


def shard(whole, split, idx):
    """One rank's part of each array of ``whole``, by ``split`` and its indices ``idx``."""
    return {k: v if k not in split else np.take(v, idx[split[k][1]], axis=split[k][0])
            for k, v in whole.items()}


def resharded(whole, split, idx, keys):
    """{key: the t ranks' parts} of ``whole`` were rank r's indices ``idx[r]``: the
    values of a program that split the layer otherwise."""
    parts = [shard(whole, split, i) for i in idx]
    return {k: [p[k] for p in parts] for k in keys}


def answers(layer, rng, w, x, dy, dims, t):
    """The unsharded layer (``layer.MODULE``, made with ``rng``) given the weights ``w``
    (in ``layer.GRADS`` order), forward on ``x`` and backward on ``dy``: its {"y", "dx",
    each gradient}; each rank's indices (``layer.mine``) and its part of that."""
    module = layer.MODULE(dims[2], dims[3], rng)
    for name, v in zip(layer.GRADS, w):
        module.named_parameters()[name][...] = v
    whole = {"y": module.forward(x), "dx": module.backward(dy)}      # forward, then backward
    whole.update((n, module.named_grads()[n]) for n in layer.GRADS)
    idx = [layer.mine(dims, t, r) for r in range(t)]
    return whole, idx, [shard(whole, layer.SPLIT, i) for i in idx]


def g_mistakes(parts, bias, t, bias_name, alone, hint):
    """The usual mistakes of a forward that ends in g: the AllReduce of the partial
    products ``parts``, then the bias, once."""
    return [Mistake({"y": [sum(parts) + t * bias] * t},
                    "the bias was added on every rank before the AllReduce: it counts t times",
                    f"Add {bias_name} after the AllReduce (or on one rank only before it): once."),
            Mistake({"y": [p + bias for p in parts]}, alone, hint)]


# -- the MLP and attention: f -> local work -> g, one AllReduce each way -------------------
# What the two blocks' OUTPUTS say alike: Y and dX whole on every rank, proj's bias whole.
BLOCK_OUTPUTS = {"y": ("(b, s, h): the whole Y on every rank", "whole Y"),
                 "dx": ("(b, s, h): the whole dX", "whole dX"),
                 "proj.bias": ("(h,): the whole db", "whole proj db")}
PROJ_BIAS_HINT = "proj's db = dY summed over batch and sequence, on every rank: no AllReduce."
G_ONCE = "AllReduce it once (Megatron's g), then add proj_bias once."
SWAPPED_HINT = ("f: identity forward, AllReduce of dX backward; g: AllReduce of Y forward, "
                "identity backward.")


def f_hint(through):
    """A block's hint for backward: rank r's dX flows only ``through`` its part."""
    return (f"Backward, rank r's dX is only the part that flows through its {through}: "
            f"AllReduce it once (Megatron's f).")


def block_outputs(g_hint, f_hint, grads):
    """A block's OUTPUTS: Y and dX (hints ``g_hint``, ``f_hint``) and proj's bias whole on
    every rank, and ``grads``: {name: (shape, block, hint)}."""
    return {"y": (*BLOCK_OUTPUTS["y"], g_hint), "dx": (*BLOCK_OUTPUTS["dx"], f_hint), **grads,
            "proj.bias": (*BLOCK_OUTPUTS["proj.bias"], PROJ_BIAS_HINT)}


def block_passes(x, dy, bias, t, forward, backward, g_hint, f_hint):
    """The passes of f -> local work -> g. ``forward``, ``backward``: (the operand's
    words, the t ranks' operands, what else a message could ship: label -> (the t
    ranks' arrays, words, hint))."""
    (f_words, parts, f_raw), (b_words, partial_dx, b_raw) = forward, backward
    return {"forward": Pass(1, f_words, with_bias(parts, bias, t),
                            raw={**f_raw, "X": ([x], "X", "X is the same on every rank: "
                                                          "nothing to send")}, hint=g_hint),
            "backward": Pass(1, b_words, [partial_dx],
                             raw={**b_raw, "dY": ([dy], "dY", "dY is the same on every rank: "
                                                              "nothing to send")}, hint=f_hint)}


def block_mistakes(parts, partial_dx, bias, t, swapped, whose, g_hint, f_hint):
    """The usual mistakes of f -> local work -> g: the bias t times, no AllReduce in
    a pass, f and g swapped (``swapped``: the Y of a forward that all-reduced X)."""
    return g_mistakes(parts, bias, t, "proj_bias", f"your Y is only {whose} contribution: no "
                      f"AllReduce in forward (g)", g_hint) + [
        Mistake({"dx": partial_dx},
                "your dX is only your shard's contribution: no AllReduce in backward (f)", f_hint),
        Mistake({"dx": [t * p for p in partial_dx]},
                "your backward all-reduced dY (which every rank already has: t x dY) and not dX: "
                "f and g swapped?", SWAPPED_HINT),
        Mistake({"y": swapped},
                "your forward all-reduced X, which every rank already has, and not the output: "
                "f and g swapped?", SWAPPED_HINT)]


# -- the two linear-layer graders share their problem: ``Linear(d_in, d_out)`` ------------
def linear_layer(name):
    """What the two linear layers' graders share: GRADS, MODULE, RETURNS and describe."""
    return (("weight", "bias"), Linear, f"{name}(comm, x, weight, bias) -> (y, backward); "
            "backward(dy) -> (dx, {'weight': ..., 'bias': ...})", describe_linear)


def describe_linear(dims):
    b, s, di, do = dims
    return f"x (b={b}, s={s}, d_in={di}), weight ({di}, {do})"


def linear_group(layer, w, rng, dims, t):
    """Random x and dy for ``dims = (b, s, d_in, d_out)``, and ``answers`` of the
    unsharded layer: ``(x, dy, whole, idx, outputs)``."""
    b, s, di, do = dims
    x, dy = rng.standard_normal((b, s, di)), rng.standard_normal((b, s, do))
    return (x, dy, *answers(layer, rng, w, x, dy, dims, t))
