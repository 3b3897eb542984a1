"""What a grader's driver uses inside the ranks.

Most graders run the learner's function inside a *driver*, a program of the
grader's that sets a case up on every rank, calls the learner's function and
returns what the checks read (``_train(comm, ..., learner)``). Under
``ringlab grade`` the driver runs in the rank's own process, and the learner's
function arrives there as cloudpickle bytes (a ``Submission``).

    >>> problem_text(problem("a wrong result"))
    'a wrong result'
"""

import numpy as np


def callable_learner(learner):
    """``learner``, or the function a ``Submission`` holds (loaded here, in the rank)."""
    from ...backends.isolated import Submission
    if isinstance(learner, Submission):
        import cloudpickle
        return cloudpickle.loads(learner.data)
    return learner


def problem(text):
    """What a driver returns instead of a result when the learner's function
    returned the wrong kind of thing: the words, as bytes (uint8)."""
    return [np.frombuffer(text.encode()[:2000], dtype=np.uint8).copy()]


def problem_text(out):
    """The words of ``problem``, or None if ``out`` is a result."""
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], np.ndarray) and out[0].size:
        return out[0].tobytes().decode(errors="replace")
    return None
