"""Real memory, measured per rank: what a rank's own code allocates during a step.

The ZeRO graders cannot believe memory a program *reports* (``comm.alloc``):
a program that holds the whole model simply would not report it. So they
measure. ``tracemalloc`` sees every allocation of Python objects and numpy
arrays, but for the whole process, and in ``ringlab.run`` all ranks share one
process. The simulator, though, runs one rank at a time and switches only
inside communication calls. So ``MemoryProbe`` wraps a rank's ``comm``: each
call ends a *segment* of that rank's code, and the change in traced memory
over the segment (and the peak within it) is charged to that rank. What
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

from ...backends.isolated import mark
from ..kit.report import Failure


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
    from ...comm import Comm
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


def ledger_for(comm, spec, model_bytes):
    """The ledger of a measured case (None otherwise). Under ``ringlab grade`` (a
    process per rank, where nothing else frees memory during the rank's code) a
    fall of more than the model's size + 64 KiB below the step's start is
    tampering; in one process the garbage collector may free another rank's
    objects during this rank's code, so there is no floor."""
    if not spec["measure"]:
        return None
    isolated = getattr(comm._world, "isolated", False)
    return Ledger(floor=-(model_bytes + 64 * 1024) if isolated else None)


def tampered(ledger):
    """Words for a measurement that cannot be trusted, or ''."""
    if ledger.stopped:
        return "tracemalloc was stopped"
    if ledger.tampered:
        return f"the grader's memory measurement was tampered with: {ledger.tampered}"
    return ""


def measured_steps(comm, spec, model_bytes, steps, take_step, after_step, make=None):
    """The grader's step loop: ``take_step(comm_or_probe, x, y, batch)`` for each
    of ``steps``, with memory measured where the case asks; ``after_step(t)``
    checks the state left after step t. ``make(comm_or_probe)``, if given, is
    what ``take_step`` gets instead, made once before the first step (a
    ``DeviceMesh`` over the probe: its groups are probed too). Returns (a
    problem or None, the per-step (start, peak) pairs as an array of shape
    (steps, 2))."""
    from ._common import report_problem
    ledger = ledger_for(comm, spec, model_bytes)
    probe = MemoryProbe(comm, ledger) if ledger else comm
    probe = make(probe) if make else probe
    memory = []
    if ledger:
        mark(comm, 0)         # isolated: the resident memory before the first step
    for t, (x, y, batch) in enumerate(steps):
        if ledger:
            ledger.step_begin()
        take_step(probe, x, y, batch)
        if ledger:
            memory.append(ledger.step_end())
            mark(comm, t + 1)
            if tampered(ledger):
                return report_problem("memory is measured", tampered(ledger)), None
        bad = after_step(t)
        if bad:
            return bad, None
    return None, np.array(memory, dtype=np.float64).reshape(-1, 2)


# ---------------------------------------------------------------------------- isolated
# Under ``ringlab grade`` each rank is a process of its own, and everything in
# it, the measurement above included, is the program's to change (it can reset
# the ledger, or fill an array made when it was loaded, before tracing began).
# So there the grader also reads each rank process's resident memory from
# outside (``RunResult.resident``): before the program was loaded, and at every
# call it made. Coarser than tracemalloc (pages, Python's own heap), so the
# checks are on a case large enough that what is at stake, a full copy of the
# model, is many times the noise.
RESIDENT_SLACK = 3 * 2**20        # pages of Python's own heap, wire buffers, the allocator


def resident_loaded(result, case):
    """A Failure if loading the program (unpickling it in the rank's process)
    made more than the slack of data: arrays made then, before the program ran,
    are memory it holds all along."""
    for r, res in enumerate(result.resident or ()):
        if res and None not in (res.get("before"), res.get("loaded")):
            made = res["loaded"] - res["before"]
            if made > RESIDENT_SLACK:
                return Failure(case.label, "memory: the rank's process, read from outside",
                               f"loading the program in rank {r}'s process made "
                               f"{made / 2**20:.1f} MiB of data, before it ran",
                               expected=f"nothing to speak of (at most "
                                        f"{RESIDENT_SLACK // 2**20} MiB)",
                               got=f"{made / 2**20:.1f} MiB",
                               hint="Make arrays inside your function, not at the top of the "
                                    "notebook: a global array your function uses is loaded "
                                    "with it, and it counts.")
    return None


def resident_peak(result, case, bound, words):
    """A Failure if a rank process's resident memory grew, at any of its calls,
    by more than ``bound`` bytes above what it held before the program was
    loaded (loading counts: arrays made then are the program's), else None."""
    for r, res in enumerate(result.resident or ()):
        if not res or res.get("before") is None or res.get("peak") is None:
            continue
        grown = res["peak"] - res["before"]
        if grown > bound + RESIDENT_SLACK:
            full = 8 * sum(case.info["pads"])
            return Failure(case.label, "memory: the rank's process, read from outside",
                           f"rank {r}'s process grew by {grown / 2**20:.1f} MiB above what it "
                           f"held before the program was loaded: "
                           f"{grown / full:.2f} copies of the whole model "
                           f"({full / 2**20:.1f} MiB)",
                           expected=f"at most {bound / 2**20:.1f} MiB (+ "
                                    f"{RESIDENT_SLACK // 2**20} MiB): {words}",
                           got=f"{grown / 2**20:.1f} MiB",
                           hint="The grader reads each rank's memory from outside its process "
                                "under `ringlab grade`; arrays made when the program is loaded "
                                "count too. Hold only what the stage allows.")
    return None


def resident_marks(result, case, steps, setup, keep, stage):
    """Failures of what a rank process held at the driver's marks (``mark``):
    before the first step, at most the ``setup`` bytes the driver made for it
    (the model, the shards, Adam's moments) above what it held once loaded; after
    each step, at most ``keep`` bytes more than before the first. Marks missing
    or out of order mean the driver was changed. None if all is well."""
    full = 8 * sum(case.info["pads"])
    for r, res in enumerate(result.resident or ()):
        marks = (res or {}).get("marks")
        if marks is None:
            continue
        if [t for t, _ in marks] != list(range(steps + 1)) or None in [m for _, m in marks]:
            return Failure(case.label, "memory: the rank's process, read from outside",
                           f"rank {r} did not reach the grader's {steps + 1} measuring points "
                           f"(one before each step, one after the last) in order",
                           hint="The grader's driver marks where it reads the memory; a "
                                "program may not change the driver.")
        base = marks[0][1] - res["loaded"]
        if base > setup + RESIDENT_SLACK:
            return Failure(case.label, "memory: the rank's process, read from outside",
                           f"before its first step rank {r}'s process held "
                           f"{base / 2**20:.1f} MiB above what it held once the program was "
                           f"loaded, more than the {setup / 2**20:.1f} MiB the grader made "
                           f"for it (the model and the {stage} state it hands over)",
                           expected=f"at most {setup / 2**20:.1f} MiB (+ "
                                    f"{RESIDENT_SLACK // 2**20} MiB)",
                           got=f"{base / 2**20:.1f} MiB")
        for t, (_, mark_t) in enumerate(marks[1:], start=1):
            grown = mark_t - marks[0][1]
            if grown > keep + RESIDENT_SLACK:
                return Failure(case.label, "memory: the rank's process, read from outside",
                               f"after step {t} rank {r}'s process held {grown / 2**20:.1f} MiB "
                               f"more than before the first step: {grown / full:.2f} copies of "
                               f"the whole model kept between steps",
                               expected=f"at most {keep / 2**20:.1f} MiB (+ "
                                        f"{RESIDENT_SLACK // 2**20} MiB): a {stage} rank keeps "
                                        f"between steps only what it was handed",
                               got=f"{grown / 2**20:.1f} MiB",
                               hint="Keep nothing full-size between steps (no full master copy, "
                                    "no full Adam moments, no cached buffers); the grader reads "
                                    "each rank's memory from outside its process.")
    return None
