"""Part 4, pipeline parallelism: schedules as data, a validator, stages exchanging
activations and gradients.

* ``actions``: ``Action`` (F, B, W of a microbatch on a stage), ``parse``, what
  each action needs from and sends to its neighbouring stages.
* ``schedules``: GPipe, 1F1B, interleaved 1F1B and ZB-H1, per rank and whole.
* ``validate``: the first violation of a schedule in plain words (order,
  missing inputs, deadlock, memory), microbatches in flight, the ideal timeline
  and its bubble.
* ``stages``: ``split_model``, the stage program ``pipeline_stage``,
  ``run_pipeline`` (every rank, on the simulator or real processes) and
  ``unpipelined``, what any schedule must compute, computed in one process.
* ``bubble``: the bubble, peak activations and message counts, measured from a
  trace and in closed form.
* ``ownership``: who holds which layers, the batch and the activations, from
  the stage split, for the chapters' pictures (``ringlab.show.ownership``).
"""

from .actions import Action, format_schedule, needs, parse, sends, stage_rank
from .schedules import gpipe, gpipe_stage, interleaved_1f1b, interleaved_1f1b_rank, one_f_one_b, one_f_one_b_stage, zb_h1, zb_h1_stage
from .validate import ScheduleError, Slot, Violation, bubble_fraction, bubble_ratio, check, format_timeline, idle_time, in_flight, makespan, peak_in_flight, picture, timeline, validate
from .stages import PipelineResult, pipeline_stage, run_pipeline, split_model

__all__ = [
    "Action", "format_schedule", "needs", "parse", "sends", "stage_rank",
    "gpipe", "gpipe_stage", "interleaved_1f1b", "interleaved_1f1b_rank",
    "one_f_one_b", "one_f_one_b_stage", "zb_h1", "zb_h1_stage",
    "ScheduleError", "Slot", "Violation", "bubble_fraction", "bubble_ratio", "check",
    "format_timeline", "idle_time", "in_flight", "makespan", "peak_in_flight", "picture",
    "timeline", "validate",
    "PipelineResult", "pipeline_stage", "run_pipeline", "split_model",
]
