"""The self-check (``ringlab.grade`` in a notebook) runs every rank in the grader's
own process. What a program could change there to pass without doing the work must
fail, named, as it fails under ``ringlab grade`` (one process per rank): a grader
function's code swapped (``f.__code__ = ...``: the function keeps its identity), its
defaults, the code behind a numpy function, a grader's constant, the grader's own
``Case`` reached through ``gc``. Each program here is small and made for the test.
"""

import gc
import math
import types

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allreduce
from ringlab.grading.kit import causality, checks, loop
from ringlab.grading.kit.loop import grade_cases
from ringlab.grading.kit.report import Case

import ringlab.grading.collectives.ring_allreduce as grader
import programs.ring_variants as v

PATCHED = "the program leaves numpy, Python and ringlab as they are"
CASE = "the program leaves the grader's case as it was"


def _nothing(*args, **kwargs):
    return None


def _always(*args, **kwargs):
    return True


def _sum_by_ring(comm, x):
    """A right ring AllReduce written in the tests (not ringlab's answer)."""
    return v._sendrecv_ring(comm, x)


def _zeros_by_ring(comm, x):
    """The ring's messages, of zeros: every rank returns zeros."""
    return _sum_by_ring(comm, np.zeros_like(x))


def _swaps_code(comm, x):
    causality.violation.__code__ = _nothing.__code__
    return _zeros_by_ring(comm, x)


def _swaps_numpy(comm, x):
    np.allclose._implementation.__code__ = _always.__code__
    return _zeros_by_ring(comm, x)


def _swaps_defaults(comm, x):
    checks.ratio.__defaults__ = (1,)
    return _sum_by_ring(comm, x)


def _raises_constant(comm, x):
    loop.START = 1e9
    return _sum_by_ring(comm, x)


@pytest.mark.parametrize("program, words", [
    (_swaps_code, "ringlab.grading.kit.causality.violation.__code__"),
    (_swaps_numpy, "numpy._core.numeric.allclose.__code__"),
    (_swaps_defaults, "ringlab.grading.kit.checks.ratio.__defaults__"),
    (_raises_constant, "ringlab.grading.kit.loop.START"),
], ids=["grader_code", "numpy_implementation", "defaults", "grader_constant"])
def test_a_swapped_code_or_constant_fails_by_name_and_is_put_back(program, words):
    saved = (causality.violation.__code__, np.allclose._implementation.__code__,
             checks.ratio.__defaults__, loop.START)
    try:
        # In this process (no process of its own): what was swapped must be put back.
        report = grade_cases("ring_allreduce", grader, program, seed=0, runner=ringlab.run)
        assert (causality.violation.__code__, np.allclose._implementation.__code__,
                checks.ratio.__defaults__, loop.START) == saved
    finally:
        (causality.violation.__code__, np.allclose._implementation.__code__,
         checks.ratio.__defaults__, loop.START) = saved
    text = str(report)
    assert not report.passed and report.failure.check == PATCHED, text
    assert f"the program replaced {words}" in text and "(put back now)" in text, text
    # The self-check, in a process of its own, says the same.
    child = ringlab.grade("ring_allreduce", program, seed=0, log=False)
    assert child.failure.check == PATCHED and words in child.failure.what, str(child)


def _zeros_the_cases(comm, x):
    """Zero every grader Case's inputs (gc) so that the expected sum is zero."""
    for o in gc.get_objects():
        if isinstance(o, Case):
            for v in o.inputs:
                v[...] = 0.0
    return _zeros_by_ring(comm, x)


def _zeros_the_other_cases(comm, x):
    """Right, but zeros the inputs of every Case other than its own, for later."""
    for o in gc.get_objects():
        if not issubclass(type(o), Case):     # isinstance would ask o.__class__
            continue
        arrays = [v for v in o.inputs if isinstance(v, np.ndarray)]
        if not any(v is x or np.array_equal(v, x) for v in arrays):
            for v in arrays:        # other tests' cases may still be alive: arrays only
                if v.flags.writeable:
                    v[...] = 0.0
    return _sum_by_ring(comm, x)


