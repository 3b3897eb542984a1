"""Part 4, pipeline parallelism: schedules as data, a validator, stages exchanging
activations and gradients.

* ``actions``: ``Action`` (F, B, W of a microbatch on a stage), ``parse``, what
  each action needs from and sends to its neighbouring stages.
"""

from .actions import Action, format_schedule, needs, parse, sends, stage_rank

__all__ = ["Action", "format_schedule", "needs", "parse", "sends", "stage_rank"]
