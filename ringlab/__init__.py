"""ringlab: how distributed training communicates, one traced message at a time.

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> res = ringlab.run(ring_allreduce, [np.arange(4.0) * (r + 1) for r in range(4)])
    >>> res.outputs[0]
    array([ 0., 10., 20., 30.])
    >>> res.trace.steps          # 2 * (world_size - 1)
    6
"""

from .errors import CommError, DeadlockError, ProgramTimeout, RankError, RinglabError, UnreceivedMessagesError
from .trace import Compute, Event, Span, Trace
from .comm import Comm, collective
from .result import RunResult
from .cost.alpha_beta import AlphaBeta
from .mesh import DeviceMesh
from .runner import run
from .sim import Request, Work
from .grading import grade
from .tryout import try_run
from .show import player as _player, timeline as _timeline  # noqa: F401 - the trace's views

__all__ = [
    "run", "grade", "try_run", "collective", "Comm", "Request", "Work", "RunResult", "Trace",
    "Event", "Span", "Compute", "AlphaBeta", "DeviceMesh",
    "RinglabError", "CommError", "RankError", "DeadlockError", "ProgramTimeout",
    "UnreceivedMessagesError",
]
__version__ = "0.1.0"
