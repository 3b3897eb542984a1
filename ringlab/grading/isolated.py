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
* the program arrives as bytes (cloudpickle) and is unpickled *only inside the
  rank processes*: unpickling runs code. What comes back is decoded by
  ``wire.py`` (JSON and raw array bytes), never unpickled;
* limits: a wall-clock ``timeout`` (the processes are killed), ``memory_mb``
  of address space per rank; a process that crashes or calls ``os._exit``
  becomes a ``RankError`` that says so.

The scheduler still runs one rank at a time: when the simulator lets rank r
go on, it answers r's pending request and waits for r's next one, while the
other processes wait for their answers. So runs stay reproducible.
"""

from __future__ import annotations

import builtins
import contextlib
import multiprocessing
import os
import resource
import signal
import sys
import time
import types
import traceback

import numpy as np

from ..comm import Comm, RunResult
from ..errors import CommError, ProgramTimeout, RankError, DeadlockError, UnreceivedMessagesError
from ..sim.world import Request, World
from ..trace import Trace
from . import wire

PRELOAD = ["numpy", "cloudpickle", "ringlab", "ringlab.grading.isolated"]


class Submission:
    """A learner's program as cloudpickle bytes, as ``ringlab grade`` takes it
    out of a notebook's kernel. The grading process never unpickles it."""

    def __init__(self, data, name="program"):
        self.data, self.__name__ = bytes(data), name

    def __repr__(self):
        return f"<submitted program {self.__name__} ({len(self.data)} bytes)>"


# =====================================================================================
# In the rank's process (untrusted from here on: the learner's code runs here)
# =====================================================================================

def _rank_main(conn, program_bytes, memory_mb):
    os.setpgrp()                     # its own process group: the grader kills it and its children
    _limit(memory_mb)
    try:
        import cloudpickle
        program = cloudpickle.loads(program_bytes)
        _, x, args, kwargs, info = wire.recv(conn)
        link = _Link(conn)
        result = program(_RemoteComm(link, info), x, *args, **dict(kwargs))
        bad = _bad_result(result)
        if bad:
            raise TypeError(f"wrong result type: the program returned {bad}; a result must be a "
                            f"numpy array (or None, or a list of numpy arrays)")
        wire.send(conn, ["done", result])
    except BaseException as e:  # noqa: BLE001 - everything is reported to the grader
        with contextlib.suppress(BaseException):
            wire.send(conn, ["error", type(e).__name__, str(e)[:2000], _rank_traceback(e)])
    finally:
        os._exit(0)                  # no atexit handlers, no flushing of inherited state


def _limit(memory_mb):
    """Address space: what the process has now (numpy is loaded) plus ``memory_mb``.
    Files it writes: at most 16 MiB each. Not dumpable: other processes of the
    same user cannot read its memory through /proc (nor it theirs, likewise)."""
    if memory_mb is not None:
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = now + int(memory_mb) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 2**20, 16 * 2**20))
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)       # PR_SET_DUMPABLE = 4


def _bad_result(value, depth=0):
    """None if ``value`` may be a result, else what it is, in words."""
    if value is None or (type(value) is np.ndarray and value.dtype.str in wire.DTYPES):
        return None
    if type(value) in (list, tuple) and depth < 2:
        return next((f"a {type(value).__name__} holding {b}" for b in
                     (_bad_result(v, depth + 1) for v in value) if b), None)
    if isinstance(value, np.ndarray):
        what = type(value).__name__ if type(value) is not np.ndarray else f"an array of dtype {value.dtype}"
        return f"{what} (not a plain numpy array)"
    return f"a {type(value).__name__}"


