"""Graders of Part 4, pipeline parallelism.

* ``one_f_one_b``: one rank's 1F1B action list, graded by the validator, the
  microbatches it holds at once and the bubble of the ideal timeline;
* ``pipeline_stage``: the stage program that runs a schedule with send/recv,
  graded on its gradients and on every message it sends.

Both run the learner's function inside the ranks (a driver per exercise), so
``ringlab grade`` runs it in processes of its own, like every other exercise.
"""


def problem(text):
    """What a driver returns instead of a result when the learner's function
    returned the wrong kind of thing: the words, as bytes (uint8)."""
    import numpy as np
    return [np.frombuffer(text.encode()[:2000], dtype=np.uint8).copy()]


def problem_text(out):
    """The words of ``problem``, or None if ``out`` is a result."""
    import numpy as np
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], np.ndarray) and out[0].size:
        return out[0].tobytes().decode(errors="replace")
    return None
