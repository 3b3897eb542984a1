"""Trace checks shared by the graders.

Each takes the trace of a run and the ``Case``, and returns ``None`` when the
trace passes or a ``Failure`` naming the check, the step and ranks where it
broke, what was expected, what happened and what to try. The wording is the
graders' (the book shows it), so callers pass the parts that depend on the
exercise: the algorithm's name, the expected step count, the hint.
"""

import contextlib
import contextvars
import gc
import operator
import sys
import traceback
import types

import numpy as np

from .report import Failure, numbers
from ...errors import CommError, RankError


def first_wait(computes):
    """The first two of a rank's backward ``computes`` (in order) where the second
    starts later than the first ended, as ``(before, after)``; None when each
    starts as the one before it ends. A wait inside the backward loop (for an
    AllReduce, say) leaves such a gap: "backward never waits for the network"."""
    return next(((before, after) for before, after in zip(computes, computes[1:])
                 if after.start > before.end + 1e-12), None)


def ring_neighbours(trace, case, algorithm, hub_text, hint=None):
    """Every message goes to (rank + 1) % N or (rank - 1) % N (any message is
    fine when N <= 2). ``hub_text`` names the central scheme, shown when one rank
    is an end of every message: "a central reduction through one rank (...)"."""
    n = case.world_size
    for e in trace:
        if n > 2 and e.dst not in ((e.src + 1) % n, (e.src - 1) % n):
            # A hub that is an end of every message: a central (parameter-server) scheme.
            centre = hub(trace, n)
            if centre is not None:
                hint = f"Every message goes to or from rank {centre}: that is {hub_text}, not a {algorithm}."
            return Failure(
                case.label, "messages go only between ring neighbours",
                f"at step {e.step} rank {e.src} sent to rank {e.dst}, which is not its neighbour "
                f"(the neighbours of rank {e.src} are ranks {(e.src - 1) % n} and {(e.src + 1) % n})",
                expected="every message to (rank + 1) % N or (rank - 1) % N",
                got=f"rank {e.src} -> rank {e.dst}",
                hint=hint or "In a ring each rank only talks to the rank on its left and on its right.")
    return None


def off_ring(trace, case, algorithm, hub_text, rank):
    """A wrong result of a program whose messages also leave the ring: the
    messages are the cause, so their failure comes first (None if none leaves)."""
    failure = ring_neighbours(trace, case, algorithm, hub_text)
    if failure is not None:
        failure.what += f"\nSo rank {rank}'s result is wrong too."
    return failure


def hub(trace, n):
    """The lowest rank that is an end (sender or receiver) of every message, or
    None. A program with such a rank routes everything through it."""
    return next((r for r in range(n) if all(r in (e.src, e.dst) for e in trace)), None)


def message_bytes(trace, case, limit, *, check, expected, hint, whole=None):
    """No message is bigger than ``limit`` bytes; a message of at least ``whole``
    bytes is called "the whole vector". Elements are float64, 8 bytes each."""
    for e in trace:
        if e.nbytes > limit:
            return Failure(
                case.label, check,
                f"at step {e.step} rank {e.src} sent rank {e.dst} {e.nbytes} bytes"
                + (" (the whole vector)" if whole is not None and e.nbytes >= whole else ""),
                expected=expected, got=f"{e.nbytes // 8} elements", hint=hint)
    return None


