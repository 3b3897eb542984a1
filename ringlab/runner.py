"""``ringlab.run``: where a program runs, the simulator or real processes.

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> ringlab.run(ring_allreduce, [np.ones(2)] * 3).outputs[0]
    array([3., 3.])
"""

from . import backends
from .sim import run as simulate


def run(program, inputs, *, args=(), kwargs=None, mode="buffered", timeout=10.0,
        check_unreceived=True, record_payloads=False, network=None, backend="sim"):
    """Run ``program(comm, inputs[r], *args, **kwargs)`` on every rank r.

    Returns a ``RunResult`` with ``.outputs`` (rank order), ``.trace`` and
    ``.time`` (simulated seconds).

    ``mode="buffered"`` (default): a send completes at once (the payload is
    copied). ``mode="rendezvous"``: a send waits until its receive is posted,
    which shows why "everyone sends, then everyone receives" deadlocks.
    ``network=`` (e.g. ``ringlab.AlphaBeta(alpha, beta)``) prices every message
    in simulated seconds. ``timeout`` (seconds, or None) stops a program that
    never finishes. ``backend="torch"`` runs one real process per rank.

    Raises ``RankError``, ``DeadlockError``, ``ProgramTimeout`` or
    ``UnreceivedMessagesError`` with a diagnosis instead of hanging; a
    ``RankError`` or ``DeadlockError`` carries the trace so far as ``.trace``.
    """
    if backend == "sim":
        return simulate(program, inputs, args=args, kwargs=kwargs, mode=mode, timeout=timeout,
                       check_unreceived=check_unreceived, record_payloads=record_payloads,
                       network=network)
    return backends.run(backend, program, inputs, args=args, kwargs=kwargs, timeout=timeout,
                        check_unreceived=check_unreceived, record_payloads=record_payloads)
