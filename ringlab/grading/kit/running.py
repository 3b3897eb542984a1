"""Running one case of a grader: ``run_case``, and what runs it.

What runs a case is ``ringlab.run`` (all ranks in this process), or, for
trusted grading (``ringlab grade``), ``ringlab.backends.isolated.runner()``,
one process per rank. Graders call ``run_case``/``active_runner()`` and never
need to know which.
"""

from __future__ import annotations

import contextvars
import copy

import numpy as np

from ...backends.isolated.server import MEASURES_MEMORY
from ...errors import DeadlockError, ProgramTimeout, RankError, UnreceivedMessagesError
from ...runner import run
from . import apart
from .checks import case_changed, case_print, changed_case
from .frames import without_grader_frames
from .report import Failure, NotImplementedYet

# What runs a case: ``ringlab.run`` (all ranks in this process), or, for trusted
# grading (``ringlab grade``), ``ringlab.backends.isolated.runner()``, one process
# per rank. Graders call ``run_case``/``active_runner()`` and never need to know.
_RUNNER = contextvars.ContextVar("ringlab_runner", default=None)


# The case whose first run the causality check repeats (see causality.py): a list
# that run_case fills with that run's (program, inputs, args, timeout).
_FIRST_RUN = contextvars.ContextVar("ringlab_first_run", default=None)


def active_runner():
    runner = _RUNNER.get() or run    # `run` looked up now: tests may patch it

    def timed(program, inputs, *, timeout=10.0, **kw):
        apart.beat(timeout)          # a self-check in a process of its own: see apart.py
        return runner(program, inputs, timeout=timeout, **kw)
    return timed


def shares_process():
    """Whether the program runs in the grader's process, where it could reach the
    grader's cases (gc, frames) and change them: the self-check's ``ringlab.run``,
    not ``ringlab grade``'s ranks in processes of their own. Only then are the
    cases fingerprinted (``checks.case_print``, which copies every array)."""
    return not getattr(_RUNNER.get(), "isolated", False)


def fingerprint(case):
    """``case_print(case)`` where the program shares the process, else None (which
    ``case_changed`` takes as nothing to compare)."""
    return case_print(case) if shares_process() else None


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
    before = fingerprint(case)
    # Only a case that measures memory reads the rank processes' (``ringlab grade``).
    token = MEASURES_MEMORY.set(bool(case.info.get("measure")))
    try:
        result, failure = _run_case(program, case, inputs, backend, kw)
    finally:
        MEASURES_MEMORY.reset(token)
    changed = case_changed(before, case)
    return (None, changed_case(case, changed)) if changed else (result, failure)


def _run_case(program, case, inputs, backend, kw):
    try:
        result = active_runner()(program, inputs, args=case.args, timeout=kw.pop("timeout", 10.0),
                                 backend=backend, **kw)
        result.handed = result.handed or []
        return result, None
    except RankError as e:
        if isinstance(e.exc, NotImplementedError):
            raise NotImplementedYet from e
        # The learner's frames only: the grader's driver is not theirs to read.
        where = without_grader_frames(str(e.program_traceback)).rstrip()
        if where.count("\n") < 2:         # no frame of the program's: the grader stopped it
            return None, Failure(case.label, "the program runs without error", e.headline,
                                 hint="The rank was stopped where the report says, not by an "
                                      "error in your code's arithmetic: see What.", error=e)
        return None, Failure(case.label, "the program runs without error", e.headline,
                             got=where,
                             hint="Read the last line of your code in the traceback above; the "
                                  "error happened there, on the rank named.", error=e)
    except DeadlockError as e:
        words, hint = e.explain()
        return None, Failure(case.label, "no deadlock", str(e) + (f"\n{words}" if words else ""),
                             hint=hint, error=e)
    except ProgramTimeout as e:
        # Where each rank was stopped: the learner's frames only, as for an error.
        return None, Failure(case.label, "the program finishes", without_grader_frames(str(e)),
                             error=e)
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