def _rank_traceback(exc):
    """The program's traceback, without this module's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.replace("\\", "/").endswith("/ringlab/grading/isolated.py")]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    return (text + "".join(traceback.format_exception_only(type(exc), exc)))[-8000:]


class _Link:
    """The rank's end of the pipe: one call, one answer."""

    def __init__(self, conn):
        self.conn = conn

    def call(self, handle, method, *args, **kwargs):
        wire.send(self.conn, ["call", handle, method, list(args), [[k, v] for k, v in kwargs.items()]])
        answer = wire.recv(self.conn)
        if answer[0] == "raise":
            raise rebuild_exception(answer[1], answer[2])
        return self.wrap(answer[1])

    def wrap(self, value):
        kind = value.info[0] if isinstance(value, wire.Handle) and value.info else None
        if kind == "comm":
            return _RemoteComm(self, value.info)
        if kind == "request":
            return _RemoteRequest(self, value.id)
        return value                    # None, arrays, numbers, a span's handle


class _RemoteRequest:
    """What ``isend``/``irecv`` return in a rank's process."""

    def __init__(self, link, handle, out=None):
        self._link, self._id, self._out = link, handle, out

    def wait(self):
        got = self._link.call(self._id, "wait")
        if self._out is not None and got is not None:
            self._out[...] = got        # recv(out=...) fills the rank's own array
            return self._out
        return got

    def is_completed(self):
        return self._link.call(self._id, "is_completed")


class _RemoteComm:
    """``Comm`` as a rank's process sees it: every call goes to the grading process."""

    def __init__(self, link, info):
        from ..comm import Group
        _, self._id, self.rank, self.world_size, self.global_rank, ranks, label, gid = info
        # A label is a name or a tuple of ranks (hashable, as in ringlab.run): keep it a tuple.
        self.group = Group(tuple(ranks), tuple(label) if type(label) is list else label, gid)
        self._link = link

    def _call(self, method, *args, **kwargs):
        return self._link.call(self._id, method, *args, **kwargs)

    step = property(lambda self: self._call("step"))
    time = property(lambda self: self._call("time"))

    def send(self, array, dst, **kw):
        self._call("send", array, dst, **kw)

    def isend(self, array, dst, **kw):
        return self._call("isend", array, dst, **kw)

    def recv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        return self.irecv(src, out=out, shape=shape, dtype=dtype, tag=tag).wait()

    def irecv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        if dtype is not None:
            with contextlib.suppress(TypeError):
                dtype = np.dtype(dtype).str          # a dtype travels by its name
        req = self._call("irecv", src, out=out, shape=shape, dtype=dtype, tag=tag)
        req._out = out if isinstance(out, np.ndarray) else None
        return req

    def recv_any(self, *, tag=0):
        return self._call("recv_any", tag=tag)

    def sendrecv(self, array, dst, src, **kw):
        return self._call("sendrecv", array, dst, src, **kw)

    def compute(self, seconds, label="compute", **meta):
        self._call("compute", seconds, label, **meta)

    def start(self, fn, *args, **kwargs):
        raise CommError("comm.start is not available in isolated (graded) runs")

    def new_group(self, ranks, name=None):
        return self._call("new_group", ranks if type(ranks) in (list, tuple) else list(ranks), name)

    def split(self, color, key=0, name=None):
        return self._call("split", color, key, name)

    def barrier(self):
        self._call("barrier")

    @contextlib.contextmanager
    def span(self, name):
        token = self._call("span_enter", name)
        try:
            yield
        finally:
            self._call("span_exit", token)

    def __repr__(self):
        g = "" if self.group.label is None else f" group={self.group.label!r}"
        return f"<Comm rank={self.rank} world_size={self.world_size}{g} step={self.step}>"


def rebuild_exception(name, message):
    """An exception named ``name`` saying ``message``: the real class for
    ringlab's CommError and Python's built-in exceptions (so that, e.g., a
    grader still recognises NotImplementedError), else a new class of that name."""
    name = str(name) if str(name).isidentifier() else "Exception"
    cls = CommError if name == "CommError" else getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception) and cls.__str__ is BaseException.__str__):
        cls = type(name, (Exception,), {})
    try:
        return cls(str(message))
    except Exception:  # noqa: BLE001 - a built-in that wants other arguments
        return type(name, (Exception,), {})(str(message))


# =====================================================================================
# In the grading process (trusted)
# =====================================================================================

