"""The grader's side of an isolated run: one process per rank, served by the simulator.

``run_isolated`` starts a process per rank (forked from a clean forkserver),
runs the real simulator here, and gives each rank an actor whose greenlet
answers its process's calls (``_RankProcess``): the simulator's matching,
steps, trace and deadlock detection are the ones ``ringlab.run`` uses. It
also reads each rank process's resident memory from outside it.
"""

from __future__ import annotations

import contextlib
import contextvars
import multiprocessing
import os
import signal
import sys
import time
import types

from ...comm import Comm
from ...errors import CommError, DeadlockError, ProgramTimeout, RankError, UnreceivedMessagesError
from ...result import RunResult
from ...sim.world import Request, Work
from ...sim.world import World as SimWorld
from ...trace import payload_key
from . import pipe as wire
from . import rank as rank_side
from .rank import _names, rebuild_exception

# What the forkserver loads once, before it forks a process per rank.
PRELOAD = ["numpy", "cloudpickle", "ringlab", rank_side.__name__]
# Imported last there, once everything is loaded (see zygote.py).
ZYGOTE = f"{__package__}.zygote"


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


# The Comm methods a rank's process may call by name, with its own arguments:
# the grader's Comm checks them again, as it would in ringlab.run.
COMM_CALLS = {"send", "isend", "recv", "irecv", "sendrecv", "recv_any", "compute", "alloc", "free",
              "barrier"}
_PAGE = os.sysconf("SC_PAGE_SIZE")


