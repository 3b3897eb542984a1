"""What a rank process may not do while the learner's program runs in it.

Inside an isolated run (see the package's docstring) the program has a process
of its own; these guards keep it to its own data and its own work:

* ringlab's answers to the exercise (``ringlab.answers``) are removed from the
  process: their code is replaced by a stub that ends the rank;
* an audit hook (which cannot be removed) ends the rank if the program makes a
  function of a copy of an answer's code or runs one (however the copy was
  made: pickled by value, ``types.CodeType``, ``code.replace``, ``marshal``,
  compiled from the answer's source), writes a file, makes or renames one,
  locks one, opens a directory or /proc beyond its own process, signals, opens
  a socket, maps memory, forks or starts a process (ways to another rank's
  process, or around the grader's memory reading), loads C code through
  ctypes, asks gc for its objects or another thread for its frames;
* functions that reach other processes without an audit event are taken away
  (``_no_hiding_places``), and a rank keeps no file the zygote had open;
* limits: address space, file size; the process is not dumpable; malloc gives
  freed arrays back to the system, so the grader's reading of the process's
  resident memory, from outside, tracks what it holds.

The program may change anything in its process that Python lets it change: a
module's globals (this module's too), builtins, the stdlib's functions. So the
hook keeps no state the program could reach and calls no Python function the
program could have replaced (``_hook``); it reports over the pipe with bytes
it writes itself (``_reporter``).
"""

from __future__ import annotations

import _json
import contextlib
import gc
import importlib
import os
import resource
import stat
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


CONN = [None]        # the rank's pipe to the grader (rank_main sets it before guard())
LINK = [None]        # and its _Link, once the program runs
STREAM = threading.local()      # .sid: the stream id of the calling thread (see rank._Link)
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
                    "os.mkfifo": "os.mkfifo", "os.mknod": "os.mknod",
                    # An interpreter of its own: no audit hook of this one runs there.
                    "cpython.PyInterpreterState_New": "a subinterpreter",
                    # Every object of the process (in one process, the other ranks'
                    # data; in a rank's, the guard's own), every thread's frame.
                    **{f"gc.{name}": f"gc.{name} (a way to every object of the process)"
                       for name in ("get_objects", "get_referrers", "get_referents")},
                    "sys._current_frames": "sys._current_frames (every thread's frame)",
                    # What other processes see: locks, a database file written in C.
                    "fcntl.fcntl": "fcntl (flags and locks other processes see)",
                    "fcntl.ioctl": "ioctl", "fcntl.flock": "file locks", "fcntl.lockf": "file locks",
                    "os.lockf": "file locks", "os.removexattr": "os.removexattr",
                    "sqlite3.connect": "sqlite3 (a database is a file, written in C)"}
# open() for writing: ranks are separate processes so that they share nothing
# but messages; a file one rank writes and another reads would be a channel the
# trace does not see (a red team summed a vector that way, with no messages).
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _reporter(conn):
    """``report(why, kind)``: tell the grading process on ``conn`` that this rank
    broke a rule (``kind``: the exception's name in its report, ReferenceCalled or
    NotAllowed) and end the process, however the program has changed the modules
    of its process: it uses only C functions bound here, and writes the message's
    bytes itself (the wire's framing, ``pipe.send``: multiprocessing's 4-byte
    length, a line of sizes, a line of the wire's JSON). An exception could be
    caught by the program; ``os._exit`` cannot. The stream is the calling thread's, so the grader
    hears it where it waits (a ``comm.start`` work runs on a thread of its own)."""
    fd, write, exit_now, quote = conn.fileno(), os.write, os._exit, _json.encode_basestring_ascii
    _getattr, _type, _int, _len, stream = getattr, type, int, len, STREAM

    def report(why, kind):
        try:
            sid = _getattr(stream, "sid", 0)
            body = ('{"n": 0, "b": []}\n{"l": [%d, {"l": ["error", %s, %s, ""]}]}\n' % (
                sid if _type(sid) is _int else 0, quote(kind), quote(why[:600]))).encode("ascii")
            message = _len(body).to_bytes(4, "big", signed=True) + body
            while message:       # small: the kernel takes it in one write
                message = message[write(fd, message):]
        finally:
            exit_now(0)
    return report


CODE = object()         # marks, in a shape's constants, the shape of a nested code object


def shape(code):
    """What of an answer's ``code`` a copy keeps: its bytecode, constants (the
    shape of code among them marked by ``CODE``), names and variable names."""
    consts = tuple((CODE, shape(c)) if type(c) is types.CodeType else c for c in code.co_consts)
    return code.co_code, consts, code.co_names, code.co_varnames


