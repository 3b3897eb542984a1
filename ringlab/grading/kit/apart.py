"""The self-check in a process of its own, so that a grade always ends.

``ringlab.grade`` runs the learner's program in the learner's own process,
and the simulator's watchdog stops a program that runs too long by raising an
exception in it. Python can raise it only between two bytecodes: a loop
inside one C call (``sum(itertools.count())``, a regular expression that
backtracks for ever) never gets there, and would hang the notebook's kernel.
So the self-check forks: the grade runs in a child process, which tells the
parent, before every run of the program, how long that run may take; the
parent kills a child that goes silent for longer and reports where it was.
A child that dies (a crash in C code) is a failed grade too, never a dead kernel.

Where ``os.fork`` does not exist, the grade runs in this process.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import pickle
import select
import struct
import traceback

from ...sim.budget import Budget

GRACE = 5.0           # CPU seconds past a run's time limit before the child is killed
START = 60.0          # seconds the child may take before its first run

_PIPE = [None]        # in the child: the write end of its pipe to the parent


def beat(timeout, where=None):
    """In the child: tell the parent that a run starts that may take ``timeout``
    seconds (None: no limit); ``where``: what the parent should say if it hangs
    (the case; kept until the next one)."""
    fd = _PIPE[0]
    if fd is not None:
        _send(fd, ("beat", where, timeout))


def run_apart(grade, timed_out, died):
    """``grade()`` in a child process; its result (picklable). ``timed_out(where,
    seconds)`` and ``died(where, why)`` make the result when the child had to
    be killed or ended without one (``where``: the last ``beat``'s)."""
    if not hasattr(os, "fork"):
        return grade()
    read, write = os.pipe()
    # Objects the collector would visit in the child are copied there page by
    # page (it writes to them): frozen, it leaves them alone, and the fork is cheap.
    gc.freeze()
    try:
        pid = os.fork()
    finally:
        if pid != 0:
            gc.unfreeze()
    if pid == 0:                                   # the child
        os.close(read)
        faulthandler.disable()                     # a crash is reported by the parent
        _guard_the_ranks()
        _PIPE[0] = write
        code = 0
        try:
            _send(write, ("result", grade()))
        except BaseException:  # noqa: BLE001 - the parent reports it
            code = 1
            _send(write, ("error", traceback.format_exc()[-4000:]))
        finally:
            os._exit(code)                         # nothing of the parent's runs twice
    os.close(write)
    try:
        return _wait(pid, read, timed_out, died)
    finally:
        os.close(read)


def _wait(pid, read, timed_out, died):
    # The child's time counts in CPU seconds, as its watchdog's do (see sim/budget.py):
    # on a busy machine a right program is not killed for waiting for a core.
    label, limit, budget = None, None, Budget(START, pid)
    buffer = b""
    while True:
        left = None if budget is None else budget.left()
        ready, _, _ = select.select([read], [], [], None if left is None else min(left, 1.0))
        if not ready:
            if not budget.over():
                continue
            _kill(pid)
            return timed_out(label, limit)
        chunk = os.read(read, 1 << 16)
        if not chunk:
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                number = os.WTERMSIG(status)
                why = f"it was killed by signal {number}" + {
                    11: " (a segmentation fault: a crash in C code, ctypes?)",
                    9: " (out of memory?)", 6: " (an abort in C code)"}.get(number, "")
            else:
                why = f"it ended with exit code {os.WEXITSTATUS(status)}"
            return died(label, f"the process running the program ended without a result: {why}")
        buffer += chunk
        while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack("<I", buffer[:4])[0]:
            size = struct.unpack("<I", buffer[:4])[0]
            message, buffer = pickle.loads(buffer[4:4 + size]), buffer[4 + size:]
            if message[0] == "beat":
                _, what, limit = message
                label = what if what is not None else label
                budget = None if limit is None else Budget(limit + GRACE, pid)
            else:
                os.waitpid(pid, 0)
                if message[0] == "result":
                    return message[1]
                last = message[1].strip().splitlines()[-1:] or ["?"]
                return died(label, f"the grader could not go on with this case ({last[0]}): "
                                   f"did the program change Python, numpy or ringlab while it "
                                   f"ran (a function replaced, a builtin patched)?")


class NotAllowed(Exception):
    """What the program did is no way between ranks (see ``_guard_the_ranks``)."""


def _guard_the_ranks():
    """In the child only: the ranks' code may do nothing that ``ringlab grade``'s
    rank processes may not (write a file, open a socket, ...), so that the self-check
    gives the verdict the instructor's grade will. An audit hook, for the code of
    the simulator's ranks only (their greenlets), never the grader's."""
    import sys
    import greenlet
    from ...backends.isolated.sandbox import way_between_ranks
    sys.dont_write_bytecode = True

    def hook(event, args):
        if greenlet.getcurrent().parent is None:     # the grader's own code
            return
        why = way_between_ranks(event, args)
        if why:
            raise NotAllowed(why)
    sys.addaudithook(hook)


def _send(fd, message):
    data = pickle.dumps(message)
    data = struct.pack("<I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _kill(pid):
    import signal
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