class _Stop(Exception):
    """Why a rank's actor stopped: raised in its greenlet, so the simulator
    records it as that rank's failure, at that rank's step."""


class _TimedOut(_Stop):
    pass


class RankProcessDied(_Stop):
    """A rank's process ended (``os._exit``, a crash, killed) before its program returned."""


class _RemoteError(_Stop):
    def __init__(self, exc, text):
        super().__init__(str(exc))
        self.exc, self.text = exc, text


COMM_CALLS = {"send", "isend", "recv", "irecv", "recv_any", "sendrecv", "compute",
              "new_group", "split", "barrier"}


class _RankProcess:
    """One rank's process, and the objects (comms, requests, spans) it may name."""

    def __init__(self, ctx, rank, program_bytes, memory_mb, deadline):
        self.rank, self.deadline = rank, deadline
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_rank_main, args=(child, program_bytes, memory_mb),
                                   daemon=True, name=f"ringlab-rank-{rank}")
        with _without_main():
            self.process.start()
        child.close()
        self.objects = {}

    # -- the actor: the "program" the simulator runs for this rank ------------------
    def serve(self, comm, x, args, kwargs):
        self._send(["start", x, list(args), [[k, v] for k, v in kwargs.items()], self._info(comm)])
        while True:
            message = self._receive()
            kind = message[0] if isinstance(message, list) and message else None
            if kind == "done" and len(message) == 2:
                return message[1]
            if kind == "error" and len(message) == 4:
                exc = rebuild_exception(message[1], message[2])
                raise _RemoteError(exc, str(message[3]))
            if kind != "call" or len(message) != 5:
                raise RankProcessDied(f"rank {self.rank}'s process sent something that is not a call")
            try:
                answer = ["ok", self._dispatch(*message[1:])]
            except Exception as e:  # noqa: BLE001 - the rank's mistake: raised in its own code
                answer = ["raise", type(e).__name__, str(e)]
            self._send(answer)

    def _dispatch(self, handle, method, args, kwargs):
        obj = self.objects.get(handle) if type(handle) is int else None
        kwargs = {str(k): v for k, v in kwargs}
        if method == "span_exit" and args and isinstance(args[0], wire.Handle):
            span = self.objects.pop(args[0].id, None)
            if isinstance(span, contextlib.AbstractContextManager):
                span.__exit__(None, None, None)
                return None
        elif isinstance(obj, Comm):
            if method in COMM_CALLS:
                return self._wrap(getattr(obj, method)(*args, **kwargs))
            if method in ("step", "time"):
                return getattr(obj, method)
            if method == "span_enter":
                span = obj.span(*args)
                span.__enter__()
                return self._wrap(span)
        elif isinstance(obj, Request) and method in ("wait", "is_completed"):
            return getattr(obj, method)()
        raise CommError(f"rank {self.rank}: {method}() is not a communication call")

    def _wrap(self, value):
        """Comms and requests stay here; the rank gets a handle (a number)."""
        if isinstance(value, (Comm, Request, contextlib.AbstractContextManager)):
            handle = len(self.objects) + 1
            while handle in self.objects:
                handle += 1
            self.objects[handle] = value
            kind = ["request"] if isinstance(value, Request) else ["span"]
            return wire.Handle(handle, self._info(value, handle) if isinstance(value, Comm) else kind)
        return value

    def _info(self, comm, handle=0):
        self.objects[handle] = comm
        g = comm.group
        return ["comm", handle, comm.rank, comm.world_size, comm.global_rank, list(g.ranks), g.label, g.gid]

    # -- the pipe ----------------------------------------------------------------------
    def _send(self, value):
        try:
            wire.send(self.conn, value)
        except OSError:
            raise self._died() from None

    def _receive(self):
        left = self.deadline - time.monotonic()
        if left <= 0 or not self.conn.poll(left):
            raise _TimedOut(f"rank {self.rank} did not finish in time")
        try:
            return wire.recv(self.conn)
        except (EOFError, OSError):
            raise self._died() from None
        except (wire.WireError, ValueError, RecursionError) as e:
            raise RankProcessDied(f"rank {self.rank}'s process sent a message that cannot be read ({e})") from None

    def _died(self):
        self.process.join(1.0)
        code = self.process.exitcode
        why = {None: "", -signal.SIGKILL: " (killed: out of memory?)",
               -signal.SIGSEGV: " (a segmentation fault)", -signal.SIGXFSZ: " (wrote too large a file)"}
        return RankProcessDied(f"rank {self.rank}'s process ended before its program returned "
                     f"(exit code {code}{why.get(code, '')}); did the program call os._exit or exit()?")

    def kill(self):
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError):
            self.process.kill()
        self.process.join()
        self.conn.close()


