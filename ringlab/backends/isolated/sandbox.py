"""What a rank process may not do while the learner's program runs in it.

Inside an isolated run (see the package's docstring) the program has a process
of its own; these guards keep it to its own data and its own work:

* ringlab's answers to the exercise (``ringlab.answers``) are removed from the
  process: their code is replaced by a stub that ends the rank, and a profiler
  records every call, so that one into a copy of them fails the rank;
* an audit hook (which cannot be removed) ends the rank if the program writes a
  file, makes or renames one, signals, opens a socket, maps memory, forks or
  starts a process (ways to another rank's process, or around the grader's
  memory reading), switches the profiler off, loads C code through ctypes or
  reads the source of a module that holds an answer;
* limits: address space, file size; the process is not dumpable; malloc gives
  freed arrays back to the system, so the grader's reading of the process's
  resident memory, from outside, tracks what it holds.
"""

from __future__ import annotations

import _lsprof
import contextlib
import gc
import importlib
import importlib.util
import os
import resource
import sys
import threading
import types

from . import pipe as wire


def import_what_it_names(data):
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


def _answers(banned):
    """The functions named in ``banned`` (``module:qualname``, see
    ``ringlab.answers.name_of``): ``{(file, qualname) of their code: the words
    that name the answer}``. A decorated answer counts through to the function
    it wraps (``@collective``'s wrapper is code shared by every collective:
    only the function of the answer's own name counts)."""
    codes = {}
    for entry in banned:
        module, _, qualname = str(entry).partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        exercises = ", ".join(getattr(obj, "__ringlab_answers__", ()))
        words = f"ringlab's own answer to {exercises} ({module}.{qualname})"
        while type(obj) is types.FunctionType:
            if obj.__code__.co_qualname == qualname:
                codes[(obj.__code__.co_filename, qualname)] = words
            obj = getattr(obj, "__wrapped__", None)
    return codes


def _fingerprint(code):
    """What a copy of a code object keeps whatever its file and name: its
    bytecode, constants and names."""
    return (code.co_code, code.co_consts, code.co_names, code.co_varnames)


def _report_and_exit(why, kind="ReferenceCalled"):
    """Tell the grading process and end this rank now: an exception could be
    caught by the program, ``os._exit`` cannot. ``kind``: the exception's name
    in the report (ReferenceCalled, or NotAllowed for a way around isolation)."""
    link = LINK[0]
    with contextlib.suppress(BaseException):
        if link is None:
            wire.send(CONN[0], [0, ["error", kind, why, ""]])
        else:                         # on the stream of the thread that called
            link.send(getattr(link.local, "sid", 0) or 0, ["error", kind, why, ""])
    os._exit(0)


CONN = [None]        # the rank's pipe to the grader, for _report_and_exit
LINK = [None]        # and its _Link, once the program runs
_THREAD_START = {threading.Thread._bootstrap_inner.__code__}
_PROFILER = [None]     # the profiler that watches a rank's threads (see no_reference)
_WATCH = [None]       # the code of the one function that may switch it on
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
                    "socket.__new__": "a socket", "socket.socketpair": "a socket",
                    "os.mkfifo": "os.mkfifo", "os.mknod": "os.mknod"}
# open() for writing: ranks are separate processes so that they share nothing
# but messages; a file one rank writes and another reads would be a channel the
# trace does not see (a red team summed a vector that way, with no messages).
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_ARMED = [False]      # while the program runs


def _poison(codes):
    """Replace the code of every banned answer in this process by a stub that
    ends the rank: the answer no longer exists here, however the program
    reaches it (sys.modules, gc, a package attribute, a copy of the function,
    a thread without the profile hook). The originals are dropped, not kept:
    only their fingerprints are (``_fingerprint``), to know a copy of them."""
    prints = {}
    for obj in _functions(codes):
        code = obj.__code__
        words = codes.get((code.co_filename, code.co_qualname))
        if words is not None:
            prints[_fingerprint(code)] = words
            # The stub runs with the answer's own globals: its one name goes there.
            obj.__globals__["_ringlab_answer_called"] = _report_and_exit
            obj.__code__ = _stub(f"the program called {words}", code.co_freevars)
    return prints


# The zygote's functions by (file, qualname), and the zygote's pid: see index_functions.
_INDEX = [None, {}]