def _copy_finder(shapes):
    """``copied(code)``: the words of the first answer (``shapes``: ``{shape(answer's
    code): words}``) that ``code``, or code among its constants, is a copy of; else
    None. A copy has the answer's bytecode, and the answer's constants (but its
    docstring), names and variable names first among its own: what a copy keeps
    however it was made (pickled by value, rebuilt with ``types.CodeType`` or
    ``code.replace``, compiled from the answer's source, under ``-OO``, with another
    docstring, with constants, names or variables added at the end). Code whose
    bytecode differs is not a copy: a program that edits the answer's bytecode has
    written its own (see ``_hook``).

    Made by a function so that the audit hook has one of its own over names bound
    here; it compares the program's objects by type first, with ``is``, and by
    value only if they are of a plain type: ``==`` or a hash on an object of the
    program's could run the program's code inside the hook."""
    by_bytecode = {}
    for (bytecode, *rest), words in shapes.items():
        by_bytecode.setdefault(bytecode, []).append((bytecode, *rest, words))
    by_bytecode = types.MappingProxyType(dict(zip(by_bytecode,
                                                  map(tuple, by_bytecode.values()))))
    _type, _len, _range, _str, _bytes = type, len, range, str, bytes
    _code, _tuple, _frozenset, mark = types.CodeType, tuple, frozenset, CODE
    plain = (type(None), bool, int, float, complex, str, bytes, type(...))

    def is_plain(kind):
        for p in plain:
            if kind is p:
                return True
        return False

    def same_const(mine, theirs):
        """Whether constant ``mine`` (the program's) is the answer's ``theirs``."""
        kind = _type(theirs)
        if kind is _tuple and _len(theirs) == 2 and theirs[0] is mark:
            return _type(mine) is _code and same(mine, theirs[1])
        if _type(mine) is not kind:
            return False
        if kind is _tuple:
            if _len(mine) != _len(theirs):
                return False
            for i in _range(_len(theirs)):
                if not same_const(mine[i], theirs[i]):
                    return False
            return True
        if kind is _frozenset:
            for item in mine:
                if not is_plain(_type(item)):
                    return False
            return mine == theirs
        return is_plain(kind) and mine == theirs

    def same(code, answer):
        bytecode, consts, names, varnames = answer[:4]
        if (code.co_code != bytecode or code.co_names[:_len(names)] != names
                or code.co_varnames[:_len(varnames)] != varnames
                or _len(code.co_consts) < _len(consts)):
            return False
        mine = code.co_consts
        for i in _range(_len(consts)):
            docstring = i == 0 and (consts[0] is None or _type(consts[0]) is _str)
            if not docstring and not same_const(mine[i], consts[i]):
                return False
        return True

    def copied(code):
        todo = [code]
        while todo:
            value = todo.pop()
            kind = _type(value)
            if kind is _code:
                for answer in by_bytecode.get(value.co_code, ()):
                    if same(value, answer):
                        return answer[4]
                todo += value.co_consts
            elif kind is _tuple or kind is _frozenset:   # code in them: only made by hand
                todo += value
        return None
    return copied


def _poison(codes):
    """Replace the code of every banned answer in this process by a stub that
    ends the rank: the answer no longer exists here, however the program
    reaches it (sys.modules, a package attribute, the function's ``__wrapped__``).
    The originals are dropped, not kept: only their shapes are (returned,
    ``{shape(code): words}``), to know a copy of them (``_copy_finder``)."""
    shapes, stubs_report = {}, _reporter(CONN[0])

    def called(words):              # a reporter of the stubs' own: the program can reach it
        stubs_report(words, "ReferenceCalled")
    for key, variants in _optimized(codes).items():
        for variant in variants:                   # the same source under -O and -OO
            shapes[variant] = codes[key]
    for obj in _functions(codes):
        code = obj.__code__
        words = codes.get((code.co_filename, code.co_qualname))
        if words is not None:
            shapes[shape(code)] = words
            # The stub runs with the answer's own globals: its one name goes there.
            obj.__globals__["_ringlab_answer_called"] = called
            obj.__code__ = _stub(f"the program called {words}", code.co_freevars)
    return shapes


# The zygote's pid, its functions by (file, qualname), and its answers' shapes
# under -O and -OO by (file, qualname): see index_functions.
_INDEX = [None, {}, {}]


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
    from ... import answers
    _INDEX[:] = [os.getpid(), index, _optimized(_answers(answers.forbidden(None)))]


