"""Isolated runs: every rank's program in a process of its own, for trusted grading.

``ringlab.run`` runs all ranks in one Python process. That is what makes it
fast and easy to debug, but a program that wants to cheat can then reach
everything: other ranks' inputs (through frames or ``gc``), module-level
state shared between ranks, the world's event list, numpy, the grader.
``run_isolated`` gives the same results (outputs, trace, payloads, errors),
but:

* each rank's program runs in its own process, forked from a clean
  "zygote" (``multiprocessing``'s forkserver) that has loaded numpy and
  ringlab and nothing of the grader: no inputs of other ranks, no expected
  results, no trace to rewrite;
* every communication call is a request over a pipe to this (the grading)
  process, which runs the real simulator (``ringlab.sim.world``). Each rank
  has an actor in it whose greenlet forwards its process's requests to a real
  ``Comm``, so matching, steps, trace, payloads and deadlock detection are
  the simulator's own, and the trace is the same, byte for byte;
* ``comm.start(fn, ...)`` works too: ``fn`` and its arguments never leave the
  rank's process. The grading process makes a real simulator work, whose
  actor, when the simulator starts it, tells the rank's process to run ``fn``
  on a thread of its own there and then serves that thread's calls as the
  program's. Messages on the pipe carry a stream id (0: the program; a work:
  its handle). A work's result stays in the rank's process: the grading
  process hears only that it is done;
* the program arrives as bytes (cloudpickle) and is unpickled *only inside the
  rank processes*: unpickling runs code. What comes back is decoded by
  ``wire.py`` (JSON and raw array bytes), never unpickled;
* limits: a wall-clock ``timeout`` (the processes are killed), ``memory_mb``
  of address space per rank; a process that crashes or calls ``os._exit``
  becomes a ``RankError`` that says so.

The scheduler still runs one actor at a time: when the simulator lets rank r
(or one of its works) go on, it answers that thread's pending request and
waits for its next one, while every other thread waits for its answer. So
runs stay reproducible, and a work's code and the program's touch shared
arrays in the same order as in ``ringlab.run``.
"""

from .server import (ISOLATED_SLOWDOWN, MARK, RankProcessDied, Submission, mark, run_isolated,
                     runner, start_forkserver)
from .rank import rebuild_exception

__all__ = ["run_isolated", "runner", "Submission", "mark", "MARK", "RankProcessDied",
           "rebuild_exception", "ISOLATED_SLOWDOWN", "start_forkserver"]
