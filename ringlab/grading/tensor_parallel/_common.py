"""What the four tensor-parallel graders share: cases, driver, value and message checks.

A grader module describes its layer (see ``column_parallel_linear.py``):
``spec(rng, dims, t)`` draws the weights, and ``group(weights, rng, dims, t)``
one tensor-parallel group's input and output gradient and returns an
``Expected``: each rank's inputs, the outputs the unsharded ``ringlab.nn``
layer gives for that rank's block, what each pass may communicate (``Pass``)
and the usual mistakes as formulas (``Mistake``). Its tables name what the
reports say of the layer; ``NO_COMM`` (why a pass needs no message) only where a
pass sends none, ``ERROR_HINT`` only where a case requires an error.

The checks, in order, on every case:

1. it runs: no exception, deadlock or unreceived message;
2. forward returns ``(y, backward)`` and backward ``(dx, grads)`` with every
   gradient named, and every array has its shape;
3. every message is float64 (float32 on the wire rounds the values); then
   ``y``, ``dx`` and every gradient equal the unsharded layer's, per rank's
   block, to relative error 1e-10; a wrong value is matched against the
   mistakes' formulas to say which one it is;
4. the messages of each pass (the driver wraps forward and backward in spans
   of its own): they stay in the tensor-parallel group, and each one is read
   element by element (recorded payloads). An element must be a partial sum,
   over some set of the group's ranks, of the pass's AllReduce operand (rank
   r's partial product): that is what any AllReduce algorithm sends. The
   grader also knows the data a program could ship instead (shards of X, of
   dY, of the weights, hidden activations) and names them when a message
   holds them: an AllGather of the inputs gives right values with the wrong
   communication. Finally the volume: one bandwidth-optimal AllReduce of N
   elements on t ranks moves 2(t-1) N elements in the group (a ring, a tree,
   reduce-then-broadcast); twice that is two AllReduces. And every rank must
   have received, in some partial sum, every other rank's part of every
   element: the sum has to travel in the messages, not some other way.

The last case repeats the first with, on rank r, the weights outside block r
replaced by noise: a program that computes the whole layer on every rank and
all-reduces for show only gives wrong values there.
"""

from __future__ import annotations

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
    (t, mesh, dims), mesh None (the world is the tp group) or (dp, t): the tp
    groups of a DeviceMesh, each with its own data (its rank numbers are then
    group-local). Every rank gets its own copies of the arrays."""
    # Last, the first shape again with, on each rank, the weights outside its own block
    # replaced by noise: a program that computes the whole layer on every rank (all the
    # weights are there) and all-reduces only for show gives wrong values there.
    for i, (t, mesh, dims) in enumerate([*shapes, shapes[0]]):
        dp = 1 if mesh is None else mesh[0]
        weights = layer.weights(rng, dims)
        groups = [layer.group(weights, rng, dims, t) for _ in range(dp)]
        inputs = [_copy(groups[d].inputs[r]) for d in range(dp) for r in range(t)]
        where = "the world" if mesh is None else f"the tp groups of a {dp}x{t} DeviceMesh (dp x tp)"
        label = f"t={t} ({where}), {layer.describe(dims)}"
        if i == len(shapes):
            for g, inp in enumerate(inputs):
                for k, (axis, mine) in owned(layer, dims, t, g % t).items():
                    _noise_outside(inp[0][k], axis, mine, rng)
            label += ("; on rank r, the weights outside block r are noise: "
                      "rank r may use only its own block")
        yield Case(dp * t, inputs, label,
                   args=(None if mesh is None else tuple(mesh), tuple(layer.GRADS)),
                   info=dict(t=t, mesh=mesh, groups=groups, dims=dims))


def _noise_outside(a, axis, mine, rng):
    """Overwrite ``a`` (in place) with noise, except the indices ``mine`` along ``axis``."""
    others = np.setdiff1d(np.arange(a.shape[axis]), mine)
    index = [slice(None)] * a.ndim
    index[axis] = others
    a[tuple(index)] = rng.standard_normal(a[tuple(index)].shape)


def _copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


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
    raises it returns [b"raised\\0TYPE\\0MESSAGE" as uint8, an empty array], so
    that the grader learns which ranks raised it, not only the first."""
    from ...mesh import DeviceMesh
    learner = callable_learner(learner)
    tp = comm if mesh is None else DeviceMesh(comm, mesh, ("dp", "tp")).group("tp")
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
        text = "\0".join([RAISED, type(exc).__name__, str(exc)[:300]])
        return [np.frombuffer(text.encode(), dtype=np.uint8).copy(), np.zeros(0)]
    if not (isinstance(back, tuple) and len(back) == 2 and isinstance(back[1], dict)):
        return problem(f"backward(dy) returned {_kind(back)}; it must return a tuple "
                        f"(dx, grads), grads a dict {{name: gradient}}")
    grads = back[1]
    missing = [n for n in grad_names if n not in grads]
    extra = [str(n) for n in grads if n not in grad_names]
    if missing or extra:
        return problem(f"backward's grads has the keys {sorted(map(str, grads))}; they must be "
                        f"{list(grad_names)}, named as in ringlab.nn")
    values = [y, back[0]] + [grads[n] for n in grad_names]
    for name, v in zip(["y", "dx"] + [f"grads[{n!r}]" for n in grad_names], values):
        if not isinstance(v, np.ndarray):
            return problem(f"{name} is {_kind(v)}, not a numpy array")
    return [np.zeros(0)] + values