def index_functions():
    """Index every function object of this process by (file, qualname); run once
    in the zygote (``zygote.py``), after its imports, before any fork.

    A rank process must find every function that holds a banned answer
    (``_poison``). Looking for them in ``gc.get_objects()`` visits about 110,000
    objects, and in a freshly forked process that writes to every page of its
    memory (each object's reference count), which the kernel then copies: about
    140 ms per rank on a 2-core machine, more than most cases take to run."""
    index = {}
    for obj in gc.get_objects():
        if type(obj) is types.FunctionType:
            code = obj.__code__
            index.setdefault((code.co_filename, code.co_qualname), []).append(obj)
    _INDEX[:] = [os.getpid(), index]


def _functions(codes):
    """The function objects that may hold one of ``codes``: from the zygote's index
    if this is a rank process (``rank_main`` has set ``CONN``) forked from the
    process that built the index (nothing has made a function since but our own
    start-up) and every answer's module was loaded there; else every function of
    the process."""
    zygote, index = _INDEX
    if (CONN[0] is not None and zygote == os.getppid()
            and all(key in index for key in codes)):
        return [fn for key in codes for fn in index[key]]
    gc.unfreeze()        # gc.get_objects() leaves out frozen objects (the zygote freezes its own)
    return [obj for obj in gc.get_objects() if type(obj) is types.FunctionType]


def _stub(words, freevars):
    """A function's code that ends the rank with ``words``, with the same free
    variables as the code it replaces (a method that uses ``super()`` has one,
    ``__class__``; a function may replace only code of its own shape)."""
    lines = ["def outer():", *(f"    {name} = None" for name in freevars),
             "    def stub(*args, **kwargs):",
             *([f"        ({', '.join(freevars)},)"] if freevars else []),
             f"        _ringlab_answer_called({words!r})",
             "    return stub"]
    namespace = {}
    exec(compile("\n".join(lines), "<answer removed by the grader>", "exec"), namespace)
    return namespace["outer"]().__code__


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
        why = way_between_ranks(event, args)
        if why:
            _report_and_exit(why, "NotAllowed")
        if event in ("sys.setprofile", "sys.settrace"):
            # A new thread installs threading's hook (ours) from its bootstrap, which
            # then switches the grader's profiler on for it (watch(), no_reference).
            caller = sys._getframe(1)
            if event == "sys.setprofile" and (caller.f_code in _THREAD_START or (
                    caller.f_code is _WATCH[0] and _PROFILER[0] is not None
                    and caller.f_locals.get("profiler") is _PROFILER[0])):
                return
            _report_and_exit(f"the program called {event} (the grader's guard against "
                             f"running ringlab's own answers)")
        elif event.startswith("ctypes."):
            _report_and_exit("the program used ctypes, which the grader does not allow")
        elif event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            try:
                st = os.stat(path)
                linked = (st.st_dev, st.st_ino) in inodes
            except OSError:
                linked = False
            if path in sources or linked:
                _report_and_exit(f"the program read the source of ringlab's answers "
                                 f"({os.path.basename(path)}), which hold an exercise's answer")
    sys.addaudithook(hook)


def way_between_ranks(event, args):
    """Words for an audited ``event`` by which a rank could reach another rank's
    data or process outside the messages (a file written, a socket, a signal,
    another process's memory, ...), or None. The rule of isolated runs, which
    the self-check applies too (``ringlab.grading.kit.apart``), so that both
    give one verdict."""
    if event in FORBIDDEN_EVENTS or event.startswith("os.exec"):
        return f"the program used {FORBIDDEN_EVENTS.get(event, event)}, which the grader does not allow"
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if isinstance(args[2], int) and args[2] & _WRITES and path != os.devnull:
            return (f"the program opened a file for writing ({path}): ranks share data only "
                    f"through messages (print instead: ringlab grade shows nothing of it, "
                    f"and the self-check does)")
        why = _off_limits(path)
        if why:
            return f"the program opened {path}: {why}"
    return None


