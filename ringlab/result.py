"""What a run returns: ``RunResult``, the same from every backend.

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> res = ringlab.run(ring_allreduce, [np.ones(2)] * 3)
    >>> res.outputs[0], res.steps, res.world_size
    (array([3., 3.]), 4, 3)
"""

from __future__ import annotations

from dataclasses import dataclass

from .trace import VIEWS, Trace, payload_key


@dataclass
class RunResult:
    """What ``run`` returns: per-rank ``outputs`` (in rank order), the ``trace``,
    and ``time``, the simulated makespan in seconds (0 without compute or network)."""

    outputs: list
    trace: Trace
    payloads: dict | None = None   # payload_key(event) -> array, if record_payloads
    time: float = 0.0
    # With record_payloads, in the simulator: (event, the array its receiver got),
    # each receiver's own copy, to tell what a receiver changed in place.
    handed: list | None = None
    # Isolated runs (trusted grading): each rank process's resident memory, read
    # by the grader from outside it: per rank {"before": before the program was
    # loaded there, "loaded": after, "peak": the most at any of its calls,
    # "hwm": the kernel's peak}, and ``resident_at``: payload_key(event) -> the
    # sender's resident bytes when it asked to send it.
    resident: list | None = None
    resident_at: dict | None = None

    def payload(self, event):
        """The array message ``event`` carried (the run must have had ``record_payloads=True``)."""
        return self.payloads[payload_key(event)]

    def show(self, inputs=None, **options):
        """The trace player. Given the run's ``inputs`` (and ``record_payloads=True``),
        it shows what each message really carried, even without chunk=/op= labels;
        see ``ringlab.show.player``."""
        if inputs is None:
            return self.trace.show(**options)
        return VIEWS["run_player"](self, inputs, **options)

    @property
    def world_size(self):
        return self.trace.world_size

    @property
    def steps(self):
        return self.trace.steps