def _kind(value):
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {type(value).__name__}"


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


def _is_required(exc, kind, words):
    text = str(exc)
    return isinstance(exc, kind) and all(
        re.search(rf"(?<!\d){re.escape(w)}(?!\d)", text) for w in words)


def _raised_of(out):
    """(type name, message) of a rank's output that says it raised the required error."""
    if (isinstance(out, (list, tuple)) and len(out) == 2 and isinstance(out[0], np.ndarray)
            and out[0].dtype == np.uint8 and isinstance(out[1], np.ndarray) and not out[1].size):
        parts = out[0].tobytes().decode(errors="replace").split("\0")
        if len(parts) == 3 and parts[0] == RAISED:
            return parts[1], parts[2]
    return None


def _raised_everywhere(result, failure, case, want, layer):
    """A case whose layer cannot be built: every rank raises the error (each rank is
    its own process, and one rank's exception does not stop the others). Which
    ranks raised it: their outputs, or in a failed run the span each opened."""
    kind, words, why = want
    n = case.world_size
    check = f"raises {kind.__name__} when {why}"
    expected = f"{kind.__name__} on every rank, its message naming {' and '.join(words)}"
    hint = (f"{layer.ERROR_HINT} Every rank must raise it, before any communication: one "
            f"rank's exception does not stop the others.")
    if failure is None:
        said = [_raised_of(out) for out in result.outputs]
        raised = [g for g, x in enumerate(said) if x is not None]
        if len(raised) == n:
            return None
        if not raised:
            return Failure(case.label, check, f"the program ran without raising {kind.__name__}",
                           expected=expected, got="no error", hint=layer.ERROR_HINT)
        others = [g for g in range(n) if g not in raised]
        return Failure(case.label, check,
                       f"{_ranks(raised)} raised {kind.__name__} "
                       f"({said[raised[0]][1]!r}), {_ranks(others)} did not: every "
                       f"rank must raise it", expected=expected,
                       got=f"{_ranks(others)} returned without an error", hint=hint)
    err = failure.error
    trace = getattr(err, "trace", None)
    raised = sorted({s.rank for s in getattr(trace, "spans", ()) if s.path == RAISED_SPAN})
    done = f"{_ranks(raised)} raised {kind.__name__} as required; " if raised else ""
    if isinstance(err, DeadlockError):       # the ranks that raised left; the others wait
        waiting = sorted(err.waiting)
        return Failure(case.label, check,
                       f"{done}{_ranks(waiting)} did not: every rank must raise it, but "
                       f"{_ranks(waiting)} went on past the check and wait for ranks that left:\n"
                       + "\n".join(f"  rank {r}: {w}" for r, w in sorted(err.waiting.items())),
                       expected=expected, got=f"{_ranks(waiting)} raised nothing",
                       hint=hint, error=err)
    if isinstance(err, RankError):
        failure.got = without_grader_frames(failure.got)
        name = type(err.exc).__name__
        if raised:
            what = (f"{done}rank {err.rank} did not: every rank must raise it, but rank "
                    f"{err.rank} went on past the check and failed there with {name}: "
                    f"{str(err.exc)[:200]}")
        elif isinstance(err.exc, kind):
            what = (f"rank {err.rank} raised {name} ({str(err.exc)[:200]!r}), whose message "
                    f"does not name {' and '.join(words)}")
        else:
            what = f"rank {err.rank} raised {name}, not {kind.__name__}: {str(err.exc)[:200]}"
        return Failure(case.label, check, what, expected=expected, got=failure.got,
                       hint=hint, error=err)
    return failure


