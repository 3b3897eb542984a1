"""Graders of Part 2, data parallelism.

Their drivers wrap the learner's function (``_train(comm, ..., learner)``), so
under ``ringlab grade`` (one process per rank) the learner arrives as a
``Submission``, cloudpickle bytes: ``callable_learner`` loads it in the rank's
own process, never in the grader's.
"""


def callable_learner(learner):
    """``learner``, or the function a ``Submission`` holds (loaded here, in the rank)."""
    from ...isolated import Submission
    if isinstance(learner, Submission):
        import cloudpickle
        return cloudpickle.loads(learner.data)
    return learner
