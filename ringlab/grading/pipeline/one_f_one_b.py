"""Grader for exercise ``one_f_one_b``: the 1F1B schedule of one pipeline rank.

Signature: ``one_f_one_b(r, p, m) -> list of Action``, the order in which rank
``r`` of ``p`` runs the forward (``Action("F", mb, r)``) and the backward
(``Action("B", mb, r)``) of each of ``m`` microbatches (``ringlab.pipeline.Action``;
``parse("0F0 0F1 0B0")`` makes such a list). Rank r holds model stage r.

Each case calls the function for every rank r of a pipeline (p from 1 to 8;
m < p, m = p, m > p, m not a multiple of p), each rank in its own process
under ``ringlab grade``, and puts the lists together. The checks, in order:

1. "returns a list of Actions": a list (or tuple) of ``Action``s, F or B
   only, each on stage r;
2. "the schedule is valid": ``ringlab.pipeline.validate`` of the whole
   schedule finds nothing (its message is shown: order, a missing action, a
   deadlock);
3. "microbatches in flight": rank r holds at most min(p - r, m) microbatches'
   activations at once (1F1B's memory bound; GPipe's is m);
4. "the bubble": the ideal timeline's idle time over compute time is
   (p - 1) / m, with t_b = t_f and with t_b = 2 t_f.

A failure also names the usual mistake when the rank's list is exactly it:
GPipe, a warm-up of one forward too many or too few (the warm-up count
expected, p - 1 - r, and the one found), forward and backward swapped in the
steady state.
"""

import functools
import numbers
from fractions import Fraction

import numpy as np

from ..kit.driver import callable_learner, problem, problem_text
from ..kit.frames import without_grader_frames
from ..kit.report import Case, Failure
from ..kit.running import run_case
from ...answers import answer
from ...pipeline.actions import KINDS, Action, format_schedule
from ...pipeline.schedules import gpipe_stage, one_f_one_b_stage
from ...pipeline.validate import peak_in_flight, timeline, bubble_ratio, validate

NAME = "one_f_one_b"
# ringlab.pipeline.actions and .validate are helpers here; .schedules holds the answer.
# This module computes right lists too (for the diagnoses): those functions are
# answers (``@answer``), removed from a rank's process, where the driver runs.
USES = ()
CASES = [(4, 8), (2, 5), (3, 2), (1, 3), (3, 3), (5, 7), (8, 3), (8, 8), (8, 12), (6, 9),
         (3, 1), (1, 1)]
RETURNS = 'one_f_one_b(r, p, m) -> a list of Actions, e.g. parse("0F0 0F1 0B0 ...")'
HINT = ("Warm-up: p - 1 - r forwards (at most m). Steady state: one forward, then one backward "
        "(of the oldest microbatch in flight), until every forward has run. Cool-down: the "
        "remaining backwards.")


# --------------------------------------------------------------------- the usual mistakes

@answer("one_f_one_b")
def _with_warmup(r, p, m, warmup, swapped=False):
    """Rank r's 1F1B list with another warm-up (the library's 1F1B for a pipeline of
    r + 1 + warmup stages) and, ``swapped``, each steady-state pair run B before F."""
    warmup = max(0, min(warmup, m))
    order = one_f_one_b_stage(r, r + 1 + warmup, m)
    if swapped:
        for i in range(warmup, 2 * m - warmup, 2):
            order[i:i + 2] = order[i + 1], order[i]
    return order


@answer("one_f_one_b")
def mistakes(r, p, m):
    """{kind: (rank r's list, words)} of the usual mistakes, for rank r."""
    def warmup(wrong, words):
        return (_with_warmup(r, p, m, wrong),
                f"rank {r}'s warm-up has {max(0, min(wrong, m))} forward(s) ({words}); "
                f"expected p - 1 - r = {min(p - 1 - r, m)}")
    return {"gpipe": (gpipe_stage(r, p, m),
                      f"rank {r}'s list is GPipe's: all {m} forwards, then all the backwards. "
                      f"1F1B starts backwards after a warm-up of p - 1 - r = {p - 1 - r} "
                      f"forwards, so that a rank never holds more than p - r microbatches"),
            "long": warmup(p - r, "one forward too many: p - r"),
            "short": warmup(p - 2 - r, "one forward too few: p - 2 - r"),
            "swapped": (_with_warmup(r, p, m, p - 1 - r, swapped=True),
                        f"rank {r}'s steady state runs the backward before the forward: "
                        f"forward and backward swapped. In 1F1B's steady state a rank runs the "
                        f"forward of a new microbatch, then the backward of the oldest one in "
                        f"flight")}


@answer("one_f_one_b")
def diagnose(schedule, p, m):
    """Words for the usual mistake the whole schedule is, naming the first rank where it
    differs from 1F1B, or ''. (A swapped steady state on ranks 0..p-2 is also a warm-up one
    short: the last rank, where B comes before F, tells them apart.)"""
    rights = [one_f_one_b_stage(r, p, m) for r in range(p)]
    each = [mistakes(r, p, m) for r in range(p)]
    for kind in ("gpipe", "swapped", "long", "short"):
        if all(acts == each[r][kind][0] for r, acts in enumerate(schedule)):
            differ = [r for r in range(p) if each[r][kind][0] != rights[r]]
            if differ:
                return each[differ[0]][kind][1]
    return ""


# --------------------------------------------------------------------------- the driver

