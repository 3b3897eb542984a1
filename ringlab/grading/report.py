"""The grade report, and the loop that runs a grader's cases.

A grader module defines ``cases(rng)``, yielding ``Case`` objects, and
``check(program, case, backend)``, which runs the program on ``backend``
("sim", or a real one such as "torch"; see ``ringlab.run``) and returns
``None`` when the case passes or a ``Failure`` that says what went wrong,
where, and what to try.
"""

from __future__ import annotations

import contextvars
import copy
import html
import secrets
from dataclasses import dataclass, field

import numpy as np

from ..errors import DeadlockError, ProgramTimeout, RankError, UnreceivedMessagesError
from ..runner import run
from . import apart, deadlock


# What runs a case: ``ringlab.run`` (all ranks in this process), or, for trusted
# grading (``ringlab grade``), ``ringlab.grading.isolated.runner()``, one process
# per rank. Graders call ``run_case``/``active_runner()`` and never need to know.
_RUNNER = contextvars.ContextVar("ringlab_runner", default=None)
START = 60.0        # seconds a case may take to set up, before its first run
# The case whose first run the causality check repeats (see causality.py): a list
# that run_case fills with that run's (program, inputs, args, timeout).
_FIRST_RUN = contextvars.ContextVar("ringlab_first_run", default=None)


def active_runner():
    runner = _RUNNER.get() or run    # `run` looked up now: tests may patch it

    def timed(program, inputs, *, timeout=10.0, **kw):
        apart.beat(timeout)          # a self-check in a process of its own: see apart.py
        return runner(program, inputs, timeout=timeout, **kw)
    return timed


@dataclass
class Case:
    """One world to run: ``inputs`` per rank, shared ``args``, and a label."""

    world_size: int
    inputs: list
    label: str
    args: tuple = ()
    info: dict = field(default_factory=dict)


@dataclass
class Failure:
    case: str
    check: str
    what: str
    expected: str | None = None
    got: str | None = None
    hint: str | None = None
    # The run's error (RankError, DeadlockError, ...), for a grader that explains it further; not shown.
    error: Exception | None = field(default=None, repr=False, compare=False)


class NotImplementedYet(Exception):
    """The program raised NotImplementedError: the stub is not filled in yet."""


@dataclass
class Report:
    """A grade: ``passed``, and a readable ``str()`` (HTML in a notebook)."""

    exercise: str
    passed: bool
    seed: int
    cases_passed: int = 0
    cases_total: int = 0
    world_sizes: tuple = ()
    failure: Failure | None = None
    not_implemented: bool = False
    backend: str = "sim"

    def __bool__(self):
        return self.passed

    def __str__(self):
        head = f"{self.exercise} results:"
        if self.not_implemented:
            return (f"{head} not implemented yet. Fill in the program (replace the "
                    f"`raise NotImplementedError`) and run the grading cell again.")
        if self.passed:
            sizes = f"{min(self.world_sizes)}-{max(self.world_sizes)}" if self.world_sizes else "-"
            return f"{head} All test cases passed! ({self.cases_total} cases, world sizes {sizes})"
        f = self.failure
        lines = [f"{head} FAILED ({self.cases_passed} of {self.cases_total} cases passed before this one)",
                 "", f"Case:     {f.case}", f"Check:    {f.check}", f"What:     {_indent(f.what)}"]
        if f.expected is not None:
            lines.append(f"Expected: {_indent(f.expected)}")
        if f.got is not None:
            lines.append(f"Got:      {_indent(f.got)}")
        if f.hint:
            lines.append(f"Hint:     {_indent(f.hint)}")
        # The backend too: a failure on real processes may not happen in the simulator.
        backend = "" if self.backend == "sim" else f", backend={self.backend!r}"
        lines += ["", f'Reproduce: ringlab.grade("{self.exercise}", program, seed={self.seed}{backend})']
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self):
        colour = "#1a7f37" if self.passed else ("#9a6700" if self.not_implemented else "#cf222e")
        return (f'<pre class="ringlab-report" style="border-left:4px solid {colour};'
                f'padding-left:8px;white-space:pre-wrap">{html.escape(str(self))}</pre>')


def _indent(text):
    return str(text).replace("\n", "\n          ")


def numbers(values, count=4):
    """Values as plain numbers for a report, "[1.5, -2.25, ...]": never numpy's
    reprs (``np.float64(1.5)``), and at most ``count`` of them."""
    flat = np.ravel(np.asarray(values, dtype=object))
    shown = ", ".join(_number(v) for v in flat[:count])
    return f"[{shown}{', ...' if len(flat) > count else ''}]"