def _forked_from_index():
    """Whether this is a rank process (``rank_main`` has set ``CONN``) forked from the
    process that built ``_INDEX``: then the index holds what this process holds."""
    return CONN[0] is not None and _INDEX[0] == os.getppid()


def _functions(codes):
    """The function objects that may hold one of ``codes``: from the zygote's index
    if this is a rank process (``rank_main`` has set ``CONN``) forked from the
    process that built the index (nothing has made a function since but our own
    start-up) and every answer's module was loaded there; else every function of
    the process."""
    index = _INDEX[1]
    if _forked_from_index() and all(key in index for key in codes):
        return [fn for key in codes for fn in index[key]]
    gc.unfreeze()        # gc.get_objects() leaves out frozen objects (the zygote freezes its own)
    return [obj for obj in gc.get_objects() if type(obj) is types.FunctionType]


def _optimized(keys):
    """``{(file, qualname): [shape of that function compiled from its file with -O,
    with -OO]}`` for the functions ``keys`` name: what a program that compiles an
    answer's source with ``optimize=`` 1 or 2 makes (-OO drops the docstring, and
    the constants after it move: other bytecode, the same answer). From the
    zygote's index where it has them (``index_functions``), else compiled now."""
    known = _INDEX[2] if _forked_from_index() else {}
    found, files = {}, {}
    for key in keys:
        if key in known:
            found[key] = known[key]
            continue
        file, qualname = key
        if file not in files:
            try:
                with open(file, "rb") as f:
                    source = f.read()
                files[file] = [compile(source, file, "exec", dont_inherit=True, optimize=level)
                               for level in (1, 2)]
            except (OSError, SyntaxError, ValueError):
                files[file] = []
        found[key] = [shape(c) for module in files[file] for c in _nested(module)
                      if c.co_qualname == qualname]
    return found


def _nested(code):
    """``code`` and every code object among its constants, at any depth."""
    yield code
    for const in code.co_consts:
        if type(const) is types.CodeType:
            yield from _nested(const)


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


def _rule():
    """``why(event, args)``: words for an audited ``event`` by which a rank could
    reach another rank's data or process outside the messages (a file written, a
    socket, a signal, another process's memory, ...), or None. The rule of
    isolated runs, which the self-check applies too (``ringlab.grading.kit.apart``)
    so that both give one verdict. Made by a function so that the rank's audit hook
    has a copy of its own: everything it uses is bound here, where the program
    cannot rebind it (``os.path.realpath`` is Python code over module globals, so
    paths are resolved here with ``os.lstat`` and ``os.readlink``)."""
    table = types.MappingProxyType(dict(FORBIDDEN_EVENTS))
    writes, getpid, getcwd, lstat, readlink = _WRITES, os.getpid, os.getcwd, os.lstat, os.readlink
    is_link, _type, _str, _bytes, _int, _len = stat.S_ISLNK, type, str, bytes, int, len
    _OSError, _TypeError = OSError, TypeError
    stat_, is_dir = os.stat, stat.S_ISDIR
    walks = frozenset(("os.listdir", "os.scandir", "os.chdir"))
    # What the kernel says of the machine, the same for every process: readable.
    kernel_facts = frozenset(f"/proc/{name}" for name in (
        "cpuinfo", "meminfo", "version", "uptime", "loadavg", "stat", "filesystems"))
    # An exact copy of a str (bytes) subclass's value, in C: nothing of the program's runs.
    str_of, bytes_of = str.__str__, bytes.__bytes__

    def real(path):
        """``path`` with every symbolic link and ``..`` resolved, as the kernel opens it."""
        todo = (path if path.startswith("/") else getcwd() + "/" + path).split("/")[::-1]
        done, links = [], 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                done = done[:-1]
                continue
            here = "/" + "/".join(done + [part])
            try:
                mode = lstat(here).st_mode
            except _OSError:             # not there (yet): the rest is taken as written
                mode = 0
            if mode and is_link(mode) and links < 40:
                links += 1
                target = readlink(here)
                done = [] if target.startswith("/") else done
                todo += target.split("/")[::-1]
            else:
                done.append(part)
        return "/" + "/".join(done)

    def beyond_own_process(path):
        """Whether ``path`` (resolved) is under /proc but not this process's own."""
        parts = path.split("/")
        return _len(parts) > 1 and parts[1] == "proc" and (_len(parts) < 3 or parts[2] != f"{getpid()}")

    def why(event, args):
        if event in table or event.startswith("os.exec"):
            return f"the program used {table.get(event, event)}, which the grader does not allow"
        if event == "resource.prlimit":        # another process's limits: a channel
            pid = args[0] if _len(args) else None
            if _type(pid) is not _int or pid != 0 and pid != getpid():
                return "the program used resource.prlimit on another process, which the grader does not allow"
            return None
        if event in walks and _len(args) and _type(args[0]) is _str:
            path = real(args[0])          # a directory of /proc (another process's fds)
            if beyond_own_process(path):
                return (f"the program looked into {path}: /proc beyond the rank's own process "
                        f"is not a rank's to read")
            return None
        if event != "open":
            return None
        path = args[0]
        kind = _type(path)                    # with is: == on a type of the program's runs its code
        if kind is not _str and kind is not _bytes:
            try:
                path = str_of(path)           # a str subclass's path (TypeError: not a str)
            except _TypeError:
                try:
                    path = bytes_of(path)
                except _TypeError:
                    return None               # a file descriptor
            kind = _type(path)
        path = real(path if kind is _str else path.decode("utf-8", "surrogateescape"))
        if _type(args[2]) is _int and args[2] & writes and path != "/dev/null":
            return (f"the program opened a file for writing ({path}): ranks share data only "
                    f"through messages (print instead: ringlab grade shows nothing of it, "
                    f"and the self-check does)")
        try:
            directory = is_dir(stat_(path).st_mode)
        except _OSError:
            directory = False
        if directory:       # a directory's descriptor as dir_fd: a path this rule never sees
            return (f"the program opened the directory {path}: a rank opens files, not "
                    f"directories (list them with os.listdir)")
        if path not in kernel_facts and beyond_own_process(path):
            return (f"the program opened {path}: /proc beyond the rank's own process (another "
                    f"process's memory and files, the kernel's tables of locks) is not a "
                    f"rank's to read")
        if path.startswith(("/dev/shm", "/run/shm")):
            return f"the program opened {path}: shared memory is a way between ranks outside the messages"
        if path.endswith(".ipynb"):
            return f"the program opened {path}: a rank runs the program it was given, not a notebook's cells"
        return None
    return why