def _off_limits(path):
    """Why a rank may not open ``path``, even to read it, or ''. Another
    process's files under /proc (its memory: the grader's, another rank's),
    shared memory, and notebooks (the book's solutions are notebooks: running
    their cells is not the learner's own code)."""
    parts = path.split(os.sep)
    if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and int(parts[2]) != os.getpid():
        return "another process's memory and files are not a rank's to read"
    if path.startswith(("/dev/shm", "/run/shm")):
        return "shared memory is a way between ranks outside the messages"
    if path.endswith(".ipynb"):
        return "a rank runs the program it was given, not a notebook's cells"
    return ""


def _no_hiding_places():
    """Ways to hold data that neither an audited ``open`` nor the process's
    resident memory shows: POSIX shared memory (``multiprocessing.shared_memory``:
    a channel between ranks), and kernel buffers (memfd, pipes to oneself,
    eventfds: memory the grader's reading of the rank's memory does not see).
    Their functions are taken away before the program runs: calling or
    importing them fails."""
    for name in ("_posixshmem", "multiprocessing.shared_memory"):
        sys.modules[name] = None
    import posix
    for module in (os, posix):
        for name in ("pipe", "pipe2", "memfd_create", "eventfd", "openpty", "mkfifo", "mknod"):
            if hasattr(module, name):
                delattr(module, name)


@contextlib.contextmanager
def no_reference(banned):
    """Fail the rank if, while the program runs, one of the ``banned`` answers
    (ringlab's own answers to this exercise, or to another it may not build
    on) is called, however the program reached it (an import under a name
    built at run time, a package attribute, gc). Three layers: the answers'
    code is replaced by a stub that ends the rank; a profiler records every
    call (on this thread and on the threads of ``comm.start`` works), and a call
    of a copy of an answer fails the rank when the program returns; an audit
    hook ends the rank if the program switches the profiler off, reads the
    source of a module that holds an answer (to make a fresh copy) or uses
    ctypes. The audit hook also keeps the ranks apart: no file writes,
    sockets, signals or subprocesses, so the messages are the only way between
    them."""
    codes = _answers(banned)
    prints = _poison(codes)
    sys.dont_write_bytecode = True       # an import must not write a .pyc: no writes at all
    _no_hiding_places()
    _audit({os.path.realpath(file) for file, _ in codes})
    # One profiler for every thread (a profiler per thread would hold its own
    # records: a ZeRO-3 program's works, a thread each, grew the rank's memory by
    # 1 MiB a step). It records, in C, every call of Python code: about a tenth
    # of what a profile hook written in Python costs per call (that hook made a
    # ZeRO-3 case's ranks 1.7 times slower).
    profiler = _PROFILER[0] = _lsprof.Profiler(builtins=False)

    def watch():
        """Switch the profiler on for this thread. The audit hook lets only this
        function do it, and only for the grader's profiler."""
        profiler.enable()

    def on_new_thread(frame, event, arg):     # a thread's first event (threading.setprofile)
        watch()
    _WATCH[0] = watch.__code__
    if codes:                  # profiling slows every call: only where it watches something
        watch()
        threading.setprofile(on_new_thread)
    _ARMED[0] = True
    try:
        yield
    finally:
        _ARMED[0] = False
        if codes:
            sys.setprofile(None)
            threading.setprofile(None)
        words = _called(profiler, codes, prints)
        if words:               # as the answers' stubs report it: no traceback of ours
            _report_and_exit(f"the program called {words}")


def _called(profiler, codes, prints):
    """The words for a banned answer (or a copy of one) that ``profiler`` saw
    called, or None; the first of them in sorted order if several were (its
    records have no order)."""
    words = set()
    for entry in profiler.getstats():
        code = entry.code
        if type(code) is types.CodeType:
            found = codes.get((code.co_filename, code.co_qualname)) or prints.get(_fingerprint(code))
            if found is not None:
                words.add(found)
    return min(words) if words else None


def limit(memory_mb):
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


def malloc_returns_memory():
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


def warm_up():
    """Use numpy's BLAS once, before the grader first reads the process's memory:
    the first matrix product brings the library's pages and its work buffer into
    memory (about 4 MiB with OpenBLAS), which would otherwise be charged to the
    program's first step. Only in runs whose memory a grader reads (``run_isolated``'s
    ``warm_up``): it costs a rank about 40 ms."""
    import numpy as np
    a = np.ones((512, 512))
    float((a @ a)[0, 0] + (a[0] @ a).sum())