def _number(v):
    try:
        return f"{float(v):.10g}"
    except (TypeError, ValueError):
        return repr(v)[:40]


def run_case(program, case, backend="sim", **kw):
    """Run one case; return (RunResult, None) or (None, Failure). Learner bugs
    become Failures with a diagnosis; a stub raises NotImplementedYet.

    Every run records payloads, on every backend; the simulator then hands
    each receiver a copy of its own (see ``ringlab.sim.world``), and
    ``result.handed`` lists those copies, to tell later what a receiver
    changed in place."""
    inputs = copy.deepcopy(case.inputs)   # a program may modify its input in place
    kw.setdefault("record_payloads", True)     # the content checks read what messages carried
    first = _FIRST_RUN.get()
    if first is not None and not first and backend == "sim" and not kw.get("network"):
        first.append((program, copy.deepcopy(case.inputs), case.args, kw.get("timeout", 10.0)))
    try:
        result = active_runner()(program, inputs, args=case.args, timeout=kw.pop("timeout", 10.0),
                                 backend=backend, **kw)
        result.handed = result.handed or []
        return result, None
    except RankError as e:
        if isinstance(e.exc, NotImplementedError):
            raise NotImplementedYet from e
        return None, Failure(case.label, "the program runs without error", e.headline,
                             got=str(e.program_traceback).rstrip(),
                             hint="Read the last line of your code in the traceback above; the "
                                  "error happened there, on the rank named.", error=e)
    except DeadlockError as e:
        words, hint = deadlock.explain(e)
        return None, Failure(case.label, "no deadlock", str(e) + (f"\n{words}" if words else ""),
                             hint=hint, error=e)
    except ProgramTimeout as e:
        return None, Failure(case.label, "the program finishes", str(e), error=e)
    except UnreceivedMessagesError as e:
        return None, Failure(case.label, "every message sent is received", str(e),
                             hint="Count the sends and receives each rank makes: they must match "
                                  "one for one (one step too many on the sending side?).", error=e)


def check_outputs_shape(result, case, expected_shape, receives=None):
    """Every rank returned a plain float64 numpy array of the expected shape, or
    a Failure. ``receives(r)``: whether rank r must receive something (default:
    every rank when N > 1), to tell a rank that never got its data from one
    that forgot its ``return``."""
    receives = receives or (lambda r: case.world_size > 1)
    for r, out in enumerate(result.outputs):
        if out is None and receives(r) and not any(e.dst == r for e in result.trace):
            return Failure(case.label, "every rank returns its result",
                           f"rank {r} returned NoneType: it never received a message",
                           expected=f"a numpy array of shape {expected_shape}", got="None",
                           hint=f"Rank {r} got no data, so it had nothing to return: check the "
                                f"condition or loop that decides when rank {r} receives, and which "
                                f"rank sends to it.")
        failure = plain_array(case, f"rank {r}", out, f"a numpy array of shape {expected_shape}")
        if failure:
            return failure
        if not isinstance(out, np.ndarray):
            pieces = isinstance(out, (list, tuple)) and out and all(isinstance(p, np.ndarray) for p in out)
            return Failure(case.label, "every rank returns its result",
                           f"rank {r} returned {type(out).__name__}"
                           + (f" of {len(out)} arrays" if pieces else ""),
                           expected=f"a numpy array of shape {expected_shape}",
                           got=repr(out)[:200],
                           hint=(f"Return one array, not a {type(out).__name__} of arrays: pass it to "
                                 f"np.concatenate, which joins them in order." if pieces else
                                 "End your program with `return` of the result array."))
        if out.shape != tuple(expected_shape):
            return Failure(case.label, "every rank returns its result",
                           f"rank {r} returned an array of shape {out.shape}",
                           expected=f"shape {tuple(expected_shape)}", got=f"shape {out.shape}")
    return None


def plain_array(case, who, out, expected):
    """A Failure if ``out`` is an ndarray that is not a plain float64 one: an
    ndarray subclass may redefine ``==`` and numpy's functions (so a comparison
    would say "equal" whatever it holds), and another dtype is not the data."""
    if isinstance(out, np.ndarray) and type(out) is not np.ndarray:
        return Failure(case.label, "every rank returns its result",
                       f"{who} returned a {type(out).__name__}, a subclass of numpy.ndarray",
                       expected=f"{expected}: a plain numpy.ndarray", got=type(out).__name__,
                       hint="Return a plain array: np.asarray(result) or result.copy() of a plain one.")
    if isinstance(out, np.ndarray) and out.dtype != np.float64:
        return Failure(case.label, "every rank returns its result",
                       f"{who} returned an array of dtype {out.dtype}",
                       expected=f"{expected}, dtype float64 like the inputs", got=f"dtype {out.dtype}",
                       hint="Keep the data float64: no conversion to another type on the way.")
    return None


