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

from __future__ import annotations

import builtins
import contextlib
import functools
import gc
import importlib
import importlib.util
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import types
import traceback

import numpy as np

from ..comm import Comm, Group, RunResult, World, payload_key
from ..errors import CommError, ProgramTimeout, RankError, DeadlockError, UnreceivedMessagesError
from ..sim.world import Request, Work, World
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

def _rank_main(conn, program_bytes, memory_mb, banned=()):
    os.setpgrp()                     # its own process group: the grader kills it and its children
    _limit(memory_mb)
    _malloc_returns_memory()
    try:
        import cloudpickle
        _CONN[0] = conn
        _, x, args, kwargs, info = wire.recv(conn)
        # The guard goes up before the bytes are unpickled: unpickling runs code.
        with _no_reference(banned):
            # The grader reads this process's memory from outside (see
            # _RankProcess.resident): now, with the inputs here but nothing of the
            # program, and again once the program is loaded (what loading made).
            _import_what_it_names(program_bytes)
            _measured(conn, "ready")
            program = cloudpickle.loads(program_bytes)
            _measured(conn, "loaded")
            link = _LINK[0] = _Link(conn)
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
            wire.send(conn, [0, ["error", _names(e), str(e)[:2000], _rank_traceback(e)]])
    finally:
        os._exit(0)                  # no atexit handlers, no flushing of inherited state


def _measured(conn, what):
    """Say ``what`` and wait while the grader reads this process's memory."""
    wire.send(conn, [0, [what]])
    if wire.recv(conn) != ["measured"]:
        raise CommError("the grader did not measure this rank's memory")


def _import_what_it_names(data):
    """Import the modules the pickled program refers to (by a global, or as a
    module in its globals), before its memory is read: a module's code is not
    the program's data, and loading would import them anyway."""
    import pickletools
    names, recent, memo = [], [None, None], {}
    with contextlib.suppress(Exception):
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                memo[len(memo) if op.name == "MEMOIZE" else arg] = recent[-1]
                continue
            value = memo.get(arg) if op.name in ("GET", "BINGET", "LONG_BINGET") else arg
            if op.name == "GLOBAL" and isinstance(arg, str):
                names.append(arg.partition(" ")[0])
            elif op.name == "STACK_GLOBAL" and isinstance(recent[0], str):
                names.append(recent[0])
            elif isinstance(value, str) and recent[-1] == ("global", "subimport"):
                names.append(value)
            recent = [recent[-1], ("global", recent[-1]) if op.name == "STACK_GLOBAL" else
                      ("global", arg.partition(" ")[2]) if op.name == "GLOBAL" else
                      value if isinstance(value, str) else None]
    for name in dict.fromkeys(names):
        if type(name) is str and all(p.isidentifier() for p in name.split(".")):
            with contextlib.suppress(Exception):
                importlib.import_module(name)


class ReferenceCalled(Exception):
    """The program ran one of ringlab's answers to an exercise (``ringlab.answers``)."""


def _answers(banned):
    """The functions named in ``banned`` (``module:qualname``, see
    ``ringlab.answers.name_of``), each with the words that name it, and the
    ``(file, qualname)`` of their code. A decorated answer counts through to the
    function it wraps (``@collective``'s wrapper is shared code; what it wraps is not)."""
    found, codes = [], {}
    for entry in banned:
        module, _, qualname = str(entry).partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        exercises = ", ".join(getattr(obj, "__ringlab_answers__", ()))
        words = f"ringlab's own answer to {exercises} ({module}.{qualname})"
        while isinstance(obj, types.FunctionType):
            if obj.__closure__ is None:
                codes[(obj.__code__.co_filename, obj.__code__.co_qualname)] = words
            obj = getattr(obj, "__wrapped__", None)
    return codes


def _report_and_exit(why, kind="ReferenceCalled"):
    """Tell the grading process and end this rank now: an exception could be
    caught by the program, ``os._exit`` cannot. ``kind``: the exception's name
    in the report (ReferenceCalled, or NotAllowed for a way around isolation)."""
    link = _LINK[0]
    with contextlib.suppress(BaseException):
        if link is None:
            wire.send(_CONN[0], [0, ["error", kind, why, ""]])
        else:                         # on the stream of the thread that called
            link.send(getattr(link.local, "sid", 0) or 0, ["error", kind, why, ""])
    os._exit(0)