def _adds_to_the_info(comm, x):
    for o in gc.get_objects():
        if isinstance(o, Case):
            o.info["s"] = math.inf
    return _sum_by_ring(comm, x)


@pytest.mark.parametrize("program, where", [
    (_zeros_the_cases, "case.inputs[0]"),
    (_zeros_the_other_cases, "case.inputs[0]"),
    (_adds_to_the_info, "case.info['s']"),
], ids=["its_case", "later_cases", "info"])
def test_a_program_that_changes_the_grader_s_case_fails(program, where):
    # In this process, with nothing to refuse gc: the case's fingerprint tells.
    report = grade_cases("ring_allreduce", grader, program, seed=0, runner=ringlab.run)
    text = str(report)
    assert not report.passed and report.failure.check == CASE, text
    assert f"the program changed the grader's case while it ran ({where})" in text, text
    if program is _zeros_the_other_cases:       # its own case passed: the next one fails
        assert report.cases_passed == 1, text
    # The self-check, in a process of its own, refuses gc's walk first, as `ringlab grade`
    # does (the rule of isolated runs).
    child = ringlab.grade("ring_allreduce", program, seed=0, log=False)
    assert not child.passed and "NotAllowed" in str(child) and "gc.get_objects" in str(child)


def test_what_the_grader_adds_to_its_case_and_right_programs_pass():
    """A grader may keep what it computed in a case's info after the run; a right
    program that imports a module as it runs (the state is taken again) passes."""
    def imports(comm, x):
        import json  # noqa: F401
        import ringlab.cost.closed_forms  # noqa: F401
        return _sum_by_ring(comm, x)

    def check(program, case, backend="sim"):
        failure = grader.check(program, case, backend)
        case.info["seen"] = True
        return failure

    keeps = types.SimpleNamespace(cases=grader.cases, check=check)
    assert grade_cases("ring_allreduce", keeps, _sum_by_ring, seed=0, runner=ringlab.run).passed
    assert ringlab.grade("ring_allreduce", imports, seed=0, log=False).passed
    assert ringlab.grade("ring_allreduce", _sum_by_ring, seed=0, log=False).passed


def test_case_print_sees_nan_as_itself_and_private_attributes_not():
    class Task:
        def __init__(self):
            self.times, self._scratch = (0.1, 0.2), np.zeros(2)
    task = Task()
    case = Case(2, [np.array([np.nan, 1.0])] * 2, "c", info={"task": task})
    before = checks.case_print(case)
    task._scratch[:] = 5.0
    assert checks.case_changed(before, case) is None
    task.times = (0.01, 0.02)
    assert checks.case_changed(before, case) == "case.info['task'].times"


def test_cases_are_fingerprinted_only_where_the_program_shares_the_process(monkeypatch):
    """``case_print`` copies every array of a case (a ZeRO case's are megabytes).
    Ranks in processes of their own (``ringlab grade``'s runner says so) cannot
    reach the case, so a grade there takes no fingerprint; in one process every
    case is fingerprinted before its run and checked after."""
    from ringlab.backends.isolated import runner
    from ringlab.grading.kit import running
    taken = []
    real = checks.case_print
    monkeypatch.setattr(checks, "case_print", lambda case: taken.append(case) or real(case))
    monkeypatch.setattr(running, "case_print", checks.case_print)
    two = types.SimpleNamespace(check=grader.check,
                                cases=lambda rng: list(grader.cases(rng))[:2])
    report = grade_cases("ring_allreduce", two, _zeros_the_other_cases, seed=0,
                         runner=ringlab.run)
    assert report.failure.check == CASE and report.cases_passed == 1 and len(taken) >= 4, str(report)
    assert runner().isolated is True

    def apart(program, inputs, **kw):       # stands for runner(): marked, run here
        return ringlab.run(program, inputs, **kw)
    apart.isolated = True
    taken.clear()
    report = grade_cases("ring_allreduce", two, _sum_by_ring, seed=0, runner=apart)
    assert report.passed and report.cases_passed == 2 and taken == [], str(report)