def drive(comm, inp, learner):
    """What rank r runs: the learner's list for rank r, as rows (kind, mb, stage)."""
    learner = callable_learner(learner)
    r, p, m = inp
    out = learner(r, p, m)
    if not isinstance(out, (list, tuple)):
        return problem(f"one_f_one_b({r}, {p}, {m}) returned a {type(out).__name__}, not a list "
                       f"of Actions")
    rows = []
    for i, a in enumerate(out):
        if not isinstance(a, Action):
            return problem(f"one_f_one_b({r}, {p}, {m})[{i}] is a {type(a).__name__} "
                           f"({repr(a)[:40]}), not an Action")
        for field in ("mb", "stage"):
            v = getattr(a, field)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or not 0 <= v < 2**31:
                return problem(f"one_f_one_b({r}, {p}, {m})[{i}].{field} is {v!r} "
                               f"({type(v).__name__}): expected a whole number, 0 <= n < 2**31")
        rows.append([KINDS.index(a.kind), int(a.mb), int(a.stage)])
    return [np.zeros(0), np.array(rows, dtype=np.int64).reshape(-1, 3)]


def cases(rng):
    p = int(rng.integers(2, 8))
    for p, m in [*CASES, (p, int(rng.integers(1, 5 * p)))]:
        yield Case(p, [[r, p, m] for r in range(p)], f"p={p} ranks, m={m} microbatches",
                   info=dict(p=p, m=m))


def check(program, case, backend="sim"):
    result, failure = run_case(functools.partial(drive, learner=program), case, backend)
    if failure:
        failure.got = without_grader_frames(failure.got)
        return failure
    schedule, failure = _read(result, case)
    if failure:
        return failure
    p, m = case.info["p"], case.info["m"]
    shown = format_schedule(schedule) if p * 2 * m <= 80 else ""
    diagnosis = diagnose(schedule, p, m)

    def fail(check_name, what, expected, got, hint=HINT):
        if diagnosis:
            what += f"\n{diagnosis}."
        if shown:
            got = f"{got}\nyour schedule:\n{shown}"
        return Failure(case.label, check_name, what, expected=expected, got=got, hint=hint)

    return (_valid(schedule, p, m, fail) or _in_flight(schedule, p, m, fail)
            or _bubble(schedule, p, m, fail))


def _read(result, case):
    """Check 1: (the schedule, the ranks' lists put together, and None) or (None, Failure)."""
    schedule = []
    for r, out in enumerate(result.outputs):
        text = problem_text(out)
        if text or not (isinstance(out, (list, tuple)) and len(out) == 2
                        and isinstance(out[1], np.ndarray) and out[1].ndim == 2):
            return None, Failure(case.label, "returns a list of Actions",
                                 text or f"rank {r}: the function's result could not be read",
                                 expected=RETURNS, hint="Return a list of ringlab.pipeline.Action.")
        schedule.append([Action(KINDS[k], int(mb), int(s)) for k, mb, s in out[1]])
    for r, acts in enumerate(schedule):
        for i, a in enumerate(acts):
            if a.kind == "W":
                return None, Failure(case.label, "returns a list of Actions",
                                     f"rank {r}'s list has {a} at position {i}: 1F1B has no "
                                     f"W (B does the whole backward)", hint=HINT)
            if a.stage != r:
                return None, Failure(case.label, "returns a list of Actions",
                                     f"rank {r}'s list has {a} at position {i}: stage "
                                     f"{a.stage}, not rank {r}'s own stage {r}",
                                     hint=f"Rank r runs stage r: Action(kind, mb, r), here "
                                          f'Action("F", {a.mb}, {r}).')
    return schedule, None


def _valid(schedule, p, m, fail):
    """Check 2: ringlab.pipeline.validate finds nothing."""
    found = validate(schedule, n_stages=p, n_microbatches=m)
    if found:
        return fail("the schedule is valid", f"ringlab.pipeline.validate: {found}",
                    "a schedule validate() accepts: each rank runs F then B of every "
                    "microbatch, in order, and no rank waits for an input that never comes",
                    str(found))
    return None


def _in_flight(schedule, p, m, fail):
    """Check 3: rank r holds at most min(p - r, m) microbatches at once."""
    peaks = peak_in_flight(schedule)
    for r, peak in enumerate(peaks):
        want = min(p - r, m)
        if peak != want:
            what = f"your rank {r} holds {peak} microbatches at once"
            if peak > want and peak == m:
                what += (f", GPipe's m, not 1F1B's p - r = {p - r}: start backwards after the "
                         f"warm-up")
            elif peak > want:
                what += f", more than 1F1B's p - r = {p - r}"
            else:
                what += (f", fewer than 1F1B's min(p - r, m) = {want}: with so short a warm-up "
                         f"the pipeline never fills")
            return fail("microbatches in flight", what,
                        f"min(p - r, m) = {want} on rank {r} (per rank: "
                        f"{[min(p - q, m) for q in range(p)]})",
                        f"{peak} on rank {r} (per rank: {peaks})")
    return None


def _bubble(schedule, p, m, fail):
    """Check 4: the ideal timeline's bubble is (p - 1) / m, with t_b = t_f and 2 t_f."""
    want = Fraction(p - 1, m)
    for t_b in (1, 2):
        got = bubble_ratio(timeline(schedule, t_f=1, t_b=t_b))
        if got != want:
            return fail("the bubble",
                        f"with t_f = 1 and t_b = {t_b}, the ideal timeline's idle time over "
                        f"compute time is {got}, not 1F1B's (p - 1) / m = {want}",
                        f"(p - 1) / m = {want}", str(got))
    return None