_CONN = [None]        # the rank's pipe to the grader, for _report_and_exit
_LINK = [None]        # and its _Link, once the program runs
_THREAD_START = {threading.Thread._bootstrap_inner.__code__}
# Ways out of what the grader watches: another process (its memory and its
# reads are not this rank's), memory that tracemalloc does not see (mmap), a
# second name for a reference file (a hard link). Audit event -> words.
FORBIDDEN_EVENTS = {"mmap.__new__": "mmap (memory the grader's measurement does not see)",
                    "os.link": "os.link", "os.symlink": "os.symlink",
                    "subprocess.Popen": "a subprocess", "os.system": "os.system",
                    "os.posix_spawn": "os.posix_spawn", "os.fork": "os.fork",
                    "os.forkpty": "os.forkpty", "os.spawn": "os.spawn*",
                    # Ways to another rank's process: files it could read (see
                    # _WRITES), names and times of files, signals, sockets.
                    "os.mkdir": "os.mkdir", "os.rename": "os.rename", "os.remove": "os.remove",
                    "os.rmdir": "os.rmdir", "os.chmod": "os.chmod", "os.chown": "os.chown",
                    "os.utime": "os.utime", "os.truncate": "os.truncate",
                    "os.setxattr": "os.setxattr", "os.kill": "os.kill", "os.killpg": "os.killpg",
                    "socket.__new__": "a socket", "socket.socketpair": "a socket"}
# open() for writing: ranks are separate processes so that they share nothing
# but messages; a file one rank writes and another reads would be a channel the
# trace does not see (a red team summed a vector that way, with no messages).
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_ARMED = [False]      # while the program runs


def _poison(codes):
    """Replace the code of every banned answer in this process by a stub that
    ends the rank: the answer no longer exists here, however the program
    reaches it (sys.modules, gc, a package attribute, a copy of the function,
    a thread without the profile hook). The originals are dropped, not kept."""
    for obj in gc.get_objects():
        if not isinstance(obj, types.FunctionType) or obj.__closure__:
            continue
        words = codes.get((obj.__code__.co_filename, obj.__code__.co_qualname))
        if words is not None:
            # The stub runs with the answer's own globals: its one name goes there.
            obj.__globals__["_ringlab_answer_called"] = _report_and_exit
            stub = {}
            exec(compile(f"def stub(*args, **kwargs):\n    _ringlab_answer_called("
                         f"{'the program called ' + words!r})\n",
                         "<answer removed by the grader>", "exec"), stub)
            obj.__code__ = stub["stub"].__code__


def _audit(files):
    """An audit hook (it cannot be removed): while the program runs, switching
    the profiler off, reading a reference's source or loading C code through
    ctypes ends the rank."""
    sources = {f for f in files} | {importlib.util.cache_from_source(f) for f in files
                                     if f.endswith(".py")}
    # Files are compared by inode too: a hard link to a reference has another path.
    inodes = set()
    for f in sources:
        with contextlib.suppress(OSError):
            st = os.stat(f)
            inodes.add((st.st_dev, st.st_ino))

    def hook(event, args):
        if not _ARMED[0]:
            return
        if event in FORBIDDEN_EVENTS or event.startswith("os.exec"):
            _report_and_exit(f"the program used {FORBIDDEN_EVENTS.get(event, event)}, which "
                             f"the grader does not allow", "NotAllowed")
        if event in ("sys.setprofile", "sys.settrace"):
            # A new thread installs threading's hook (ours) from its bootstrap: allowed.
            if sys._getframe(1).f_code in _THREAD_START:
                return
            _report_and_exit(f"the program called {event} (the grader's guard against "
                             f"running ringlab's own answers)")
        elif event.startswith("ctypes."):
            _report_and_exit("the program used ctypes, which the grader does not allow")
        elif event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if isinstance(args[2], int) and args[2] & _WRITES and path != os.devnull:
                _report_and_exit(f"the program opened a file for writing ({path}): ranks "
                                 f"share data only through messages", "NotAllowed")
            try:
                st = os.stat(path)
                linked = (st.st_dev, st.st_ino) in inodes
            except OSError:
                linked = False
            if path in sources or linked:
                _report_and_exit(f"the program read the source of ringlab's answers "
                                 f"({os.path.basename(path)}), which hold an exercise's answer")
    sys.addaudithook(hook)


@contextlib.contextmanager
def _no_reference(banned):
    """Fail the rank if, while the program runs, one of the ``banned`` answers
    (ringlab's own answers to this exercise, or to another it may not build
    on) is called, however the program reached it (an import under a name
    built at run time, a package attribute, gc). Three layers: the answers'
    code is replaced by a stub that ends the rank; a profile hook sees every
    call (on this thread and on the threads of ``comm.start`` works); an audit
    hook ends the rank if the program switches the profiler off, reads the
    source of a module that holds an answer (to make a fresh copy) or uses
    ctypes. The audit hook also keeps the ranks apart: no file writes,
    sockets, signals or subprocesses, so the messages are the only way between
    them."""
    codes = _answers(banned)
    _poison(codes)
    sys.dont_write_bytecode = True       # an import must not write a .pyc: no writes at all
    _audit({os.path.realpath(file) for file, _ in codes})
    hit = []

    def hook(frame, event, arg):
        if event == "call" and not hit:
            words = codes.get((frame.f_code.co_filename, frame.f_code.co_qualname))
            if words is not None:
                hit.append(words)
    if codes:                  # a profile hook slows every call: only where it watches something
        sys.setprofile(hook)
        threading.setprofile(hook)
    _ARMED[0] = True
    try:
        yield
    finally:
        _ARMED[0] = False
        if codes:
            sys.setprofile(None)
            threading.setprofile(None)
        if hit:
            raise ReferenceCalled(f"the program called {hit[0]}")


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