way_between_ranks = _rule()


def _hook(shapes, report):
    """The rank's audit hook (one cannot remove it): ends the rank by ``report`` when
    the program breaks the rule of isolated runs (``_rule``), or makes a function
    of, or runs, a copy of one of ringlab's answers (``shapes``: ``{shape(its
    code): words}``, ``_copy_finder``): at ``function.__new__`` (unpickling a
    function, ``types.FunctionType``), ``exec`` (``exec`` and ``eval`` of code or
    text, an import) and setting a function's ``__code__``, every code object in
    the code (its functions and comprehensions) is checked. Code alone does
    nothing: it runs only through one of these, or through bytecode written by
    hand (see below).

    The program may change anything in its process that Python lets it change, so
    the hook keeps no state, looks up no name at run time (every name in it is
    bound here, before the program runs) and runs none of the program's code: it
    switches the garbage collector off while it runs (a collection could run a
    finalizer of the program's, which could reach the hook's frame), compares the
    program's objects by type with ``is`` before any ``==``, and never raises (a
    traceback would hold its frame). What would reach the hook's objects is not
    allowed: gc's ways to every object, other threads' frames, Python signal
    handlers (``_no_hiding_places``).

    Out of its reach, as of any guard inside CPython: bytecode written by hand.
    CPython does not verify bytecode (a ``LOAD_CONST`` past the constants reads
    whatever memory is there), so a program that brings its own can do anything
    in its process; and editing the answer's bytecode is writing one's own."""
    copied, apart = _copy_finder(shapes), _rule()
    watched = frozenset(("function.__new__", "exec", "object.__setattr__", "open",
                         "resource.prlimit", "os.listdir", "os.scandir", "os.chdir",
                         *FORBIDDEN_EVENTS))
    special = ("os.exec", "ctypes.")
    _type, _str, _code, _len, _BaseException = type, str, types.CodeType, len, BaseException
    gc_on, gc_off, gc_enabled = gc.enable, gc.disable, gc.isenabled

    def check(event, args):
        words = apart(event, args)
        if words:
            report(words, "NotAllowed")
        if event == "object.__setattr__":         # f.__code__ = code
            named_code = _len(args) == 3 and _type(args[1]) is _str and args[1] == "__code__"
            code = args[2] if named_code else None
        else:
            code = args[0] if _len(args) else None
        if event in ("function.__new__", "exec", "object.__setattr__"):
            if _type(code) is _code:
                words = copied(code)
                if words is not None:
                    report(f"the program made a copy of {words}", "ReferenceCalled")
        elif event.startswith("ctypes."):
            report("the program used ctypes, which the grader does not allow", "NotAllowed")

    def hook(event, args):
        # Nothing may leave the hook, not even a RecursionError that a call at the
        # program's recursion limit raises: its traceback would hold the hook's
        # frame, and through it the hook's closures. If even the report fails, the
        # rank waits here until the grader's time limit ends it.
        try:
            if _type(event) is not _str:        # sys.audit(a str subclass of the program's)
                report("the program raised an audit event whose name is not a str",
                       "NotAllowed")
            if event not in watched and not event.startswith(special):
                return              # most events (attribute reads): nothing to check, nothing made
            was_on = gc_enabled()
            gc_off()
            try:
                check(event, args)
            finally:
                if was_on:
                    gc_on()
        except _BaseException:      # noqa: BLE001 - see above
            try:
                report(f"the grader could not check what the program did ({event[:80]!r})",
                       "NotAllowed")
            except _BaseException:  # noqa: BLE001
                while True:
                    pass
    return hook