@contextlib.contextmanager
def _without_main():
    """multiprocessing re-runs the parent's main script in every new process
    (so that its functions can be found). A rank process needs none of the
    grader's code, so hide the main module while a process starts."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


_CONTEXT = None


def _context():
    """The forkserver: started once, it imports numpy and ringlab, then forks a
    fresh process for every rank. Forking the grading process itself would copy
    the hidden cases into every rank's memory."""
    global _CONTEXT
    if _CONTEXT is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _CONTEXT = ctx
    return _CONTEXT


def run_isolated(program, inputs, *, args=(), kwargs=None, mode="buffered", timeout=10.0,
                 check_unreceived=True, record_payloads=False, network=None, memory_mb=512,
                 backend="sim"):
    """``ringlab.run`` with one process per rank (see the module's docstring).

    ``program`` is a ``Submission`` (cloudpickle bytes) or a function (pickled
    here, by value). ``timeout`` covers the whole run, process starts included.
    """
    if backend != "sim":
        raise ValueError("isolated runs use the simulator")
    import cloudpickle
    data = program.data if isinstance(program, Submission) else cloudpickle.dumps(program)
    inputs = list(inputs)
    if not inputs:
        raise ValueError("run() needs one input per rank; got an empty list (world_size 0)")
    timeout = 3600.0 if timeout is None else timeout
    ctx, deadline = _context(), time.monotonic() + timeout
    world = World(len(inputs), mode, record_payloads, network)
    ranks = []
    try:
        ranks = [_RankProcess(ctx, r, data, memory_mb, deadline) for r in range(len(inputs))]
        world.run(lambda comm, x, *a, **kw: ranks[comm.global_rank].serve(comm, x, a, kw),
                  inputs, args, kwargs or {})
    finally:
        world.kill_unfinished()
        for rank in ranks:
            rank.kill()
    return _result(world, timeout, check_unreceived)


def _result(world, timeout, check_unreceived):
    """What ``ringlab.sim.run`` returns or raises, for this world (the same steps)."""
    actors = world.all_actors()
    left = world.unreceived()
    groups = {g.label: g.ranks for g in world.groups.values() if g.label is not None}
    trace = Trace(world.events, world.world_size, [s for me in actors for s in me.spans], left,
                  world.computes, groups)
    if world.failure is not None:
        _, me, exc = world.failure
        if isinstance(exc, _TimedOut):
            raise ProgramTimeout(timeout, me.rank, me.clock, "")
        if isinstance(exc, _RemoteError):
            raise RankError(me.rank, me.clock, exc.exc, exc.text, trace)
        raise RankError(me.rank, me.clock, exc, "", trace)
    if [me for me in actors if not me.finished] or world.any_waiters:
        raise DeadlockError(world.waits(), [me.rank for me in world.actors if me.finished], trace)
    if left and check_unreceived:
        raise UnreceivedMessagesError(trace.unreceived)
    return RunResult([me.result for me in world.actors], trace, world.payloads, trace.time)


def runner(memory_mb=512):
    """A drop-in for ``ringlab.run`` that runs isolated (``grade_cases(runner=...)``)."""
    def run(program, inputs, **kw):
        return run_isolated(program, inputs, memory_mb=memory_mb, **kw)
    return run
