"""Graders of Part 4, pipeline parallelism.

* ``one_f_one_b``: one rank's 1F1B action list, graded by the validator, the
  microbatches it holds at once and the bubble of the ideal timeline;
* ``pipeline_stage``: the stage program that runs a schedule with send/recv,
  graded on its gradients and on every message it sends.

Both run the learner's function inside the ranks (a driver per exercise), so
``ringlab grade`` runs it in processes of its own, like every other exercise.
"""

