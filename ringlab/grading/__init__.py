"""Graders: run a learner's program on many worlds and check result *and* trace.

    >>> import ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> print(ringlab.grade("ring_allreduce", ring_allreduce, seed=1))
    ring_allreduce results: All test cases passed! (18 cases, world sizes 1-8)

Each exercise id has a grader module, in its part's folder here
(``collectives/ring_allreduce.py``); the graders' shared kit is ``kit/``. A
grader module defines ``cases(rng)``, yielding the worlds to run, and
``check(program, case, backend)``, which returns None or a ``Failure``; see
``kit/report.py``.
"""

import importlib
import json
import os
import pkgutil

from . import kit
from .kit.report import Failure, Report
from .kit.language import language
from .kit.loop import grade_cases


def _graders():
    """``{exercise id: grader module}``, the module relative to this package: every
    module of a part's folder here (``collectives/``, ``zero/``, ...) whose name
    does not start with ``_`` grades the exercise it is named after."""
    found = {}
    for part in pkgutil.iter_modules(__path__):
        if part.ispkg and part.name != kit.__name__.rpartition(".")[2]:
            folder = os.path.join(os.path.dirname(__file__), part.name)
            for module in pkgutil.iter_modules([folder]):
                if not module.ispkg and not module.name.startswith("_"):
                    found[module.name] = f"{part.name}.{module.name}"
    return found


# exercise id -> module in ringlab.grading that defines cases(rng) and check(program, case, backend)
GRADERS = _graders()


def grade(exercise_id, program, *, seed=None, backend="sim", log=True, lang=None):
    """Grade ``program`` for ``exercise_id``; returns a ``Report``.

    ``seed`` fixes the random data (every report names the seed it used, so a
    failure can be reproduced). ``backend="torch"`` runs on real processes.
    ``log=False``: a report that only shows something (a buggy program's, in
    an exercise notebook), not the notebook's grade: ``ringlab grade NOTEBOOK``
    does not count it. ``lang="zh"``: the report in Chinese (default: the
    environment's ``RINGLAB_LANG``, else English; ``kit/language.py``).
    """
    lang = language(lang)
    if exercise_id not in GRADERS:
        raise ValueError(f"unknown exercise {exercise_id!r}; known: {', '.join(sorted(GRADERS))}")
    module = importlib.import_module(f".{GRADERS[exercise_id]}", __name__)
    report = grade_cases(exercise_id, module, program, seed=seed, backend=backend)
    report.lang = lang
    path = os.environ.get("RINGLAB_GRADE_LOG")
    if log and path:   # `ringlab grade NOTEBOOK` collects the reports of a notebook run this way
        with open(path, "a") as f:
            f.write(json.dumps({"exercise": exercise_id, "passed": report.passed,
                                "not_implemented": report.not_implemented, "seed": report.seed,
                                "cases_passed": report.cases_passed, "cases_total": report.cases_total,
                                "check": report.failure.check if report.failure else None,
                                "text": str(report)}) + "\n")
    return report


__all__ = ["grade", "Report", "Failure", "GRADERS"]
