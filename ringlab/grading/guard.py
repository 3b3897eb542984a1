"""Keep the grader's record of every message as it was sent.

The simulator records a copy of each payload (``record_payloads=True``), but
it hands that same array to the receiver. A program that then changes what it
received in place (``got += mine``, or ``got[:] = 0`` to hide what arrived)
would change the grader's record too: the grader would blame the sender for
the receiver's addition, or check a scrubbed message.

``guarded(program)`` runs ``program`` with a ``Guard`` in place of ``comm``:
the same object for the program, except that every array it receives is its
own copy. The guard remembers each (message, array handed out) pair, so a
grader can also tell which receiver changed an array in place.
"""

from __future__ import annotations

import functools

import numpy as np


class Guard:
    """A ``Comm`` whose receives hand out copies; everything else is passed on."""

    def __init__(self, comm, handed):
        self._comm, self._handed = comm, handed

    def __getattr__(self, name):          # rank, world_size, send, isend, span, barrier, ...
        return getattr(self._comm, name)

    def __repr__(self):
        return repr(self._comm)

    def _own(self, array, event, out):
        if out is not None or not isinstance(array, np.ndarray):
            return array                  # recv(out=buf) returns buf itself, as without the guard
        mine = array.copy()
        self._handed.append((event, mine))
        return mine

    def recv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        return self.irecv(src, out=out, shape=shape, dtype=dtype, tag=tag).wait()

    def irecv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        return _Request(self, self._comm.irecv(src, out=out, shape=shape, dtype=dtype, tag=tag), out)

    def sendrecv(self, array, dst, src, *, chunk=None, op=None, tag=0):
        req = self.isend(array, dst, chunk=chunk, op=op, tag=tag)
        got = self.recv(src, tag=tag)
        req.wait()
        return got

    def recv_any(self, *, tag=0):
        src, array = self._comm.recv_any(tag=tag)
        return src, self._own(array, None, None)

    def new_group(self, ranks, name=None):
        sub = self._comm.new_group(ranks, name)
        return None if sub is None else Guard(sub, self._handed)

    def split(self, color, key=0, name=None):
        sub = self._comm.split(color, key, name)
        return None if sub is None else Guard(sub, self._handed)


class _Request:
    def __init__(self, guard, req, out):
        self._guard, self._req, self._out = guard, req, out

    def __getattr__(self, name):
        return getattr(self._req, name)

    def wait(self):
        got = self._req.wait()
        return self._guard._own(got, getattr(self._req, "event", None), self._out)


def guarded(program, handed):
    """``program`` with its ``comm`` wrapped in a ``Guard``; the arrays handed
    out are appended to ``handed`` as (event, array) pairs."""
    @functools.wraps(program)
    def run_guarded(comm, *args, **kwargs):
        return program(Guard(comm, handed), *args, **kwargs)
    return run_guarded


def changed_in_place(result, handed):
    """The events whose received array the program changed afterwards, in trace
    order (needs the run's recorded payloads)."""
    if result.payloads is None:
        return []
    changed = [e for e, mine in handed if e is not None
               and not (mine.shape == result.payload(e).shape and np.array_equal(mine, result.payload(e)))]
    return sorted(changed, key=lambda e: (e.step, e.src))


def without_frames(text, fragment):
    """A traceback without the frames of files whose path contains ``fragment``
    (a grader's driver, the guard): the learner's code is theirs to read, ours not."""
    if not text:
        return text
    out, skip = [], False
    for line in str(text).splitlines(keepends=True):
        if line.startswith('  File "'):
            skip = fragment in line.replace("\\", "/")
        elif not line.startswith("    "):
            skip = False
        if not skip:
            out.append(line)
    return "".join(out)


def without_guard_frames(text):
    """A program traceback without the guard's own lines (the learner's code
    called ``comm.recv``; the guard is not theirs to read)."""
    return without_frames(text, __file__.replace("\\", "/"))
