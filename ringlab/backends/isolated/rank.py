"""The rank's side of an isolated run: the learner's program in a process of its own.

The program gets ringlab's own ``Comm``, over ``_RankWorld``: every call is
checked here, then sent down the pipe to the grading process (``server.py``),
whose simulator runs it on a ``Comm`` of its own and checks it again. The
program and its ``comm.start`` works each run on a thread, named by a stream
id that every message carries; the grader answers one of them at a time.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import resource
import sys
import threading
import traceback

import numpy as np

from ...comm import Comm, Group, World
from ...errors import CommError, said
from . import pipe as wire
from . import sandbox


def rank_main(conn, program_bytes, memory_mb, banned=(), warm_up=True):
    os.setpgrp()                     # its own process group: the grader kills it and its children
    sandbox.limit(memory_mb)
    sandbox.malloc_returns_memory()
    if warm_up:                      # only where the grader reads this process's memory
        sandbox.warm_up()
    # What a rank prints goes nowhere: the grader's console is the instructor's,
    # and a printed "All test cases passed!" there would be a forgery.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    # No file the zygote had open stays open: every rank inherits the same ones, and an
    # open file's flags (O_NONBLOCK) are shared by every process that holds it, a channel
    # between ranks outside the messages. Standard input is this rank's /dev/null on fd 0
    # (multiprocessing's sys.stdin read one on a descriptor of its own, closed below).
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    keep = conn.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    try:
        import cloudpickle
        sandbox.CONN[0] = conn
        _, x, args, kwargs, info = wire.recv(conn)
        # The guard goes up before the bytes are unpickled: unpickling makes code.
        sandbox.guard(banned)
        # The grader reads this process's memory from outside (see
        # _RankProcess.resident): now, with the inputs here but nothing of the
        # program, and again once the program is loaded (what loading made).
        sandbox.import_what_it_names(program_bytes)
        _measured(conn, "ready")
        program = cloudpickle.loads(program_bytes)
        _measured(conn, "loaded")
        link = sandbox.LINK[0] = _Link(conn)
        handle, rank, ranks, label, gid = info
        world = _RankWorld(link)
        world.handles[(gid, 0)] = handle
        actor = link.actors[0] = _Actor(rank, 0, 0)
        group = Group(tuple(ranks), tuple(label) if type(label) is list else label, gid)
        result = program(Comm(world, actor, group), x, *args, **dict(kwargs))
        bad = _bad_result(result)
        if bad:
            raise TypeError(f"wrong result type: the program returned {bad}; a result must be a "
                            f"numpy array (or None, or a list of numpy arrays)")
        link.send(0, ["done", result])
        # Works the program did not wait for go on (as in ringlab.run): keep reading
        # the pipe for them until the grader ends this process.
        link.receive(None)
    except BaseException as e:  # noqa: BLE001 - everything is reported to the grader
        with contextlib.suppress(BaseException):
            error = ["error", _names(e), said(e)[:2000], _rank_traceback(e)]
            if sandbox.LINK[0] is not None:      # with the spans the error left
                sandbox.LINK[0].send(0, error)
            else:
                wire.send(conn, [0, error])
    finally:
        os._exit(0)                  # no atexit handlers, no flushing of inherited state


def _measured(conn, what):
    """Say ``what`` and wait while the grader reads this process's memory."""
    wire.send(conn, [0, [what]])
    if wire.recv(conn) != ["measured"]:
        raise CommError("the grader did not measure this rank's memory")


def _bad_result(value, depth=0):
    """None if ``value`` may be a result, else what it is, in words."""
    if value is None or (isinstance(value, np.ndarray) and value.dtype.str in wire.DTYPES):
        return None      # a subclass too: it travels by name, and the grader's checks name it
    if type(value) in (list, tuple) and depth < 2:
        return next((f"a {type(value).__name__} holding {b}" for b in
                     (_bad_result(v, depth + 1) for v in value) if b), None)
    if isinstance(value, np.ndarray):
        what = type(value).__name__ if type(value) is not np.ndarray else f"an array of dtype {value.dtype}"
        return f"{what} (not a plain numpy array)"
    return f"a {type(value).__name__}"


