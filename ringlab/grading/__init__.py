"""Graders: run a learner's program on many worlds and check result *and* trace.

    >>> import ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> print(ringlab.grade("ring_allreduce", ring_allreduce, seed=1))
    ring_allreduce results: All test cases passed! (18 cases, world sizes 1-8)

Each exercise id maps to a grader module in this package. A grader module
defines ``cases(rng)``, yielding the worlds to run, and ``check(program, case,
backend)``, which returns None or a ``Failure``; see ``report.py``.
"""

import importlib
import json
import os

from .report import Failure, Report, grade_cases

# exercise id -> module in ringlab.grading that defines cases(rng) and check(program, case, backend)
GRADERS = {
    "ring_allreduce": "exercises.collectives.ring_allreduce",
    "ring_allgather": "exercises.collectives.ring_allgather",
    "ring_reduce_scatter": "exercises.collectives.ring_reduce_scatter",
    "tree_broadcast": "exercises.collectives.tree_broadcast",
    "binomial_broadcast": "exercises.collectives.binomial_broadcast",
    "alltoall": "exercises.collectives.alltoall",
    "ring_alltoall": "exercises.collectives.ring_alltoall",
    "fix_ring_allgather": "exercises.collectives.fix_ring_allgather",
    "hierarchical_allreduce": "exercises.collectives.hierarchical_allreduce",
    "sync_sgd_step": "exercises.data_parallel.sync_sgd_step",
    "bucketed_grad_sync": "exercises.data_parallel.bucketed_grad_sync",
    "async_ps": "exercises.data_parallel.async_ps",
    "column_parallel_linear": "exercises.tensor_parallel.column_parallel_linear",
    "row_parallel_linear": "exercises.tensor_parallel.row_parallel_linear",
    "megatron_mlp": "exercises.tensor_parallel.megatron_mlp",
    "tp_attention": "exercises.tensor_parallel.tp_attention",
    "one_f_one_b": "exercises.pipeline.one_f_one_b",
    "pipeline_stage": "exercises.pipeline.pipeline_stage",
    "zero1_step": "exercises.zero.zero1_step",
    "zero2_step": "exercises.zero.zero2_step",
    "zero3_step": "exercises.zero.zero3_step",
}


def grade(exercise_id, program, *, seed=None, backend="sim", log=True):
    """Grade ``program`` for ``exercise_id``; returns a ``Report``.

    ``seed`` fixes the random data (every report names the seed it used, so a
    failure can be reproduced). ``backend="torch"`` runs on real processes.
    ``log=False``: a report that only shows something (a buggy program's, in
    an exercise notebook), not the notebook's grade: ``ringlab grade NOTEBOOK``
    does not count it.
    """
    if exercise_id not in GRADERS:
        raise ValueError(f"unknown exercise {exercise_id!r}; known: {', '.join(sorted(GRADERS))}")
    module = importlib.import_module(f".{GRADERS[exercise_id]}", __name__)
    report = grade_cases(exercise_id, module, program, seed=seed, backend=backend)
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