def grade_cases(exercise_id, module, program, *, seed=None, backend="sim", runner=None):
    """Run ``module``'s cases on ``program``; ``runner`` replaces ``ringlab.run``.

    With neither (the self-check), the grade runs in a process of its own
    (``apart.py``), so that a program stuck in C code cannot hang it."""
    # 12 digits: short enough to retype, too many to search for the seed that
    # made the hidden cases from the one input a rank sees.
    seed = secrets.randbelow(10**12) if seed is None else seed
    if runner is None and backend == "sim":
        from . import causality, checks  # noqa: F401 - imported here once, not in every child
        head = Report(exercise_id, False, seed, backend=backend)

        def stopped(where, what, check):
            label, index, total = where or ("while setting up the cases", 0, 0)
            head.cases_passed, head.cases_total = index, total
            head.failure = Failure(label, check, what)
            return head
        return apart.run_apart(
            lambda: _without_errors(_grade_cases(exercise_id, module, program, seed, backend)),
            lambda where, limit: stopped(where, (
                f"the program did not finish within its time limit ({limit} s) and could not "
                f"be interrupted: it is stuck inside one call into C code (a loop in numpy, "
                f"itertools or a regular expression, say), which Python cannot stop; the "
                f"grade ran in a process of its own, which was ended"), "the program finishes"),
            lambda where, why: stopped(where, why, "the program runs without error"))
    token = _RUNNER.set(runner) if runner is not None else None
    try:
        return _grade_cases(exercise_id, module, program, seed, backend)
    finally:
        if token is not None:
            _RUNNER.reset(token)


def _without_errors(report):
    """The report, light enough to travel: the run's error object stays behind."""
    if report.failure is not None:
        report.failure.error = None
    return report


def _grade_cases(exercise_id, module, program, seed, backend):
    from . import checks            # checks imports this module: here, not at the top
    cases = list(module.cases(np.random.default_rng(seed)))
    sizes = tuple(sorted({c.world_size for c in cases}))
    report = Report(exercise_id, False, seed, 0, len(cases), sizes, backend=backend)
    causal = _causality_case(cases)
    try:
        for index, case in enumerate(cases):
            apart.beat(START, (case.label, index, len(cases)))
            first = []
            token = _FIRST_RUN.set(first if case is causal else None)
            state = checks.module_state()
            try:
                failure = module.check(program, case, backend)
            except NotImplementedYet:
                raise
            except Exception as exc:  # noqa: BLE001 - a learner's run is graded, never crashes the grader
                failure = checks.check_crashed(case, exc)
            finally:
                _FIRST_RUN.reset(token)
            # What the program replaced in numpy, Python or ringlab is named first, and put back.
            failure = checks.patched_modules(state, case) or failure
            if failure is None and first:
                failure = _causality(case, *first[0])
            if failure is not None:
                report.failure = failure
                return report
            report.cases_passed += 1
    except NotImplementedYet:
        report.not_implemented = True
        return report
    report.passed = True
    return report


def _causality_case(cases):
    """The case the causality check repeats (1 + N more runs): the smallest world
    of 3 or more ranks (the fewest that can show a message carrying a rank not
    yet heard from), else of 2, among the cases that measure no memory."""
    light = [c for c in cases if c.world_size >= 2 and not c.info.get("measure")]
    return min(light, key=lambda c: (c.world_size < 3, c.world_size), default=None)


def _causality(case, program, inputs, args, timeout):
    from .causality import violation
    try:
        what = violation(program, inputs, args, timeout)
    except Exception:  # noqa: BLE001 - the case itself passed; a failing repeat proves nothing
        return None
    if what is None:
        return None
    return Failure(case.label, "every message carries only what its sender knew", what,
                   expected="each rank's messages computed from its own input and the "
                            "messages it has received",
                   hint="Ranks share data only through messages: no module-level or global "
                        "state, no files, no reading other ranks' objects. A message can hold "
                        "a rank's contribution only after that contribution has reached the "
                        "sender.")
