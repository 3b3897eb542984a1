"""The pipeline bubble, the activations a stage holds, and the messages: in
closed form, and measured from a run's trace.

The bubble is the time a rank sits idle while the pipeline fills and drains.
Two conventions are in use, and they differ:

* idle time relative to the ideal compute time (each rank's busy time), as
  Narayanan et al. (2021, sec. 2.2.1, "bubble time fraction" t_pb / t_id)
  state it: ``(p - 1) / m``;
* idle time as a fraction of the total time, as GPipe (Huang et al. 2019,
  sec. 2.3: the bubble is "O((K - 1)/(M + K - 1))" of the time, K
  partitions, M micro-batches) states it: ``(p - 1) / (m + p - 1)``.

With ``b`` the first, the second is ``b / (1 + b)``. Closed forms (the first
convention, ``p`` ranks, ``m`` microbatches):

* GPipe and 1F1B (Narayanan et al. 2021, sec. 2.2.1): ``(p - 1) / m``,
  whatever ``t_f`` and ``t_b``;
* interleaved 1F1B with ``v`` stages per rank (Narayanan et al. 2021, sec.
  2.2.2): ``(p - 1) / (v m)``;
* ZB-H1 (Qi et al. 2023, sec. 3): idle ``(p - 1)(t_f + t_b - t_w)`` against
  ``m (t_f + t_b + t_w)``: ``(p - 1) / (3 m)`` when ``t_f = t_b = t_w``.

    >>> bubble_closed_form("one_f_one_b", p=4, m=8), of_total(bubble_closed_form("gpipe", 4, 8))
    (Fraction(3, 8), Fraction(3, 11))
    >>> bubble_closed_form("interleaved_1f1b", 4, 8, v=2), bubble_closed_form("zb_h1", 4, 8)
    (Fraction(3, 16), Fraction(1, 8))

Activations held (Narayanan et al. 2021, sec. 2.2.1): GPipe's stages keep all
``m`` microbatches' activations until the backward starts; 1F1B's rank ``r``
keeps at most ``p - r`` (it starts ``p - r - 1`` forwards ahead). Messages:
every microbatch crosses each of the ``v p - 1`` stage boundaries once forward
(activation) and once back (gradient): ``2 m (v p - 1)``, which is about ``v``
times the ``2 m (p - 1)`` of one stage per rank (Narayanan et al.: "the amount
of communication also increases by v").
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .actions import parse

BUBBLES = {
    "gpipe": lambda p, m, v: Fraction(p - 1, m),
    "one_f_one_b": lambda p, m, v: Fraction(p - 1, m),
    "interleaved_1f1b": lambda p, m, v: Fraction(p - 1, v * m),
    "zb_h1": lambda p, m, v: Fraction(p - 1, 3 * m),     # t_f = t_b = t_w
}


def bubble_closed_form(schedule, p, m, v=1):
    """Idle time / ideal compute time of ``schedule`` ("gpipe", "one_f_one_b",
    "interleaved_1f1b", "zb_h1"), as an exact fraction (see the module's sources)."""
    if schedule not in BUBBLES:
        raise ValueError(f"no closed form for {schedule!r}; known: {', '.join(BUBBLES)}")
    return BUBBLES[schedule](p, m, v)


def of_total(bubble):
    """Idle / ideal compute -> idle / total time: ``b / (1 + b)``."""
    return bubble / (1 + bubble)


def peak_held_closed_form(schedule, p, m, rank, v=1):
    """Most microbatch states (activations kept for a backward) rank ``rank``
    holds at once: ``m`` (GPipe), ``min(m, p - rank)`` (1F1B); interleaved,
    counting each of the ``v`` chunks' states (each 1/v of a stage's), Megatron-LM's
    warm-up ``2 (p - rank - 1) + (v - 1) p`` forwards plus one
    (``megatron/core/pipeline_parallel/schedules.py``); ZB-H1, a state kept
    until its W, ``min(m, p)`` on every rank: its largest is 1F1B's (Qi et al.
    2023: ZB-H1's peak memory is 1F1B's)."""
    if schedule == "gpipe":
        return m
    if schedule == "one_f_one_b":
        return min(m, p - rank)
    if schedule == "interleaved_1f1b":
        return min(v * m, 2 * (p - rank - 1) + (v - 1) * p + 1)
    if schedule == "zb_h1":
        return min(m, p)
    raise ValueError(f"no closed form for the activations of {schedule!r}")


def messages_closed_form(p, m, v=1):
    """Activations plus gradients sent: ``2 m (v p - 1)``."""
    return 2 * m * (v * p - 1)


@dataclass
class PipelineStats:
    """What a pipeline run's trace shows, per rank: ``busy`` and ``idle`` seconds
    (idle = makespan - busy), ``bubble`` (idle / busy) and ``bubble_of_total``
    (idle / makespan) as exact fractions of the float times, ``peak_held``
    (most microbatch states held after any action); and ``makespan``,
    ``activations`` and ``gradients`` (messages sent)."""

    makespan: float
    busy: list
    idle: list
    bubble: list
    bubble_of_total: list
    peak_held: list
    activations: int
    gradients: int

    @property
    def messages(self):
        return self.activations + self.gradients


def measure(trace):
    """``PipelineStats`` of the trace of ``run_pipeline`` (its compute events carry
    ``kind``, ``mb``, ``stage`` and ``held``; each message the action that sent it)."""
    p = trace.world_size
    computes = [c for c in trace.computes if c.get("kind") is not None]
    makespan = max(c.end for c in computes)
    busy = [sum(c.duration for c in computes if c.rank == r) for r in range(p)]
    idle = [makespan - b for b in busy]
    kinds = [parse(e.span.rsplit("/", 1)[-1])[0].kind for e in trace]
    return PipelineStats(
        makespan, busy, idle,
        [Fraction(i) / Fraction(b) for i, b in zip(idle, busy)],
        [Fraction(i) / Fraction(makespan) for i in idle],
        [max(c.get("held") for c in computes if c.rank == r) for r in range(p)],
        kinds.count("F"), kinds.count("B"))
