"""Real memory, measured per rank: what a rank's own code allocates while it runs.

``comm.alloc`` records the memory a program *reports*; this measures what it
really allocates, for a learner who wants to see a peak drop (free a ZeRO-2
bucket as soon as its ReduceScatter is done) and for the graders, who cannot
believe a report: a program that holds the whole model (ZeRO) or the whole
sequence (ring attention) simply would not report it. ``tracemalloc`` sees
every allocation of Python objects and numpy arrays, but for the whole process,
and in ``ringlab.run`` all ranks share one process. The simulator, though, runs
one rank at a time and switches only inside communication calls. So
``MemoryProbe`` wraps a rank's ``comm``: each call ends a *segment* of that
rank's code, and the change in traced memory over the segment (and the peak
within it) is charged to that rank. What
happens inside the calls (the simulator's copies, other ranks' segments) is
charged to no one. An array a call hands over (a received message) is
copied by the probe and charged to the receiver, since the receiver holds it
from then on. Under ``ringlab grade`` (one process per rank) the same
accounting runs in each rank's process.

``Ledger.step_begin()`` / ``step_end()`` bracket one training step and give
``(peak, kept)``: the most bytes the rank held above what it held when the
step began, and what it still holds after it (a cache, a full copy kept for
the next step). The numbers include Python's own small objects: graders
compare them with bounds that leave room for those.

    >>> import numpy as np, ringlab, tracemalloc
    >>> def step(comm, x):
    ...     ledger = Ledger()
    ...     probe = MemoryProbe(comm, ledger)
    ...     ledger.step_begin()
    ...     big = np.zeros(100_000)               # 800 kB, then freed
    ...     del big
    ...     kept = probe.sendrecv(x, 1 - comm.rank, 1 - comm.rank)   # 80 kB kept
    ...     peak, held = ledger.step_end()
    ...     return np.array([peak, held])
    >>> res = ringlab.run(step, [np.ones(10_000)] * 2)
    >>> tracemalloc.stop()
    >>> [(int(p) // 1000, int(k) // 1000) for p, k in res.outputs]
    [(800, 80), (800, 80)]
"""

import functools
import tracemalloc

import numpy as np


class Ledger:
    """One rank's account of the bytes its code holds (see the module's docstring)."""

    def __init__(self, floor=None):
        if not tracemalloc.is_tracing():
            tracemalloc.start()
        self.held = self.peak = 0
        self.mark = None            # traced memory when this rank's current segment began
        self.stopped = False        # tracing was switched off while the rank ran
        # A rank can free only what it holds: held far below zero means the traces
        # were cleared (tracemalloc.clear_traces, stop and start) under the probe.
        self.floor, self.tampered = floor, False
        self.sentinel = None

    def resume(self):
        """This rank's code runs again (a call returned)."""
        if not tracemalloc.is_tracing():
            self.stopped = True
            return
        tracemalloc.reset_peak()
        self.mark = tracemalloc.get_traced_memory()[0]
        # A fresh object whose trace must still exist when the segment ends:
        # clear_traces() (or stop and start) erases it, and the count with it.
        self.sentinel = bytearray(8)

    def pause(self):
        """This rank's code stops (it enters a call, or the step ends)."""
        if self.mark is None:
            return
        if not tracemalloc.is_tracing():
            self.stopped, self.mark = True, None
            return
        if tracemalloc.get_object_traceback(self.sentinel) is None:
            self.tampered = "tracemalloc's traces were cleared (or tracing stopped and restarted)"
        now, peak = tracemalloc.get_traced_memory()
        self.peak = max(self.peak, self.held + peak - self.mark, self.held + now - self.mark)
        self.held += now - self.mark
        self.mark = None
        if self.floor is not None and self.held < self.floor:
            self.tampered = "the rank's traced memory fell by more than it could have freed"

    def charge(self, nbytes):
        """Bytes handed to the rank by a call (made while no one was charged)."""
        self.held += int(nbytes)
        self.peak = max(self.peak, self.held)

    def step_begin(self):
        self.held = self.peak = 0
        self.resume()

    def step_end(self):
        """``(peak, kept)`` in bytes for the step that began at ``step_begin``."""
        self.pause()
        return self.peak, self.held