def one_chunk_per_message(trace, case, length):
    """No message is bigger than one chunk of np.array_split(x, N) for a float64
    vector of ``length`` elements: the check of ring AllReduce and ReduceScatter."""
    n = case.world_size
    max_chunk = -(-length // n) * 8
    return message_bytes(
        trace, case, max_chunk, check="one chunk per message", whole=length * 8,
        expected=f"at most one chunk: ceil({length}/{n}) = {max_chunk // 8} elements, {max_chunk} bytes",
        hint="Split the vector into world_size chunks (np.array_split) and send one chunk "
             "per step; sending whole vectors costs N times the bandwidth.")


def steps(count):
    """"1 step", "3 steps": a step count for a report."""
    return f"{count} step{'' if count == 1 else 's'}"


def exact_steps(trace, case, want, *, check, expected, hint):
    """The trace takes exactly ``want`` steps. ``hint`` is not shown for a trace
    without messages (nothing to loop over)."""
    if trace.steps != want:
        sent = [sum(e.src == r for e in trace) for r in range(case.world_size)]
        if trace.steps > want and sent == [want] * case.world_size:
            # The loop count is right; the steps are not: sends wait for receives.
            hint = (f"Your loop is right ({want} messages from every rank), but in some steps a "
                    f"rank receives before it sends (ranks taking turns, a recv before the "
                    f"send), so each round takes two steps. In a ring step every rank sends "
                    f"and receives at once: comm.sendrecv, or isend, then recv, then wait.")
        return Failure(case.label, check, f"the program took {steps(trace.steps)}",
                       expected=expected, got=steps(trace.steps),
                       hint=hint if trace.steps != 0 else None)
    return None


def steps_before_failure(failure, want, takes, hint):
    """Say that a run which raised was short of steps: "Also: the program took 2
    steps before failing; a ring AllGather takes N-1 = 3." Only when the error
    came after the rank's communication (it had reached the last step of the run
    and received every message sent to it), since then the loop count is the
    likely cause. ``takes`` says what the algorithm takes ("a ring AllGather takes
    N-1 = 3"); ``hint`` goes before the failure's own. Returns ``failure``."""
    err = failure.error
    trace = getattr(err, "trace", None)
    if (isinstance(err, RankError) and not isinstance(err.exc, CommError) and trace is not None
            and 0 < trace.steps < want and err.step == trace.steps
            and not any(e.dst == err.rank for e in trace.unreceived)):
        failure.what += f"\nAlso: the program took {steps(trace.steps)} before failing; {takes}."
        failure.hint = f"{hint} {failure.hint}" if failure.hint else hint
    return failure


def one_send_one_recv_per_step(trace, case, steps, hint=("In every step all ranks pass one chunk to the "
                                                         "same side at once; no rank may sit out or send twice.")):
    """In each of steps 1..``steps`` every rank sends exactly one message and receives exactly one."""
    n = case.world_size
    for step in range(1, steps + 1):
        evs = trace.at_step(step)
        senders = [e.src for e in evs]
        receivers = [e.dst for e in evs]
        for r in range(n):
            s, g = senders.count(r), receivers.count(r)
            if s != 1 or g != 1:
                return Failure(case.label, "every rank sends one and receives one message per step",
                               f"at step {step} rank {r} sent {s} and received {g} message(s)",
                               expected="1 sent and 1 received, at every step, on every rank",
                               got=f"step {step}: " + ", ".join(f"{e.src}->{e.dst}" for e in evs),
                               hint=hint)
    return None


def ratio(got, want):
    """got / want for a report, with as many digits as it takes not to read as a whole
    number when it is not one: "1.03", "1.0004", never "1" for 1.02.

    >>> ratio(5040, 4896), ratio(9792, 4896)
    ('1.03', '2')
    """
    r = got / max(want, 1)
    for digits in range(2, 8):
        text = f"{r:.{digits}g}"
        if got == want or float(text) != round(r):
            return text
    return f"{r:.8g}"


def total_bytes(trace, case, want, *, expected, hint):
    """The trace moves exactly ``want`` bytes in total."""
    if trace.total_bytes != want:
        return Failure(case.label, "bandwidth-optimal bytes",
                       f"the program moved {trace.total_bytes} bytes in total",
                       expected=expected, got=f"{trace.total_bytes} bytes", hint=hint)
    return None


# -- what messages carry ------------------------------------------------------------

def narrow_floats(result, case, *, check, carried, hint, events=None, who="rank {}".format):
    """The first message (of ``events``, else the whole trace, in step order) that
    carries floats narrower than float64, as a Failure; None if there is none.
    float32 on the way rounds ``carried`` ("the gradients") to about 1e-7 of their
    size: a result wrong by that much, which no mistake in the formula explains, so
    graders check this before the values. ``who(rank)`` names a rank ("the server");
    ``carried`` may be a function of the message (called only for the one reported).

        >>> from ringlab import run
        >>> from ringlab.grading.kit.report import Case
        >>> res = run(lambda comm, x: comm.sendrecv(x.astype(np.float32), 1 - comm.rank,
        ...                                          1 - comm.rank), [np.ones(3)] * 2,
        ...           record_payloads=True)
        >>> narrow_floats(res, Case(2, [], "2 ranks"), check="messages carry float64",
        ...               carried="the gradients", hint="No astype on the way.").what
        'at step 1 rank 0 sent the gradients to rank 1 as float32: float32 rounds the values...'
    """
    for e in (sorted(result.trace, key=lambda e: (e.step, e.seq)) if events is None
              else events):
        p = result.payload(e)
        # (an empty array rounds nothing: a STOP, an empty block)
        if (isinstance(p, np.ndarray) and p.dtype.kind == "f" and p.dtype.itemsize < 8
                and p.size):
            what = carried(e) if callable(carried) else carried
            return Failure(
                case.label, check,
                f"at step {e.step} {who(e.src)} sent {what} to {who(e.dst)} as {p.dtype}: "
                f"{p.dtype} rounds the values on the way, to about "
                f"{np.finfo(p.dtype).eps:.0e} of their size",
                expected=f"{what} as float64, as they were computed",
                got=f"dtype {p.dtype}, shape {p.shape}", hint=hint)
    return None


def _ranks(rs):
    rs = list(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


# -- what a program run in the grader's process must leave alone ---------------------

# In the self-check every rank runs in the grader's own process, so a program that
# assigns to numpy's names (np.array_split = ...) changes what the grader computes
# with; so does one that replaces a builtin or one of ringlab's functions. These are
# watched, with every ringlab module and the attributes of ringlab's classes; so is
# the code of every Python function among them (``f.__code__ = ...`` keeps the
# function's identity, and a red team made the grader's checks return None that
# way), and the grader's own constants (a raised tolerance ``TOL = 1e300``).
WATCHED = ("numpy", "numpy.linalg", "numpy.random", "builtins", "math", "copy", "functools")
GRADER = __name__.rpartition(".kit.")[0]                 # "ringlab.grading"
CONSTANTS = (int, float, complex, str, bytes, tuple, frozenset)
# numpy's functions (np.allclose) are dispatchers: a C object around a Python function,
# its read-only ``_implementation``, whose code a program can still replace.
DISPATCHER = type(np.allclose)


class ModuleState:
    """What ``module_state`` saw: the watched ``names`` [(owner, its name, attribute)]
    and their ``values``; the Python ``functions`` among them and their ``codes``
    [(__code__, __defaults__, __kwdefaults__)]. ``same()`` compares by identity (a
    replacement's ``__eq__`` could say "equal"), in C: a case pays for that, not
    for a loop over some 2,700 entries in Python. The functions' part is read with
    one ``gc.get_referents`` (their code, defaults, name, ...): reading
    ``f.__code__`` is an audit event, which the self-check's audit hook (apart.py)
    would make a call of Python, some 900 times."""

    def __init__(self, names, values, functions):
        self.names, self.values, self.functions = names, values, functions
        self.codes = list(map(_CODE, functions))
        self.parts = gc.get_referents(*functions)

    def now(self):
        """The values bound to ``names`` now."""
        return [vars(owner).get(attr, _MISSING) for owner, _, attr in self.names]

    def same(self, values):
        """Whether ``values`` (``now()``) and the functions' parts are those saved."""
        parts = gc.get_referents(*self.functions)
        return (all(map(operator.is_, values, self.values)) and len(parts) == len(self.parts)
                and all(map(operator.is_, parts, self.parts)))


_PARTS = ("__code__", "__defaults__", "__kwdefaults__")
_CODE = operator.attrgetter(*_PARTS)
_MISSING = object()
# The state of a grade in progress (see ``saved_state``): a case reuses it, since
# ``patched_modules`` puts back whatever a program changed.
_SAVED = contextvars.ContextVar("ringlab_module_state", default=None)


def module_state():
    """The functions, classes and modules bound in the watched modules (and in
    ringlab's classes) now, the code of the Python functions among them, and the
    graders' constants (numbers, strings, tuples): a ``ModuleState``. Within a
    grade (``saved_state``) the one taken first, while no module has been imported
    since (about 4 ms saved per call)."""
    saved = _SAVED.get()
    if saved is not None and saved[0] == len(sys.modules) and saved[1] is not None:
        return saved[1]
    names, functions = {}, {}
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType) or not (
                name in WATCHED or name == "ringlab" or name.startswith("ringlab.")):
            continue
        grader = name.startswith(GRADER)
        for attr, value in list(vars(mod).items()):
            if _code(value) or (grader and isinstance(value, CONSTANTS)):
                names[mod, name, attr] = value
            if (isinstance(value, type) and name.startswith("ringlab")
                    and value.__module__ == name):
                for a, v in list(vars(value).items()):
                    if _code(v):
                        names[value, f"{name}.{value.__qualname__}", a] = v
    for value in names.values():
        functions.update(dict.fromkeys(_functions(value)))
    state = ModuleState(list(names), list(names.values()), list(functions))
    if saved is not None:
        saved[:] = [len(sys.modules), state]
    return state


@contextlib.contextmanager
def saved_state():
    """Within it, ``module_state`` reuses the state it took first (while no module
    is imported): a grade's cases, each put back by ``patched_modules``."""
    token = _SAVED.set([None, None])
    try:
        yield
    finally:
        _SAVED.reset(token)


def _code(value):
    return callable(value) or isinstance(value, (types.ModuleType, property, staticmethod,
                                                 classmethod))


def _functions(value):
    """The Python functions whose code runs when ``value`` is called: a function
    and those it wraps (``functools.wraps``'s ``__wrapped__``), a method's, a
    property's, a numpy dispatcher's ``_implementation``."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if type(f) is types.FunctionType]
    if type(value) is DISPATCHER:
        value = value._implementation
    found = []
    while type(value) is types.FunctionType and len(found) < 4:
        found.append(value)
        # Made now if the function had none, so that reading them later (inspect does)
        # adds nothing to what gc.get_referents sees in it (ModuleState).
        value.__annotations__  # noqa: B018
        value = value.__dict__.get("__wrapped__")
    return found


def patched_modules(state, case):
    """A Failure naming what the program replaced (or deleted) among ``state``'s
    names, and whose code it replaced, since it was taken, or None. Puts every
    one of them back first, so that the grader, and the next case, run with the
    real ones."""
    values = state.now()
    if state.same(values):
        return None
    codes = list(map(_CODE, state.functions))
    changed = []
    for (owner, name, attr), was, now in zip(state.names, state.values, values):
        if now is not was:
            changed.append((f"{name}.{attr}", now is _MISSING))
            setattr(owner, attr, was)
    for fn, saved, now in zip(state.functions, state.codes, codes):
        for part, was, new in zip(_PARTS, saved, now):
            if new is not was:
                changed.append((f"{fn.__module__}.{fn.__qualname__}.{part}", False))
                setattr(fn, part, was)
    if not changed:              # a function's other parts changed (its __name__): no matter
        state.parts = gc.get_referents(*state.functions)
        return None
    names = ", ".join(n for n, _ in changed[:3]) + (f" and {len(changed) - 3} more"
                                                    if len(changed) > 3 else "")
    return Failure(case.label if case is not None else "",
                   "the program leaves numpy, Python and ringlab as they are",
                   f"the program replaced {names} while it ran (put back now): the grader runs "
                   f"in the same process, and would read the program's results with what the "
                   f"program replaced",
                   expected="numpy, the builtins and ringlab as the program found them",
                   got="; ".join(f"{n} {'deleted' if gone else 'assigned to'}"
                                 for n, gone in changed[:3]),
                   hint="Write a helper of your own (def split(x, n): ...) and call it; do not "
                        "assign to numpy's, Python's or ringlab's names, nor to their "
                        "functions' code.")


# -- the grader's cases, which a program run in the grader's process must leave alone --

def case_print(case):
    """What ``case`` holds, as {path: token} (a copy, made of bytes, strings and
    numbers, that no program can reach and change): its inputs, args and info,
    into lists, dicts and objects' public attributes (a ``PSTask`` in ``info``). In the
    self-check a program can reach the grader's ``Case`` (``gc``, frames) and
    zero its inputs, so that the grader expects zeros; ``case_changed`` tells."""
    prints, seen = {}, set()
    for key, value in vars(case).items():
        _walk(value, f"case.{key}", prints, seen, 0)
    return prints


def _walk(value, path, prints, seen, depth):
    if isinstance(value, np.ndarray):
        prints[path] = (value.dtype.str, value.shape, value.tobytes())
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        prints[path] = (type(value), repr(value))       # repr: a NaN equals itself
    elif id(value) in seen or depth > 6 or isinstance(value, (type, types.ModuleType,
                                                              types.FunctionType)):
        prints[path] = ("object", id(value))            # the same object, held by the case
    else:
        seen.add(id(value))
        prints[path] = ("object", id(value), type(value))
        if isinstance(value, dict):
            items = value.items()
        elif isinstance(value, (list, tuple)):
            items = enumerate(value)
        elif isinstance(value, (set, frozenset)):
            items = enumerate(sorted(map(repr, value)))
        else:      # an object's public attributes: its private ones (a PSTask's
            # _model, the scratch space of its gradients) change as the grader uses it
            items = [(n, v) for n, v in getattr(value, "__dict__", {}).items()
                     if not n.startswith("_")] + [
                (n, getattr(value, n)) for n in getattr(type(value), "__slots__", ())
                if isinstance(n, str) and not n.startswith("_") and hasattr(value, n)]
        for key, item in items:
            _walk(item, f"{path}[{key!r}]" if isinstance(value, (dict, list, tuple))
                  else f"{path}.{key}", prints, seen, depth + 1)


def case_changed(before, case, added=True):
    """The first path where ``case`` no longer holds what ``before`` (its
    ``case_print``) saw, or None; ``added=False``: entries the case has gained
    (a grader keeps what it computed in ``info``) do not count. ``before`` None:
    no fingerprint was taken (``running.fingerprint``), nothing to compare."""
    if before is None:
        return None
    after = case_print(case)
    for path, token in before.items():
        if after.get(path, _MISSING) != token:
            return path
    return next((path for path in after if path not in before), None) if added else None


def changed_case(case, path):
    """The Failure for a case the program changed while it ran."""
    return Failure(case.label, "the program leaves the grader's case as it was",
                   f"the program changed the grader's case while it ran ({path}): the grader "
                   f"runs in the same process, and would check the program's results against "
                   f"the changed case",
                   expected="the case's inputs, arguments and settings as the grader made them",
                   got=f"{path} changed",
                   hint="Work on the arguments your function is given; do not look for the "
                        "grader's objects (gc, frames) or change them.")


def check_crashed(case, exc):
    """The Failure for a check that raised on what a program's run produced: a grade,
    never a traceback of the grader."""
    where = traceback.extract_tb(exc.__traceback__)[-1:]
    line = f" (in {where[0].name}, {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno})" \
        if where else ""
    return Failure(case.label, "the grader can read the program's run",
                   f"checking this case raised {type(exc).__name__}: {exc}{line}: the program "
                   f"returned or sent something of a kind no check expects",
                   expected="results and messages the checks can read: plain float64 numpy "
                            "arrays, numpy and ringlab unchanged",
                   got=f"{type(exc).__name__}: {exc}",
                   hint="Return plain numpy arrays and send arrays unchanged. If your program "
                        "does only that, the grader is wrong: report it with the Reproduce "
                        "line below.")