def who(case, g):
    t, mesh = case.info["t"], case.info["mesh"]
    if mesh is None:
        return f"rank {g}"
    return f"rank {g} (rank {g % t} of its tp group, tp[{g // t}])"


def _returned(result, case, layer):
    t = case.info["t"]
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
        want = case.info["groups"][g // t].outputs[g % t]
        for (key, w), v in zip(want.items(), out[1:]):
            name = _name(key)
            failure = plain_array(case, f"{who(case, g)}'s {name}", v,
                                  f"an array of shape {w.shape}")
            if failure:
                return failure
            if v.shape != w.shape:
                return Failure(case.label, "every output has its shape",
                               f"{who(case, g)}: {name} has shape {v.shape}",
                               expected=f"shape {w.shape}: {layer.SHAPES[key]}",
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
    keys = list(case.info["groups"][0].outputs[0])
    for i, key in enumerate(keys):
        for g, out in enumerate(result.outputs):
            d, r = divmod(g, t)
            ex = case.info["groups"][d]
            got, want = out[1 + i], ex.outputs[r][key]
            if close(got, want):
                continue
            what, hint = _diagnose(ex, key, r, got, want, t, layer)
            if not any(key in m.outputs and close(got, m.outputs[key][r]) for m in ex.mistakes):
                # No known mistake's formula: do the messages say more? An AllReduce that
                # averages; or a right AllReduce of a wrong operand (the local pass).
                what, hint = (_averaging(result, case, key, d)
                              or (None if what else
                                  _right_allreduce_wrong_operand(result, case, layer, key, d))
                              or (what, hint))
            return Failure(
                case.label, f"{_name(key)} equals the unsharded layer's",
                f"{who(case, g)}: {_name(key)} differs from the unsharded ringlab.nn layer's "
                f"{layer.BLOCKS[key]} (relative error {rel_error(got, want):.2g}, "
                f"tolerance {TOL:g})"
                + (f":\n{what}" if what else ""),
                expected=numbers(want), got=numbers(got), hint=hint)
    return None


def _diagnose(ex, key, r, got, want, t, layer):
    """(what, hint): the mistake whose formula gives exactly ``got``, else a relation."""
    for m in ex.mistakes:
        if key in m.outputs and close(got, m.outputs[key][r]):
            return m.what, m.hint
    if t > 1 and close(got, t * want):
        return (f"it is t = {t} times the right value: summed over the ranks where it was "
                f"already whole (reduced twice?)", layer.HINTS.get(key))
    if t > 1 and close(got, want / t):
        return (f"it is the right value divided by t = {t}: an AllReduce that averages "
                f"(a mean), where the layer needs the sum?", layer.HINTS.get(key))
    if not np.any(got):
        return "it is all zeros", layer.HINTS.get(key)
    for q, other in enumerate(ex.outputs):
        if q != r and close(got, other[key]):
            return (f"it is rank {q}'s block, not this rank's: rank r owns block r",
                    layer.HINTS.get(key))
    return "", layer.HINTS.get(key)


def _wire(result, case):
    """Every message a float64 array, before the values: an AllReduce in float32 makes
    them wrong by about 1e-7, which no hint about the AllReduce explains."""
    for e in result.trace:
        pay = _payload(result, e)
        if isinstance(pay, np.ndarray) and pay.dtype != np.float64:
            return Failure(case.label, "messages carry float64",
                           f"{who(case, e.src)} sent {who(case, e.dst)} a {pay.dtype} message "
                           f"({pay.size} elements): it rounds the values on the way"
                           + (f", to about {np.finfo(pay.dtype).eps:.0e} of their size"
                              if pay.dtype.kind == "f" else ""),
                           expected="float64 messages, like the layer's inputs",
                           got=f"dtype {pay.dtype}", hint="All-reduce the float64 arrays as they "
                           "are: no astype on the way (the grader compares to 1e-10).")
    return None


def _payload(result, e):
    """What message ``e`` carried, when the run recorded payloads; else None."""
    return result.payload(e) if result.payloads is not None else None


def _f64(pay):
    return type(pay) is np.ndarray and pay.dtype == np.float64


def _events(result, case, d, pname):
    """Group ``d``'s messages in pass ``pname``."""
    t = case.info["t"]
    members = range(d * t, (d + 1) * t)
    return [e for e in result.trace if e.src in members and _pass_of(e) == pname]


def _allreduce_bytes(p, t):
    """What one bandwidth-optimal AllReduce of the pass's operand moves in the group."""
    return 2 * (t - 1) * p.alternatives[0][0].size * 8


def _pass_events(result, case, key, d):
    """The pass that makes ``key`` (y: forward, dx: backward), its name and group
    ``d``'s messages in it: (name, Pass, events), or None."""
    pname = {"y": "forward", "dx": "backward"}.get(key)
    p = case.info["groups"][d].passes.get(pname)
    if p is None:
        return None
    return pname, p, _events(result, case, d, pname)


def _averages(pname, e, mean, t, p):
    return (f"your {pname}'s AllReduce averages: rank {e.src}'s message to rank {e.dst} holds "
            f"{mean}, divided by t = {t}: a mean of {p.operand}, where the layer needs their sum")


def _averaging(result, case, key, d):
    """(what, hint) when a message of the pass that makes ``key`` holds partial sums
    of its operand divided by t: the AllReduce averages. Else None."""
    found, t = _pass_events(result, case, key, d), case.info["t"]
    if found is None or found[1].allreduces != 1 or result.payloads is None:
        return None
    pname, p, events = found
    lookup = _Lookup(p, t)
    for e in events:
        pay = result.payload(e)
        if not _f64(pay):
            continue
        mean = None if all(x is not None for x in lookup.read(pay)) else _averaged(p, t, pay)
        if mean is not None:
            return _averages(pname, e, mean, t, p), AVERAGE_HINT
    return None


def _right_allreduce_wrong_operand(result, case, layer, key, d):
    """(what, hint) when the pass that makes ``key`` (y: forward, dx: backward) did
    its AllReduce right (every rank of group ``d`` ends with the same value, and
    the pass moved exactly one AllReduce's bytes) but a rank's first message,
    sent before it received anything, is not its own part of the operand: the
    local computation before the AllReduce is wrong, not the AllReduce (whose
    mistakes, a chunk in the wrong slot, show only in later messages). Else None."""
    found, t = _pass_events(result, case, key, d), case.info["t"]
    local = getattr(layer, "LOCAL", {}).get(key)
    if found is None or local is None:
        return None
    pname, p, events = found
    if t == 1:
        return (f"with t = 1 nothing is communicated: your {pname} itself computes it wrong",
                local)
    if p.allreduces != 1:
        return None
    members = range(d * t, (d + 1) * t)
    i = list(case.info["groups"][d].outputs[0]).index(key)
    values = [result.outputs[g][1 + i] for g in members]
    want_bytes = _allreduce_bytes(p, t)
    if (sum(e.nbytes for e in events) != want_bytes or result.payloads is None
            or not all(close(v, values[0]) for v in values[1:])):
        return None
    lookup = _Lookup(p, t)
    for r, g in enumerate(members):
        # A rank's first message, sent before it received anything in the pass, can hold
        # only its own operand: if it does not, the operand is wrong, not the AllReduce.
        sent = [e for e in events if e.src == g]
        got = [e.step for e in events if e.dst == g]
        if not sent:
            continue
        e = min(sent, key=lambda e: e.step)
        pay = result.payload(e)
        if got and e.step > min(got) or not _f64(pay):
            continue
        if any(x is None or x[0] != SUM or x[1] != (r,) for x in lookup.read(pay)):
            return (f"the AllReduce is right (every rank ends with the same {_name(key)}, and "
                    f"your {pname} moved exactly one AllReduce's {want_bytes} bytes), but what "
                    f"it sums is not {p.operand}: rank {e.src}'s first message, sent before "
                    f"it received anything, holds values that are not its part of it. The "
                    f"local {pname} before the AllReduce is wrong.", local)
    return None


# --------------------------------------------------------------------- messages

AVERAGE_HINT = ("AllReduce with a sum and divide by nothing: tensor parallelism adds the "
                "ranks' parts; a mean (sum / t) is data parallelism's, and multiplying it "
                "back by t only hides it.")
SUM, RAW, RESUM = 0, 1, 2      # what an element of a message is (lower: preferred match)


class _Lookup:
    """Every value a message of one pass may hold, sorted, to read payloads element by element."""

    def __init__(self, p, t):
        vals, kinds, info, where = [], [], [], []

        def add(arr, kind, what):
            a = np.asarray(arr, dtype=np.float64).ravel()
            vals.append(a)
            kinds.append(np.full(a.size, kind))
            info.extend([what] * a.size)
            where.append(np.arange(a.size) if kind == SUM else np.full(a.size, -1))

        for alt in p.alternatives:
            for mask in range(1, 2 ** t):
                members = tuple(r for r in range(t) if mask >> r & 1)
                add(sum(alt[r] for r in members), SUM, members)
            total = sum(alt)
            for k in range(2, t + 1):     # sums of an already reduced value: a second AllReduce
                add(k * total, RESUM, k)
        for label, (arrays, _, _) in p.raw.items():
            for r, a in enumerate(arrays):
                add(a, RAW, (label, r))
        self.vals = np.concatenate(vals) if vals else np.zeros(0)
        self.kinds = np.concatenate(kinds) if kinds else np.zeros(0, int)
        self.info = info
        self.where = np.concatenate(where) if where else np.zeros(0, int)   # element of a SUM
        self.order = np.argsort(self.vals, kind="stable")
        self.sorted = self.vals[self.order]
        scale = np.abs(self.vals).max(initial=0.0)
        self.tol = 1e-11 * scale if scale > 0 else 1e-300

    def read(self, payload):
        """For each element: (kind, info, element of the operand) of the best match, or None."""
        v = np.asarray(payload, dtype=np.float64).ravel()
        lo = np.searchsorted(self.sorted, v - self.tol, "left")
        hi = np.searchsorted(self.sorted, v + self.tol, "right")
        out = []
        for a, b in zip(lo, hi):
            if a >= b:
                out.append(None)
                continue
            idx = self.order[a:b]
            best = idx[np.argmin(self.kinds[idx])]
            out.append((int(self.kinds[best]), self.info[best], int(self.where[best])))
        return out


def _pass_of(event):
    top = event.span.split("/")[0]
    return next((name for name, span in PASSES.items() if top == span), None)


def _messages(result, case, layer):
    t, mesh = case.info["t"], case.info["mesh"]
    for e in result.trace:
        if _pass_of(e) is None:
            return Failure(case.label, "messages only in forward and backward",
                           f"rank {e.src} sent rank {e.dst} a message outside the layer's forward "
                           f"and backward (span {e.span!r})",
                           hint="Communicate only inside the function and inside backward.")
    for d, ex in enumerate(case.info["groups"]):
        members = range(d * t, (d + 1) * t)
        label = None if mesh is None else f"tp[{d}]"
        for pname, p in ex.passes.items():
            events = _events(result, case, d, pname)
            failure = (_group(events, case, label, members) or
                       _pass(result, case, events, pname, p, t, layer, members[0]))
            if failure:
                return failure
    return None


def _comm_failure(case, pname, what, **kw):
    return Failure(case.label, f"{pname} communication", what, **kw)


def _group(events, case, label, members):
    # By ranks, not by the group's name: a group the learner made of some or all of
    # the tp group's ranks still keeps the layer's messages inside the tp group.
    for e in events:
        if e.dst not in members:
            return Failure(case.label, "messages stay in the tensor-parallel group",
                           f"{who(case, e.src)} sent {who(case, e.dst)} a message in group "
                           f"{e.group or 'the world'}",
                           expected=f"every message of the layer in comm, the tp group "
                                    f"({label or 'the world'}: ranks {members[0]}-{members[-1]})",
                           got=e.describe(),
                           hint="Use only the comm you are given: it is the tensor-parallel group "
                                "(ranks are numbered 0..t-1 in it).")
    return None


def _pass(result, case, events, pname, p, t, layer, first):
    """The messages of one pass: none where it needs none; else each one read element
    by element, then their volume, then whether every rank heard every part."""
    if p.allreduces == 0:
        return _silent(result, case, events, pname, p, t, layer)
    lookup = _Lookup(p, t)
    heard = np.zeros((t, t, p.alternatives[0][0].size), dtype=bool)  # [r, q, i]: rank r got
    for e in events:                                                  # rank q's part of element i
        pay = _payload(result, e)
        if pay is None:
            continue
        read = lookup.read(pay) if _f64(pay) else None
        failure = _wrong_message(case, events, pname, p, t, e, pay, read)
        if failure:
            return failure
        for _, members, i in read:
            heard[e.dst - first, list(members), i] = True
    return _volume(case, events, pname, p, t) or _heard_all(case, pname, p, t, heard, first)


def _silent(result, case, events, pname, p, t, layer):
    """A pass that needs no communication must send nothing."""
    if not events:
        return None
    e = events[0]
    carried = _describe(result, e, p, t)
    return _comm_failure(case, pname,
                         f"your {pname} sends {len(events)} message(s), "
                         f"{sum(e.nbytes for e in events)} bytes in all; {layer.NO_COMM[pname]}",
                         expected="no message in " + pname,
                         got=f"first: rank {e.src} -> rank {e.dst}, {e.nbytes // 8} elements"
                             + (f": {carried}" if carried else ""),
                         hint=p.hint)


def _wrong_message(case, events, pname, p, t, e, pay, read):
    """Message ``e`` (payload ``pay``, its elements ``read``, None if not float64) must
    hold partial sums of the pass's operand, each summed once: else a Failure."""
    if read is None:
        return _not_operand(case, pname, p, e, pay, f"an array of dtype "
                            f"{getattr(pay, 'dtype', type(pay).__name__)}")
    if any(x is None for x in read):
        mean = _averaged(p, t, pay)
        if mean is not None:
            return _comm_failure(case, pname, _averages(pname, e, mean, t, p),
                                 expected=f"one AllReduce that sums {p.operand} (op SUM): "
                                          f"partial sums, undivided",
                                 got=f"{pay.size} values: {numbers(pay)}", hint=AVERAGE_HINT)
        bad = pay.ravel()[[i for i, x in enumerate(read) if x is None]]
        held = "zeros" if not np.any(bad) else f"{bad.size} value(s) that are not"
        return _not_operand(case, pname, p, e, pay, held)
    got_bytes, want_bytes = sum(e.nbytes for e in events), _allreduce_bytes(p, t)
    raw = next((x[1] for x in read if x[0] == RAW), None)
    if raw is not None:
        arrays, words, hint = p.raw[raw[0]]
        return _comm_failure(case, pname,
                             f"your {pname} sends {words} (rank {e.src} -> rank {e.dst}, "
                             f"{pay.size} of rank {raw[1]}'s {arrays[raw[1]].size} elements): "
                             f"{hint}",
                             expected=f"one AllReduce of {p.operand}: {want_bytes} bytes in the "
                                      f"group, partial sums of it and nothing else",
                             got=f"{got_bytes} bytes, {len(events)} message(s); this one holds "
                                 f"{numbers(pay)}",
                             hint=p.hint)
    if any(x[0] == RESUM for x in read):
        return _comm_failure(case, pname,
                             f"your {pname} all-reduces {p.operand} twice: rank {e.src}'s "
                             f"message to rank {e.dst} sums values that are already the total "
                             f"over the {t} ranks",
                             expected=f"one AllReduce: {want_bytes} bytes in the group",
                             got=f"{got_bytes} bytes", hint=p.hint)
    return None


def _volume(case, events, pname, p, t):
    """The pass's messages must add up to one bandwidth-optimal AllReduce's bytes."""
    got_bytes, want_bytes = sum(e.nbytes for e in events), _allreduce_bytes(p, t)
    if got_bytes == want_bytes:
        return None
    n = p.alternatives[0][0].size
    times = got_bytes / want_bytes if want_bytes else float("inf")
    if got_bytes == 0:
        what = f"your {pname} has no AllReduce of {p.operand}"
    elif times == int(times):
        what = (f"your {pname} moves {int(times)}x the bytes of one AllReduce of "
                f"{p.operand}: {int(times)} AllReduces of it?")
    elif times > 1:
        what = (f"your {pname} moves {ratio(got_bytes, want_bytes)}x the bytes of one "
                f"bandwidth-optimal AllReduce of {p.operand} (every rank sending its "
                f"whole part to every other rank?)")
    else:
        what = (f"your {pname} moves only {ratio(got_bytes, want_bytes)}x the bytes of "
                f"one AllReduce of {p.operand}: part of it (a ReduceScatter without its "
                f"AllGather?)")
    return _comm_failure(case, pname, what,
                         expected=f"{want_bytes} bytes in the group: one AllReduce of {n} "
                                  f"elements on t = {t} ranks moves 2(t-1) x {n} x 8 bytes "
                                  f"(ring_allreduce)",
                         got=f"{got_bytes} bytes in {len(events)} message(s)", hint=p.hint)


def _averaged(p, t, pay):
    """Words for a message whose every element is a partial sum of the pass's operand
    divided by t (an averaging AllReduce's), or None."""
    if t < 2:
        return None
    scaled = Pass(p.allreduces, p.operand, [[a / t for a in alt] for alt in p.alternatives])
    read = _Lookup(scaled, t).read(pay)
    if not read or any(x is None or x[0] != SUM for x in read):
        return None
    widest = max(len(x[1]) for x in read)
    return ("the sum over all the ranks" if widest == t
            else f"partial sums over {widest} rank(s)")


def _heard_all(case, pname, p, t, heard, first):
    """Every rank's messages must bring it every other rank's part of every element: an
    AllReduce's result travels in its messages. Right-looking messages of the right volume
    whose sum reached the ranks some other way (shared Python memory) fail here."""
    for r in range(t):
        heard[r, r] = True
        missing = np.argwhere(~heard[r])
        if missing.size:
            q, i = missing[0]
            return _comm_failure(
                case, pname, f"{who(case, first + r)} returns the sum, but no message it "
                             f"received holds rank {q}'s part of element {i} of {p.operand}: "
                             f"the sum did not come through the messages",
                expected="every rank receives, in partial sums, every other rank's part of "
                         "every element (what an AllReduce does)",
                got=f"{int((~heard[r]).sum())} (rank, element) parts never received by rank {r}",
                hint=p.hint + " The grader reads every message: data shared some other way "
                              "does not pass.")
    return None


def _describe(result, e, p, t):
    """Words for what a message holds, when it holds known data; else ''."""
    pay = _payload(result, e)
    if not (_f64(pay) and pay.size):
        return ""
    read = _Lookup(p, t).read(pay)
    if all(x is not None and x[0] == RAW for x in read):
        return p.raw[read[0][1][0]][1]
    return ""


def _not_operand(case, pname, p, e, pay, held):
    return _comm_failure(case, pname,
                         f"in your {pname}, rank {e.src} sent rank {e.dst} {held}"
                         + ("" if held == "zeros" or held.startswith("an array") else
                            f" {p.operand}, nor a partial sum of it over some of the ranks"),
                         expected=f"pieces of {p.operand}, summed over some of the ranks, as "
                                  f"float64 (what every AllReduce algorithm sends)",
                         got=numbers(pay) if isinstance(pay, np.ndarray) else repr(pay)[:100],
                         hint=p.hint + " The grader reads every message: zeros or stand-ins "
                                       "sent for show, with the data shared some other way, do "
                                       "not pass.")


# ------------------------------------------------------- what the four layers describe
# A layer module holds ``SPLIT`` ({output or gradient: (axis, "cols" or "rows")}; absent:
# whole on every rank) and ``mine(dims, t, r)``, rank r's {"cols": ..., "rows": ...}.

# For every layer, ring_allreduce is a tool; ringlab.tensor_parallel (the reference answers) is
# not. Every rank's result needs every rank's data (the causality check: see kit/causality.py).
USES, DEPENDS_ON_ALL = ("collectives",), True
# Every layer is graded on the same groups: t = 1 to 4, and the tp groups of 2x2 and 2x3 meshes.
GROUPS = [(2, None), (1, None), (3, None), (4, None), (2, (2, 2)), (3, (2, 3)), (4, None)]


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


def owned(layer, dims, t, r):
    """Rank r's part of each weight argument: {argument: (axis, indices)}."""
    idx = layer.mine(dims, t, r)
    return {1 + i: (layer.SPLIT[n][0], idx[layer.SPLIT[n][1]])
            for i, n in enumerate(layer.GRADS) if n in layer.SPLIT}


def shard(whole, split, idx):
    """One rank's part of each array of ``whole``, by ``split`` and its indices ``idx``."""
    return {k: v if k not in split else np.take(v, idx[split[k][1]], axis=split[k][0])
            for k, v in whole.items()}


def by_key(shards, keys):
    """{key: the t ranks' values} of the t ranks' dicts."""
    return {k: [s[k] for s in shards] for k in keys}


def params(module, names):
    """``module``'s parameters ``names``, in that order."""
    return tuple(module.named_parameters()[n] for n in names)


def unsharded(module, names, w, x, dy):
    """``module`` given the weights ``w`` (in ``names`` order), forward on ``x`` and
    backward on ``dy``: {"y", "dx", each gradient}, the answers of the whole layer."""
    for name, v in zip(names, w):
        module.named_parameters()[name][...] = v
    y = module.forward(x)
    dx = module.backward(dy)
    grads = module.named_grads()
    return {"y": y, "dx": dx, **{n: grads[n] for n in names}}


def g_mistakes(parts, bias, t, bias_name, alone, hint):
    """The usual mistakes of a forward that ends in g: the AllReduce of the partial
    products ``parts``, then the bias, once."""
    return [Mistake({"y": [sum(parts) + t * bias] * t},
                    "the bias was added on every rank before the AllReduce: it counts t times",
                    f"Add {bias_name} after the AllReduce (or on one rank only before it): once."),
            Mistake({"y": [p + bias for p in parts]}, alone, hint)]


# -- the MLP and attention: f -> local work -> g, one AllReduce each way -------------------
# What the two blocks' tables say alike: Y and dX whole on every rank, proj's bias whole.
BLOCK_SHAPES = {"y": "(b, s, h): the whole Y on every rank", "dx": "(b, s, h): the whole dX",
                "proj.bias": "(h,): the whole db"}
BLOCK_BLOCKS = {"y": "whole Y", "dx": "whole dX", "proj.bias": "whole proj db"}
PROJ_BIAS_HINT = "proj's db = dY summed over batch and sequence, on every rank: no AllReduce."
G_ONCE = "AllReduce it once (Megatron's g), then add proj_bias once."


def f_hint(through):
    """A block's hint for backward: rank r's dX flows only ``through`` its part."""
    return (f"Backward, rank r's dX is only the part that flows through its {through}: "
            f"AllReduce it once (Megatron's f).")
SWAPPED_HINT = ("f: identity forward, AllReduce of dX backward; g: AllReduce of Y forward, "
                "identity backward.")


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
def describe_linear(dims):
    b, s, di, do = dims
    return f"x (b={b}, s={s}, d_in={di}), weight ({di}, {do})"


def linear_weights(rng, dims):
    return params(Linear(dims[2], dims[3], rng), ("weight", "bias"))


def run_linear(w, rng, dims):
    """Random x and dy for ``dims = (b, s, d_in, d_out)``, and the unsharded
    layer's answers: ``(x, dy, {"y", "dx", "weight", "bias"})``."""
    b, s, di, do = dims
    x, dy = rng.standard_normal((b, s, di)), rng.standard_normal((b, s, do))
    return x, dy, unsharded(Linear(di, do, rng), ("weight", "bias"), w, x, dy)
