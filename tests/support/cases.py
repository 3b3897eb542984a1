"""A grader's hidden cases, made once per test module instead of once per grade.

``ringlab.grade(exercise, program, seed=0)`` calls the grader's ``cases(rng)``
with a fresh ``np.random.default_rng(0)`` every time, and the ZeRO graders' cases
train the reference model (a 1.4-million-parameter one among them): 0.3 to 1 s of
CPU per grade, the same every time for the same seed. ``made_once`` wraps a
grader module's ``cases`` so that for a generator state it has met (or was
warmed with) it returns a deep copy of the cases the grader's own ``cases`` made
then: the same cases, bit for bit, and no grade can change another's. It warms
the given seeds here, in the test process, so that the process each grade forks
(``kit/apart.py``) finds them too. Any other generator state goes to the real
``cases``.
"""

import contextlib
import copy
import importlib

import numpy as np

from ringlab.grading import GRADERS


@contextlib.contextmanager
def made_once(exercises, seeds=(0,)):
    made = {}
    with contextlib.ExitStack() as stack:
        for exercise in exercises:
            grader = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
            real = grader.cases

            def cases(rng, real=real):
                key = (real, repr(rng.bit_generator.state))
                if key not in made:
                    made[key] = list(real(rng))
                return iter(copy.deepcopy(made[key]))
            cases.real = real         # the grader's own, for a test that must bypass the store
            for seed in seeds:
                cases(np.random.default_rng(seed))
            stack.enter_context(_patched(grader, "cases", cases))
        yield


@contextlib.contextmanager
def _patched(owner, name, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)
