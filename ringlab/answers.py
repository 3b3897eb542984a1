"""Which of ringlab's functions answer an exercise: one registry, one decorator.

The library is the book's reference code, so it holds the answers to the
exercises (``ringlab.collectives.ring_allreduce`` *is* exercise
``ring_allreduce``'s answer) next to helpers a learner may use freely
(``ringlab.zero.sharding.padded_size``). Each answer says so where it is
defined::

    @answer("ring_allreduce")
    def ring_allreduce(comm, x, out=None): ...

and ``ringlab grade`` fails a submission that calls an answer of the exercise
it is for, or of any exercise its grader does not build on (a grader's
``USES``: Part 2's exercises may call Part 1's collectives), naming the answer.
Everything not marked is a helper.

    >>> from ringlab.collectives import ring_allreduce
    >>> "ring_allreduce" in answers_of(ring_allreduce)
    True
"""

from __future__ import annotations

_REGISTRY = {}          # exercise id -> [functions that answer it], in definition order


def answer(*exercise_ids):
    """Mark the decorated function (or method) as an answer to ``exercise_ids``."""
    def mark(fn):
        fn.__ringlab_answers__ = tuple(exercise_ids)
        for exercise in exercise_ids:
            _REGISTRY.setdefault(exercise, []).append(fn)
        return fn
    return mark


def answers_of(fn):
    """The exercise ids ``fn`` answers (empty for a helper)."""
    return getattr(fn, "__ringlab_answers__", ())


def registry():
    """``{exercise id: [functions]}`` of every answer marked so far: those of the
    modules imported (whoever relies on it being whole imports them first, as
    ``ringlab.grading.trusted`` does; a grader module may hold answers of its
    own, for its diagnoses)."""
    return {k: list(v) for k, v in _REGISTRY.items()}


def name_of(fn):
    """``module:qualname``, how a rank process finds the function again."""
    return f"{fn.__module__}:{fn.__qualname__}"


def forbidden(exercise, uses=()):
    """The answers a submission for ``exercise`` may not call, in ``name_of``
    form: every answer but those of the exercises in ``uses`` (its own is always
    forbidden; so is a function that also answers an exercise not in ``uses``)."""
    return sorted({name_of(fn) for e, fns in registry().items()
                   if e not in uses or e == exercise for fn in fns})
