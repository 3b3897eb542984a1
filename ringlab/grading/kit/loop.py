"""The grade loop: ``grade_cases`` runs a grader's cases on a program.

A grader module defines ``cases(rng)``, yielding ``Case`` objects, and
``check(program, case, backend)``, which runs the program on ``backend``
("sim", or a real one such as "torch"; see ``ringlab.run``) and returns
``None`` when the case passes or a ``Failure`` that says what went wrong,
where, and what to try. The loop adds what every grader shares: a check
that raises is a failure, what the program patched is named and put back (a
name, a function's code, a grader's constant), a case the program changed
fails, causality is checked on one case, and the self-check runs in a process
of its own (``apart.py``).
"""

from __future__ import annotations

import secrets

import numpy as np

from ...backends.isolated.server import MEASURES_MEMORY
from . import apart, checks
from .causality import violation
from .report import Failure, NotImplementedYet, Report
from .running import _FIRST_RUN, _RUNNER, fingerprint

START = 60.0        # seconds a case may take to set up, before its first run


def grade_cases(exercise_id, module, program, *, seed=None, backend="sim", runner=None):
    """Run ``module``'s cases on ``program``; ``runner`` replaces ``ringlab.run``.

    With neither (the self-check), the grade runs in a process of its own
    (``apart.py``), so that a program stuck in C code cannot hang it."""
    # 12 digits: short enough to retype, too many to search for the seed that
    # made the hidden cases from the one input a rank sees.
    seed = secrets.randbelow(10**12) if seed is None else seed
    if runner is None and backend == "sim":
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
    with checks.saved_state():     # the cases share one module_state: see checks.py
        return _graded(exercise_id, module, program, seed, backend)


def _graded(exercise_id, module, program, seed, backend):
    cases = list(module.cases(np.random.default_rng(seed)))
    # What each case holds now: a program may reach the grader's cases (gc) and change
    # them, the later ones too, while it runs on one of them.
    prints = [fingerprint(case) for case in cases]
    sizes = tuple(sorted({c.world_size for c in cases}))
    report = Report(exercise_id, False, seed, 0, len(cases), sizes, backend=backend)
    causal = _causality_case(module, cases)
    try:
        for index, case in enumerate(cases):
            apart.beat(START, (case.label, index, len(cases)))
            first = []
            token = _FIRST_RUN.set(first if case is causal else None)
            state = checks.module_state()
            changed = checks.case_changed(prints[index], case)
            if changed:           # changed while the program ran on an earlier case
                report.failure = checks.changed_case(case, changed)
                return report
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
            # What the grader adds to a case's info as it checks is its own.
            changed = checks.case_changed(prints[index], case, added=False)
            failure = (checks.changed_case(case, changed) if changed else None) or failure
            if failure is None and first:
                failure = _causality(module, case, *first[0])
            if failure is not None:
                report.failure = failure
                return report
            report.cases_passed += 1
    except NotImplementedYet:
        report.not_implemented = True
        return report
    report.passed = True
    return report


def _causality_case(module, cases):
    """The case the causality check repeats (1 + N more runs): the grader's own
    choice (``causality_case(cases)``, where its smallest case would show
    nothing, e.g. a single node), else the smallest world of 4 or more ranks
    (small worlds allow tricks larger ones do not: a flat broadcast in log2 N
    steps), else of 3, else of 2, among the cases that measure no memory."""
    chosen = getattr(module, "causality_case", None)
    if chosen is not None:
        return chosen(cases)
    light = [c for c in cases if c.world_size >= 2 and not c.info.get("measure")]
    return min(light, key=lambda c: (c.world_size < 4, c.world_size < 3, c.world_size),
               default=None)


def _causality(module, case, program, inputs, args, timeout):
    token = MEASURES_MEMORY.set(False)      # its runs read no rank's memory: no warm-up
    try:
        found = violation(program, inputs, args, timeout,
                          depends_on_all=getattr(module, "DEPENDS_ON_ALL", False))
    except Exception:  # noqa: BLE001 - the case itself passed; a failing repeat proves nothing
        return None
    finally:
        MEASURES_MEMORY.reset(token)
    if found is None:
        return None
    check, what = found
    return Failure(case.label, check, what,
                   expected="each rank's messages computed from its own input and the "
                            "messages it has received",
                   hint="Ranks share data only through messages: no module-level or global "
                        "state, no files, no reading other ranks' objects. A message can hold "
                        "a rank's contribution only after that contribution has reached the "
                        "sender.")