class MemoryProbe:
    """``comm`` as the rank's program sees it, charging memory to ``ledger``.
    Every callable attribute is a boundary; what it returns is wrapped (a
    request, a work, a sub-communicator) or, for a received array, copied."""

    def __init__(self, comm, ledger):
        object.__setattr__(self, "_comm", comm)
        object.__setattr__(self, "_ledger", ledger)

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr):
            return attr
        if name == "start":
            return self._start
        if name == "span":
            return attr                 # a context manager: no switch, nothing handed over
        return functools.partial(_call, self._ledger, attr)

    def __setattr__(self, name, value):
        setattr(self._comm, name, value)

    def __repr__(self):
        return repr(self._comm)

    def _start(self, fn, *args, **kwargs):
        ledger, box = self._ledger, [(args, kwargs)]

        @functools.wraps(fn)
        def work(comm):
            # A work runs when the simulator starts it: inside some call of this rank.
            # Its arguments and result travel in boxes the simulator keeps, emptied
            # here and in wait(): so they are freed in this rank's code, not in
            # the simulator's, where no one would be charged for the free.
            ledger.resume()
            try:
                a, kw = box.pop()
                result = [fn(MemoryProbe(comm, ledger), *a, **kw)]
                del a, kw
                return result
            finally:
                ledger.pause()
        ledger.pause()
        try:
            handle = self._comm.start(work)
        finally:
            ledger.resume()
        return _Work(handle, ledger)


class _Waitable:
    """A request: ``wait()`` is a boundary, and what it receives is adopted."""

    def __init__(self, inner, ledger, out=None):
        self._inner, self._ledger, self._out = inner, ledger, out

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name == "wait":
            return functools.partial(_call, self._ledger, attr, _out=self._out, _raw=True)
        if name == "is_completed":         # a poll lets others run too: a boundary
            return functools.partial(_call, self._ledger, attr, _raw=True, _adopt=False)
        return attr


class _Work(_Waitable):
    """A work: its result was made (and charged) by the work's own code."""

    def wait(self):
        if not hasattr(self, "_value"):
            box = _call(self._ledger, self._inner.wait, _raw=True, _adopt=False)
            self._value = box.pop() if isinstance(box, list) and box else None
        return self._value


def _call(ledger, fn, *args, _out=None, _raw=False, _adopt=True, **kwargs):
    # ``out=`` (recv into a buffer) is the call's own argument: passed on, never taken here.
    ledger.pause()
    try:
        got = fn(*args, **kwargs) if not _raw else fn()
        if _adopt:
            got = adopt(ledger, got, kwargs.get("out", _out))
    finally:
        ledger.resume()
    return got


def adopt(ledger, got, out):
    from .comm import Comm
    if isinstance(got, np.ndarray):
        if got is out:
            return got                          # recv(out=buf): the rank's own buffer
        mine = np.array(got, copy=True)         # charged to the receiver from now on
        ledger.charge(mine.nbytes)
        return mine
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], np.ndarray):
        return got[0], adopt(ledger, got[1], None)     # recv_any: (src, array)
    if got is None or isinstance(got, (int, float, str, bool)):
        return got
    if isinstance(got, Comm):
        return MemoryProbe(got, ledger)
    if hasattr(got, "wait"):
        return _Waitable(got, ledger, out)
    return got


def tampered(ledger):
    """Words for a measurement that cannot be trusted, or ''."""
    if ledger.stopped:
        return "tracemalloc was stopped"
    if ledger.tampered:
        return f"the grader's memory measurement was tampered with: {ledger.tampered}"
    return ""