# Files whose frames a learner's traceback leaves out: this module and Comm's.
_OURS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,      # this package's files
         os.path.abspath(sys.modules[Comm.__module__].__file__))


def _rank_traceback(exc):
    """The program's traceback, without this module's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(_OURS)]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    return (text + f"{type(exc).__name__}: {said(exc)}\n")[-8000:]


class _Actor:
    """What ``Comm`` reads of the calling actor, in the rank's process: the
    grader's answer to every call brings its clock and time (they change only
    inside calls), so ``comm.step`` and ``comm.time`` need no round trip."""

    __slots__ = ("rank", "stream", "sid", "clock", "time")

    def __init__(self, rank, stream, sid):
        self.rank, self.stream, self.sid, self.clock, self.time = rank, stream, sid, 0, 0.0


class _Link:
    """The rank's end of the pipe: one call, one answer.

    The program and its works (``comm.start``) share it. Each runs on a thread
    of its own, named by a number (its *stream id*: 0 for the program, the
    work's handle for a work) that every message carries both ways. The grading
    process answers one of them at a time and then waits for that one's next
    call, so only one thread runs learner code at any moment, in the order the
    simulator decides, as in ``ringlab.run``. Whichever thread is waiting reads
    the pipe and hands each answer to the thread it is for.
    """

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()            # one message at a time on the pipe
        self.cond = threading.Condition()
        self.inbox, self.reading, self.pending = {}, False, {}
        self.actors = {}                        # stream id -> its _Actor
        self.local = sandbox.STREAM             # .sid: the stream id of this thread
        self.local.sid = 0
        # Spans entered and left since a stream's last message, per stream id:
        # ["enter", comm handle, name, token] and ["exit", token]. They travel
        # with the stream's next message instead of as calls of their own (a
        # collective is a span: two round trips each). Nothing is lost by the
        # wait: a span reads only its own actor's clock and time, which move
        # only inside that stream's calls.
        self.spans, self.tokens = {}, 0

    def send(self, sid, body):
        spans = self.spans.pop(sid, None)
        with self.lock:
            wire.send(self.conn, [sid, body, spans] if spans else [sid, body])

    def span(self, sid, op):
        self.spans.setdefault(sid, []).append(op)

    def receive(self, sid):
        """The next message for stream ``sid`` (never, for None: then this
        thread just reads for the others)."""
        with self.cond:
            while sid not in self.inbox:
                if self.reading:
                    self.cond.wait()
                    continue
                self.reading = True
                self.cond.release()
                try:
                    message = wire.recv(self.conn)
                finally:
                    self.cond.acquire()
                    self.reading = False
                    self.cond.notify_all()
                to, body = message if type(message) is list and len(message) == 2 else (None, None)
                if to in self.pending:          # a work may run now: on a thread of its own
                    self._spawn(to, body)
                elif to is not None:
                    self.inbox[to] = body
            return self.inbox.pop(sid)

    def _spawn(self, sid, go):
        work, comm, fn, args, kwargs = self.pending.pop(sid)
        threading.Thread(target=_work_thread, args=(self, work, comm, go, fn, args, kwargs),
                         name=f"ringlab-work-{sid}", daemon=True).start()

    def call(self, sid, handle, method, args=(), kwargs=None):
        if getattr(self.local, "sid", None) != sid:
            raise CommError("communication calls must come from the program or from a work "
                            "(comm.start), each with its own comm, not from a thread it started")
        kwargs = kwargs or {}
        self.send(sid, ["call", handle, method, list(args), [[k, v] for k, v in kwargs.items()]])
        answer = self.receive(sid)
        if answer[0] == "raise":
            raise rebuild_exception(answer[1], answer[2])
        actor = self.actors[sid]
        actor.clock, actor.time = answer[2], answer[3]
        return answer[1]


def _work_thread(link, work, comm, go, fn, args, kwargs):
    """A work's thread: runs ``fn(stream_comm, ...)`` once the simulator starts the
    work (``go``). Its result stays here; the grading process hears only "done"."""
    sid = link.local.sid = work._id
    try:
        if not (type(go) is list and len(go) == 3 and go[0] == "go"):
            raise CommError("the grader did not start this work")
        actor = link.actors[sid] = _Actor(comm._me.rank, 1, sid)
        actor.clock, actor.time = go[2]
        stream_comm = Comm(comm._world, actor, comm.group, stream=1)
        comm._world.handles[(comm.group.gid, sid)] = go[1]
        result = fn(stream_comm, *args, **kwargs)
        work._result, work._done = result, True
        link.send(sid, ["done"])
    except BaseException as e:  # noqa: BLE001 - reported to the grader, as the program's errors
        with contextlib.suppress(BaseException):
            link.send(sid, ["error", _names(e), said(e)[:2000], _rank_traceback(e)])


class _Request:
    """What ``isend``/``irecv`` return in a rank's process."""

    def __init__(self, world, sid, handle, out=None):
        self._world, self._sid, self._id, self._out = world, sid, handle, out

    def wait(self):
        got = self._world.link.call(self._sid, self._id, "wait")
        return self._world.filled(got, self._out)

    def is_completed(self):
        return bool(self._world.link.call(self._sid, self._id, "is_completed"))


class _Work:
    """What ``comm.start`` returns in a rank's process: ``wait()`` gives the
    function's result (which never left this process)."""

    def __init__(self, world, sid, handle, name="work"):
        self._world, self._sid, self._id, self.name = world, sid, handle, name
        self._result, self._done = None, False

    def wait(self):
        self._world.link.call(self._sid, self._id, "wait")
        return self._result

    def is_completed(self):
        return bool(self._world.link.call(self._sid, self._id, "is_completed"))

    def __repr__(self):
        return f"<Work {self.name}>"


class _RankWorld(World):
    """``ringlab.comm.World`` in a rank's process: the learner's program gets a
    real ``Comm`` (the same class as in ``ringlab.run``), which checks its
    arguments here and hands every call to the grading process, where the
    simulator runs it on a ``Comm`` of its own (and checks it again: nothing
    from this process is believed). Group ranks travel, not global ones, as
    in the program's own calls."""

    isolated = True

    def __init__(self, link):
        self.link = link
        self.handles = {}            # (group id, stream id) -> the grader's Comm

    def _call(self, comm, method, *args, **kwargs):
        sid = comm._me.sid
        return self.link.call(sid, self.handles[(comm.group.gid, sid)], method, args, kwargs)

    def _request(self, comm, handle, out=None):
        if not isinstance(handle, wire.Handle):
            raise CommError("the grader did not make a request")
        return _Request(self, comm._me.sid, handle.id, out)

    @staticmethod
    def _expect(expect):
        shape, dtype = expect
        return dict(shape=None if shape is None else list(shape),
                    dtype=None if dtype is None else dtype.str)

    @staticmethod
    def filled(got, out):
        if out is not None and got is not None:
            out[...] = got            # recv(out=...) fills the rank's own array
            return out
        return got

    def send(self, comm, array, dst, chunk, op, tag):
        self._call(comm, "send", array, comm._index[dst], chunk=chunk, op=op, tag=tag)

    def isend(self, comm, array, dst, chunk, op, tag):
        return self._request(comm, self._call(comm, "isend", array, comm._index[dst], chunk=chunk,
                                              op=op, tag=tag))

    def recv(self, comm, src, expect, out, tag):
        got = self._call(comm, "recv", comm._index[src], tag=tag, **self._expect(expect))
        return self.filled(got, out)

    def irecv(self, comm, src, expect, out, tag):
        handle = self._call(comm, "irecv", comm._index[src], tag=tag, **self._expect(expect))
        return self._request(comm, handle, out)

    def sendrecv(self, comm, array, dst, src, chunk, op, tag):
        return self._call(comm, "sendrecv", array, comm._index[dst], comm._index[src], chunk=chunk,
                          op=op, tag=tag)

    def recv_any(self, comm, tag):
        src, array = self._call(comm, "recv_any", tag=tag)
        return comm._to_global[src], array

    def compute(self, comm, seconds, label, meta):
        self._call(comm, "compute", seconds, label, **meta)

    def memory(self, comm, label, nbytes):
        if nbytes is None:
            self._call(comm, "free", label)
        elif nbytes < 0:
            self._call(comm, "free", label, -nbytes)
        else:
            self._call(comm, "alloc", label, nbytes)

    def span_enter(self, comm, name):
        sid, link = comm._me.sid, self.link
        link.tokens += 1
        link.span(sid, ["enter", self.handles[(comm.group.gid, sid)], str(name), link.tokens])
        return link.tokens

    def span_exit(self, comm, token):
        self.link.span(comm._me.sid, ["exit", token])

    def start(self, comm, fn, args, kwargs):
        """A work (see ``Comm.start``). ``fn`` and its arguments stay in this process:
        the grader gets only the name, and starts the work's thread when the
        simulator runs it."""
        name = getattr(fn, "__name__", "work")
        handle = self._call(comm, "start", name if type(name) is str else "work")
        if not isinstance(handle, wire.Handle):
            raise CommError("comm.start: the grader did not create a work")
        work = _Work(self, comm._me.sid, handle.id, name)
        with self.link.cond:
            self.link.pending[handle.id] = (work, comm, fn, args, kwargs)
        return work

    def new_group(self, comm, ranks, name):
        label, gid, handle = self._call(comm, "new_group", [comm._index[r] for r in ranks], name)
        # A label is a name or a tuple of ranks (hashable, as in ringlab.run): keep it a tuple.
        group = Group(tuple(ranks), tuple(label) if type(label) is list else label, gid)
        if handle is not None:
            self.handles[(gid, comm._me.sid)] = handle
        return group

    def split(self, comm, color, key, name):
        """The grader makes the groups and says only which one is this rank's:
        the other ranks' colors never reach this process."""
        got = self._call(comm, "split", color, key, name)
        if got is None:
            return None
        ranks, label, gid, handle = got
        self.handles[(gid, comm._me.sid)] = handle
        return Group(tuple(ranks), tuple(label) if type(label) is list else label, gid)

    def agree(self, comm, value, what):
        """Barriers only (``split`` has its own call). A barrier returns nothing:
        the values ranks pass to one never travel to the others."""
        self._call(comm, "agree", value, what)
        return [None] * comm.world_size


def _names(exc):
    """The names of an exception's classes, its own first (its MRO without object)."""
    return [c.__name__ for c in type(exc).__mro__ if c is not object][:20]


def rebuild_exception(names, message):
    """An exception of class ``names[0]`` saying ``message``, for the names of a
    class and its bases (``_names``): ringlab's CommError and Python's built-in
    exceptions are themselves; another class is rebuilt as a class of that name
    derived from the first of its bases that is one of those, so that a
    grader's ``isinstance(e, ValueError)`` holds for a learner's subclass of it."""
    names = [n for n in (names if type(names) is list else [names])
             if type(n) is str and n.isidentifier()][:20] or ["Exception"]
    known = [_known(n) for n in names]
    base = next((k for k in known if k is not None), Exception)
    cls = base if known[0] is base else type(names[0], (base,), {"__str__": BaseException.__str__})
    try:
        return cls(str(message))
    except Exception:  # noqa: BLE001 - a built-in that wants other arguments
        return type(names[0], (Exception,), {})(str(message))


def _known(name):
    if name == "CommError":
        return CommError
    cls = getattr(builtins, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


# =====================================================================================
# In the grading process (trusted)
# =====================================================================================