def _malloc_returns_memory():
    """Make freed arrays leave the process's resident memory at once, so that
    the grader's reading of it (from outside) tracks what the rank holds: every
    block of 128 KiB or more gets pages of its own (mmap), given back when freed.
    (By default glibc raises that threshold after each such free, and keeps the
    pages.) M_MMAP_THRESHOLD is -3, M_TRIM_THRESHOLD -1 in mallopt's numbering."""
    with contextlib.suppress(Exception):
        import ctypes
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 128 * 1024)
        libc.mallopt(-1, 128 * 1024)


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


# Files whose frames a learner's traceback leaves out: this module and Comm's.
_OURS = {__file__, sys.modules[Comm.__module__].__file__}


def _rank_traceback(exc):
    """The program's traceback, without this module's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename not in _OURS]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    return (text + "".join(traceback.format_exception_only(type(exc), exc)))[-8000:]


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
        self.local = threading.local()          # .sid: the stream id of this thread
        self.local.sid = 0

    def send(self, sid, body):
        with self.lock:
            wire.send(self.conn, [sid, body])

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
            link.send(sid, ["error", _names(e), str(e)[:2000], _rank_traceback(e)])


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
        return self._call(comm, "span_enter", name)

    def span_exit(self, comm, token):
        self._call(comm, "span_exit", token)

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

    def agree(self, comm, value, what):
        return self._call(comm, "agree", value, what)


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

    def __init__(self, ctx, rank, program_bytes, memory_mb, deadline, banned=()):
        self.rank, self.deadline = rank, deadline
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_rank_main, args=(child, program_bytes, memory_mb, banned),
                                   daemon=True, name=f"ringlab-rank-{rank}")
        with _without_main():
            self.process.start()
        child.close()
        self.objects, self.actors = {}, {}     # handle -> (stream id, object); stream id -> actor
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
        self.resident = {"before": before, "loaded": loaded, "peak": loaded, "hwm": None,
                         "marks": []}
        return self._serve(0)

    def _serve(self, sid):
        """Answer stream ``sid``'s calls until it is done; its result (the program's)."""
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
            rss, sent = self._rss(), len(self.world.events)
            if rss is not None:
                self.resident["peak"] = max(self.resident["peak"] or 0, rss)
            if _is_mark(message):
                self.resident["marks"].append((message[3][0][1], rss))
            try:
                answer = ["ok", self._dispatch(sid, *message[1:])]
            except Exception as e:  # noqa: BLE001 - the rank's mistake: raised in its own code
                answer = ["raise", _names(e), str(e)]
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
            elif method == "agree" and len(args) == 2 and args[1] in ("split", "barrier"):
                return obj._world.agree(obj, args[0], args[1])
            elif method == "span_enter" and len(args) == 1:
                span = obj.span(args[0])
                span.__enter__()
                return wire.Handle(self._register(sid, span), ["span"])
            elif method == "span_exit" and len(args) == 1 and isinstance(args[0], wire.Handle):
                _, span = self.objects.pop(args[0].id, (None, None))
                if isinstance(span, contextlib.AbstractContextManager):
                    span.__exit__(None, None, None)
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
        if self.resident is None:
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
        if not (type(message) is list and len(message) == 2 and type(message[0]) is int):
            raise RankProcessDied(f"rank {self.rank}'s process sent a message without its stream")
        if message[0] != sid:
            raise RankProcessDied(f"rank {self.rank}'s process sent a message out of turn (from stream "
                                  f"{message[0]} while stream {sid} had the turn): did the program call "
                                  f"the communicator from a thread of its own?")
        return message[1]

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
            and args[1] == "barrier" and type(args[0]) is tuple and len(args[0]) == 2
            and args[0][0] == MARK)


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
        ctx.set_forkserver_preload(PRELOAD)
        _CONTEXT = ctx
    return _CONTEXT


def run_isolated(program, inputs, *, args=(), kwargs=None, mode="buffered", timeout=10.0,
                 check_unreceived=True, record_payloads=False, network=None, memory_mb=512,
                 backend="sim", banned=()):
    """``ringlab.run`` with one process per rank (see the module's docstring).

    ``program`` is a ``Submission`` (cloudpickle bytes) or a function (pickled
    here, by value). ``timeout`` covers the whole run, process starts included.
    ``banned``: the answers the program must not call (``module:qualname``,
    see ``ringlab.answers.forbidden``): a call fails the rank.
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
        ranks = [_RankProcess(ctx, r, data, memory_mb, deadline, tuple(banned))
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


def runner(memory_mb=512, banned=()):
    """A drop-in for ``ringlab.run`` that runs isolated (``grade_cases(runner=...)``),
    with the grader's time limit times ``ISOLATED_SLOWDOWN``."""
    def run(program, inputs, timeout=10.0, **kw):
        timeout = None if timeout is None else timeout * ISOLATED_SLOWDOWN
        return run_isolated(program, inputs, memory_mb=memory_mb, banned=banned,
                            timeout=timeout, **kw)
    return run
