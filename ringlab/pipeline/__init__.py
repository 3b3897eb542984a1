"""Part 4, pipeline parallelism: schedules as data, a validator, stages exchanging
activations and gradients.

* ``actions``: ``Action`` (F, B, W of a microbatch on a stage), ``parse``, what
  each action needs from and sends to its neighbouring stages.
* ``stages``: ``split_model``, the stage program ``pipeline_stage`` and
  ``run_pipeline`` (every rank, on the simulator or real processes).
* ``bubble``: the bubble, peak activations and message counts, measured from a
  trace and in closed form.
"""

from .actions import Action, format_schedule, needs, parse, sends, stage_rank
from .stages import PipelineResult, pipeline_stage, run_pipeline, split_model

__all__ = ["Action", "format_schedule", "needs", "parse", "sends", "stage_rank",
           "PipelineResult", "pipeline_stage", "run_pipeline", "split_model"]