class _RankProcess:
    """One rank's process, and the objects (comms, requests, works, spans) it may
    name by handle. Each object belongs to the stream (the program, or a work)
    that was given it: only that stream's actor may use it."""

    def __init__(self, ctx, rank, program_bytes, memory_mb, deadline, banned=(), warm_up=True,
                 reads_memory=True):
        self.rank, self.deadline, self.reads_memory = rank, deadline, reads_memory
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=rank_side.rank_main,
                                   args=(child, program_bytes, memory_mb, banned, warm_up),
                                   daemon=True, name=f"ringlab-rank-{rank}")
        with _without_main():
            self.process.start()
        child.close()
        self.objects, self.actors = {}, {}     # handle -> (stream id, object); stream id -> actor
        self.spans = {}                         # (stream id, the rank's token) -> an open span
        # Its resident memory, read from outside (see RunResult.resident), and at
        # each message it sent: payload_key -> bytes resident when it asked to send.
        self.resident, self.at_send, self.world = None, {}, None

    # -- the actors: the "program" the simulator runs for this rank, and its works ------
    def serve(self, comm, x, args, kwargs):
        self.actors[0], self.world = comm._me, comm._world
        group = comm.group
        info = [self._register(0, comm), comm.global_rank, list(group.ranks), group.label, group.gid]
        self._send(["start", x, list(args), [[k, v] for k, v in kwargs.items()], info])
        readings = []
        for step in ("ready", "loaded"):
            message = self._receive(0)
            if message != [step]:
                self._refused(0, message)
            readings.append(self._rss())          # the rank waits for the answer: exact
            self._send(["measured"])
        before, loaded = readings
        self.resident = {"before": before, "loaded": loaded,
                         "peak": loaded if self.reads_memory else None, "hwm": None, "marks": []}
        return self._serve(0)

    def _serve(self, sid):
        """Answer stream ``sid``'s calls until it is done; its result (the program's).
        If the run ends under it (another rank failed, a deadlock, its process died),
        the stream's open spans end here, innermost first, where the rank stands: as
        ``ringlab.run`` records them when the program's ``with comm.span`` blocks
        unwind (the rank's process is killed, and unwinds nothing)."""
        try:
            return self._answer(sid)
        except BaseException:
            for key in [k for k in self.spans if k[0] == sid][::-1]:
                with contextlib.suppress(Exception):     # the run's own error goes on
                    self.spans.pop(key).__exit__(None, None, None)
            raise

    def _answer(self, sid):
        actor = self.actors[sid]
        while True:
            message = self._receive(sid)
            kind = message[0] if isinstance(message, list) and message else None
            if kind == "done" and len(message) == (2 if sid == 0 else 1):
                return message[1] if sid == 0 else None
            if kind == "error" and len(message) == 4:
                raise _RemoteError(rebuild_exception(message[1], message[2]), str(message[3]))
            if kind != "call" or len(message) != 5:
                self._refused(sid, message)
            # A /proc read per call: only in runs whose memory a check reads.
            rss, sent = (self._rss() if self.reads_memory else None), len(self.world.events)
            if rss is not None:
                self.resident["peak"] = max(self.resident["peak"] or 0, rss)
            if _is_mark(message):
                self.resident["marks"].append((message[3][0][1], rss))
            try:
                answer = ["ok", self._dispatch(sid, *message[1:])]
            except Exception as e:  # noqa: BLE001 - the rank's mistake: raised in its own code
                answer = ["raise", _names(e), str(e)]
            if rss is not None:
                for e in self.world.events[sent:]:
                    if e.src == self.rank:
                        self.at_send[payload_key(e)] = rss
            self._send([sid, answer + [actor.clock, actor.time]])

    def _refused(self, sid, message):
        if isinstance(message, list) and message[:1] == ["error"] and len(message) == 4:
            raise _RemoteError(rebuild_exception(message[1], message[2]), str(message[3]))
        raise RankProcessDied(f"rank {self.rank}'s process sent something that is not a call")

    def _dispatch(self, sid, handle, method, args, kwargs):
        owner, obj = self.objects.get(handle, (None, None)) if type(handle) is int else (None, None)
        kwargs = {str(k): v for k, v in kwargs} if type(kwargs) is list else {}
        args = args if type(args) is list else []
        if owner != sid:
            pass                                    # not this stream's: refused below
        elif isinstance(obj, Comm):
            if method in COMM_CALLS:
                return self._handle(sid, getattr(obj, method)(*args, **kwargs))
            if kwargs:
                pass
            elif method == "new_group" and len(args) == 2:
                group = obj._world.new_group(obj, obj._group_ranks(args[0]), args[1])
                member = obj._me.rank in group.ranks
                return [group.label, group.gid, self._register(sid, obj._sub(group)) if member else None]
            elif method == "split" and len(args) == 3:
                sub = obj.split(*args)
                if sub is None:
                    return None
                g = sub.group
                return [list(g.ranks), g.label, g.gid, self._register(sid, sub)]
            elif method == "agree" and len(args) == 2 and args[1] == "barrier" and (
                    args[0] is None or _is_mark_value(args[0])):
                obj._world.agree(obj, args[0], "barrier")       # no rank's value comes back
                return None
            elif method == "start" and len(args) == 1:
                return self._start(sid, obj, args[0])
        elif isinstance(obj, (Request, Work)) and method in ("wait", "is_completed") and not args:
            got = getattr(obj, method)()
            return None if isinstance(obj, Work) and method == "wait" else got
        raise CommError(f"rank {self.rank}: {method}() is not a communication call")

    def _start(self, sid, comm, name):
        """``comm.start``: a simulator work whose actor serves the rank's work
        thread. Only the name comes from the rank; ``fn`` stays there. A work's
        handle is also its stream id: never reused, as works stay here."""
        name = name[:200] if type(name) is str and name else "work"
        server = _WorkServer(self, name)
        server.sid = self._register(sid, comm.start(server))
        return wire.Handle(server.sid, ["work", name])

    def _register(self, sid, value):
        handle = len(self.objects) + 1
        while handle in self.objects:
            handle += 1
        self.objects[handle] = (sid, value)
        return handle

    def _handle(self, sid, value):
        """What a call returns: requests and works stay here; the rank gets a handle."""
        if isinstance(value, (Request, Work)):
            return wire.Handle(self._register(sid, value), ["request"])
        return value

    # -- memory, read from outside -------------------------------------------------------
    def _rss(self):
        """The process's resident bytes now, or None."""
        try:
            with open(f"/proc/{self.process.pid}/statm") as f:
                return int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None

    def measure(self):
        """Read the process's peak resident memory (VmHWM) before it is killed."""
        if self.resident is None or not self.reads_memory:
            return
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{self.process.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self.resident["hwm"] = int(line.split()[1]) * 1024

    # -- the pipe ----------------------------------------------------------------------
    def _send(self, value):
        try:
            wire.send(self.conn, value)
        except OSError:
            raise self._died() from None

    def _receive(self, sid):
        """The next message, which must be stream ``sid``'s: the only one of this
        rank's threads that was answered and has not called again."""
        left = self.deadline - time.monotonic()
        if left <= 0 or not self.conn.poll(left):
            raise _TimedOut(f"rank {self.rank} did not finish in time")
        try:
            message = wire.recv(self.conn)
        except (EOFError, OSError):
            raise self._died() from None
        except (wire.WireError, ValueError, RecursionError) as e:
            raise RankProcessDied(f"rank {self.rank}'s process sent a message that cannot be read ({e})") from None
        if not (type(message) is list and len(message) in (2, 3) and type(message[0]) is int):
            raise RankProcessDied(f"rank {self.rank}'s process sent a message without its stream")
        if message[0] != sid:
            raise RankProcessDied(f"rank {self.rank}'s process sent a message out of turn (from stream "
                                  f"{message[0]} while stream {sid} had the turn): did the program call "
                                  f"the communicator from a thread of its own?")
        if len(message) == 3:
            self._spans(sid, message[2])
        return message[1]

    def _spans(self, sid, ops):
        """Enter and leave the spans stream ``sid`` entered and left since its last
        message (``rank._Link.spans``), in order, before what that message asks."""
        for op in ops if type(ops) is list else [None]:
            kind = op[0] if type(op) is list and op else None
            if kind == "enter" and len(op) == 4 and type(op[2]) is str and type(op[3]) is int:
                owner, comm = self.objects.get(op[1], (None, None)) if type(op[1]) is int \
                    else (None, None)
                if owner == sid and isinstance(comm, Comm) and (sid, op[3]) not in self.spans:
                    span = self.spans[sid, op[3]] = comm.span(op[2])
                    span.__enter__()
                    continue
            elif kind == "exit" and len(op) == 2 and (sid, op[1]) in self.spans:
                self.spans.pop((sid, op[1])).__exit__(None, None, None)
                continue
            raise RankProcessDied(f"rank {self.rank}'s process sent a span it did not open")

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


MARK = "ringlab step mark"


def mark(comm, label):
    """A point a grader's driver asks to know the rank's resident memory at
    (``resident["marks"]``, in an isolated run): a barrier that carries
    ``(MARK, label)``. No message, no time: in ringlab.run just a barrier."""
    comm._world.agree(comm, (MARK, label), "barrier")


def _is_mark(message):
    args = message[3] if len(message) == 5 else None
    return (message[2] == "agree" and type(args) is list and len(args) == 2
            and args[1] == "barrier" and _is_mark_value(args[0]))


def _is_mark_value(value):
    return (type(value) is tuple and len(value) == 2 and value[0] == MARK
            and type(value[1]) is int and 0 <= value[1] < 1000)


class _WorkServer:
    """The ``fn`` of a simulator work in an isolated run: when the simulator starts
    the work, it tells the rank's process to run the learner's ``fn`` on a thread
    there, then serves that thread's calls. Named as the learner's ``fn`` (the
    simulator's diagnoses name it)."""

    def __init__(self, rank, name):
        self.rank, self.__name__, self.sid = rank, name, None

    def __call__(self, comm):
        rank, sid = self.rank, self.sid
        rank.actors[sid] = comm._me
        rank._send([sid, ["go", rank._register(sid, comm), [comm._me.clock, comm._me.time]]])
        return rank._serve(sid)


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
        ctx.set_forkserver_preload(PRELOAD + _every_module() + [ZYGOTE])
        _CONTEXT = ctx
    return _CONTEXT


def start_forkserver():
    """Start the forkserver now, with everything a rank may import loaded in it:
    ``ringlab grade`` does this before it runs a learner's notebook, whose code
    could otherwise change ringlab's files before a rank (or the grader) first
    imports them."""
    _context()
    from multiprocessing import forkserver
    forkserver.ensure_running()


def _every_module():
    """Every module of ringlab but those that import torch (real processes are
    another backend): what a grader's driver in a rank may import."""
    import pkgutil
    import ringlab
    names = []
    for info in pkgutil.walk_packages(ringlab.__path__, ringlab.__name__ + "."):
        if ("torch" not in info.name.split(".")[-1] and ".backends.torch" not in info.name
                and info.name != ZYGOTE):
            names.append(info.name)
    return names


def run_isolated(program, inputs, *, args=(), kwargs=None, mode="buffered", timeout=10.0,
                 check_unreceived=True, record_payloads=False, network=None, memory_mb=512,
                 backend="sim", banned=(), warm_up=True, reads_memory=True):
    """``ringlab.run`` with one process per rank (see the module's docstring).

    ``program`` is a ``Submission`` (cloudpickle bytes) or a function (pickled
    here, by value). ``timeout`` covers the whole run, process starts included.
    ``banned``: the answers the program must not call (``module:qualname``,
    see ``ringlab.answers.forbidden``): a call fails the rank. ``warm_up``: each
    rank uses BLAS once before its memory is first read (``sandbox.warm_up``);
    only a run whose resident memory is checked needs it (about 40 ms a rank).
    ``reads_memory``: read each rank process's resident memory at each of its
    calls too (``RunResult.resident``'s peak and marks, ``resident_at``; the
    readings before and after the program is loaded are always taken); a run
    whose memory no check reads skips that /proc read per call.
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
    world = SimWorld(len(inputs), mode, record_payloads, network)
    ranks = []
    try:
        ranks = [_RankProcess(ctx, r, data, memory_mb, deadline, tuple(banned), warm_up,
                              reads_memory)
                 for r in range(len(inputs))]
        world.run(lambda comm, x, *a, **kw: ranks[comm.global_rank].serve(comm, x, a, kw),
                  inputs, args, kwargs or {})
    finally:
        world.kill_unfinished()
        for rank in ranks:
            rank.measure()
            rank.kill()
    result = _result(world, timeout, check_unreceived)
    result.resident = [rank.resident for rank in ranks]    # see RunResult
    result.resident_at = {k: v for rank in ranks for k, v in rank.at_send.items()}
    return result


def _result(world, timeout, check_unreceived):
    """What ``ringlab.sim.run`` returns or raises, for this world (the same steps)."""
    actors = world.all_actors()
    trace = world.trace()
    left = trace.unreceived
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


# A graders' time limits are set for ``ringlab.grade``, where a communication
# call costs about 20 us. Here each one is a round trip between two processes
# (0.3 to 1 ms, more on a busy machine), so a heavy case (ZeRO-3, 12 units, 4
# ranks: about 1,000 calls) needs longer; an endless loop is still stopped.
ISOLATED_SLOWDOWN = 3

# False while a grader runs a case that reads no resident memory (``run_case`` sets
# it from the case's ``info["measure"]``): its ranks skip the warm-up, and the grader
# the reading of their memory at each call. Unset: both.
MEASURES_MEMORY = contextvars.ContextVar("ringlab_measures_memory", default=True)


def runner(memory_mb=512, banned=()):
    """A drop-in for ``ringlab.run`` that runs isolated (``grade_cases(runner=...)``),
    with the grader's time limit times ``ISOLATED_SLOWDOWN``."""
    def run(program, inputs, timeout=10.0, **kw):
        timeout = None if timeout is None else timeout * ISOLATED_SLOWDOWN
        return run_isolated(program, inputs, memory_mb=memory_mb, banned=banned,
                            timeout=timeout, warm_up=MEASURES_MEMORY.get(),
                            reads_memory=MEASURES_MEMORY.get(), **kw)
    run.isolated = True          # its ranks cannot reach the grader's objects (see run_case)
    return run
