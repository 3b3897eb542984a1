"""The simulator: ``run`` a program on N simulated ranks (see ``world.py``).

    >>> import numpy as np
    >>> from ringlab.sim import run
    >>> from ringlab.collectives import ring_allreduce
    >>> run(ring_allreduce, [np.ones(3)] * 4).trace.steps
    6
"""

from ..result import RunResult
from ..errors import DeadlockError, ProgramTimeout, RankError, UnreceivedMessagesError
from .watchdog import Interrupt, Watchdog, no_exit, program_traceback
from .world import MODES, Request, Work, World


def run(program, inputs, *, args=(), kwargs=None, mode="buffered", timeout=10.0,
        check_unreceived=True, record_payloads=False, network=None):
    """``ringlab.run`` on the simulator; the arguments are ``ringlab.run``'s."""
    inputs = list(inputs)
    if not inputs:
        raise ValueError("run() needs one input per rank; got an empty list (world_size 0)")
    world = World(len(inputs), mode, record_payloads, network)
    try:
        with Watchdog(timeout, world.give_up), no_exit():
            try:
                world.run(program, inputs, args, kwargs or {})
            except Interrupt as e:      # landed in the scheduler, between ranks
                world.failure = ("timeout", world.current, e)
            finally:
                world.kill_unfinished()
    except Interrupt as e:              # landed while cleaning up
        world.failure = world.failure or ("timeout", None, e)

    try:
        actors = world.all_actors()
        trace = world.trace()
        left = trace.unreceived
        if world.failure is not None:
            kind, me, exc = world.failure
            if kind == "timeout" or isinstance(exc, Interrupt):
                where = program_traceback(exc) if me is not None else ""
                raise ProgramTimeout(timeout, me.rank if me else None, me.clock if me else None,
                                     where) from None
            raise RankError(me.rank, me.clock, exc, program_traceback(exc), trace) from exc

        unfinished = [me for me in actors if not me.finished]
        if unfinished or world.any_waiters:
            raise DeadlockError(world.waits(), [me.rank for me in world.actors if me.finished], trace)

        if left and check_unreceived:
            raise UnreceivedMessagesError(trace.unreceived)
        return RunResult([me.result for me in world.actors], trace, world.payloads, trace.time,
                         world.handed)
    finally:
        world.release()     # no cycles left: the run's arrays go as soon as the caller drops them


__all__ = ["run", "MODES", "Request", "Work"]