def _no_hiding_places():
    """Take away, before the program runs, what neither the audit hook nor the
    grader's reading of the rank's memory would see:

    * POSIX shared memory (``multiprocessing.shared_memory``: a channel between
      ranks) and kernel buffers (memfd, pipes to oneself, eventfds: memory the
      grader's reading does not see): calling or importing them fails;
    * subinterpreters and CPython's test modules: importing them fails;
    * ways to other processes that raise no audit event (``_posixsubprocess``'s
      ``fork_exec``, pidfds, another process's priority): they are taken away;
    * signal handlers written in Python: one runs between any two bytecodes of
      the main thread, the audit hook's too, and is handed the frame it stopped
      (the hook's, and through it the hook's objects). Those set go back to the
      system's default, ``signal.signal`` goes, and so does ``_imp``'s way to make
      a fresh ``_signal`` module (every other built-in module is loaded first)."""
    for name in ("_posixshmem", "multiprocessing.shared_memory",
                 # Subinterpreters (no audit hook of this interpreter runs in them) and
                 # CPython's own test modules (C functions that bypass every check).
                 "_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi",
                 "_testmultiphase", "_testbuffer", "_testimportmultiple", "_ctypes_test"):
        sys.modules[name] = None
    import posix
    for module in (os, posix):
        for name in ("pipe", "pipe2", "memfd_create", "eventfd", "openpty", "mkfifo", "mknod"):
            if hasattr(module, name):
                delattr(module, name)
    import _imp
    import _signal
    import signal
    for name in sys.builtin_module_names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    for number in range(1, _signal.NSIG):
        with contextlib.suppress(Exception):
            if callable(_signal.getsignal(number)):
                _signal.signal(number, _signal.SIG_DFL)
    import _posixsubprocess
    import subprocess
    for module, name in ((_signal, "signal"), (signal, "signal"), (_imp, "create_builtin"),
                         # A child process without an audit event (no hook of ours runs
                         # there), and subprocess's own name for it.
                         (_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec"),
                         (_signal, "pidfd_send_signal"), (signal, "pidfd_send_signal"),
                         (_signal, "pthread_kill"), (signal, "pthread_kill"),
                         *((m, name) for m in (os, posix) for name in (
                             # signals by pidfd; priorities, scheduling and process groups
                             # set and read across processes; the page cache's state
                             # (evicting pages, reading only if cached): channels
                             "pidfd_open", "getpriority", "setpriority", "sched_setaffinity",
                             "sched_setscheduler", "sched_setparam", "setpgid", "setsid",
                             "setpgrp", "posix_fadvise", "preadv", "pwritev"))):
        with contextlib.suppress(AttributeError):
            delattr(module, name)


def guard(banned):
    """For the rest of this process's life, keep the program from ringlab's
    ``banned`` answers (its own answers to this exercise, or to another it may
    not build on), however it reaches them, and keep the ranks apart (no file
    writes, sockets, signals, subprocesses: the messages are the only way between
    them). Two layers: the answers' code is replaced by a stub that ends the rank
    (``_poison``), and an audit hook ends the rank when the program makes a
    function of a copy of their code, or runs one, in any way Python does it
    (``_hook``). Call it once, after ``CONN`` is set and before the program's
    bytes are unpickled (unpickling makes the program's functions)."""
    codes = _answers(banned)
    shapes = _poison(codes)
    sys.dont_write_bytecode = True       # an import must not write a .pyc: no writes at all
    _no_hiding_places()
    sys.addaudithook(_hook(shapes, _reporter(CONN[0])))


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
