"""The guard of `ringlab grade`'s rank processes against ringlab's own answers, layer by
layer: the answers' code is replaced by a stub (tests/grading/pipeline covers the ways to
reach it), and an audit hook fails a rank whose program makes a function of a *copy* of
an answer's code, however the copy was made and whatever the program changed first in
its process (the guard's own module, builtins, the stdlib)."""

import dis
import marshal
import os
import types
from multiprocessing import Pipe

import numpy as np
import pytest

from ringlab.backends.isolated import pipe, run_isolated, sandbox
from ringlab.collectives import allgather
from ringlab.errors import RankError

BANNED = ("ringlab.collectives.allgather:ring_allgather",)
ANSWER_IS = ("ringlab's own answer to ring_allgather, fix_ring_allgather "
             "(ringlab.collectives.allgather.ring_allgather)")
_ANSWER = allgather.ring_allgather
while hasattr(_ANSWER, "__wrapped__"):
    _ANSWER = _ANSWER.__wrapped__
# The answer's code, in a function of the program's own: what pasting the library's
# source into a notebook makes. No stub replaces it: only its code tells.
COPY = types.FunctionType(_ANSWER.__code__, {"np": np}, "my_allgather")
# The same code as data only (bytes and tuples): the program makes the copy as it runs.
_C = _ANSWER.__code__
FIELDS = [getattr(_C, "co_" + name) for name in (
    "argcount", "posonlyargcount", "kwonlyargcount", "nlocals", "stacksize", "flags", "code",
    "consts", "names", "varnames", "filename", "name", "qualname", "firstlineno", "linetable",
    "exceptiontable", "freevars", "cellvars")]
FIELDS[10:13] = ["mine.py", "mine", "mine"]                    # another file and name
MARSHALLED = marshal.dumps(_C.replace(co_filename="mine.py", co_name="mine"))
SOURCE_FILE = allgather.__file__


def copy_pickled(comm, x):
    return COPY(comm, x)


def copy_built_from_data(comm, x):
    import types
    return types.FunctionType(types.CodeType(*FIELDS), {"np": np})(comm, x)


def copy_unmarshalled_after_changing_the_guard(comm, x):
    import builtins
    import marshal
    import sys
    import types
    guard = sys.modules[sandbox.__name__]
    for name in list(vars(guard)):          # every name of the guard's module, and builtins
        if not name.startswith("__"):
            setattr(guard, name, None)
    builtins.type, builtins.len = (lambda *a: int), (lambda a: 0)
    return types.FunctionType(marshal.loads(MARSHALLED), {"np": np})(comm, x)


def copy_into_a_function_s_code(comm, x):
    import marshal
    import os

    def mine(comm, x):
        return None
    os._exit = lambda code: None              # the guard's exit, as the program sees it
    mine.__code__ = marshal.loads(MARSHALLED)
    return mine(comm, x)


def copy_compiled_from_the_source(comm, x):
    with open(SOURCE_FILE) as f:
        namespace = {"__name__": "mine"}
        exec(compile(f.read(), "mine.py", "exec"), namespace)
    return namespace["ring_allgather"](comm, x)


def copy_in_a_raw_thread(comm, x):
    import _thread
    import time
    import types
    out = []
    solo = types.SimpleNamespace(world_size=1, rank=0)        # sends nothing
    _thread.start_new_thread(lambda: out.append(types.FunctionType(
        types.CodeType(*FIELDS), {"np": np})(solo, x)), ())
    while not out:
        time.sleep(0.01)
    return out[0]


def copy_with_constants_names_and_variables_added(comm, x):
    import marshal
    import types
    code = marshal.loads(MARSHALLED)

    class Doc(str):                         # the docstring, of a type of the program's own
        pass
    code = code.replace(co_consts=(Doc("mine"),) + code.co_consts[1:] + (0.5, Doc("x")),
                        co_names=code.co_names + ("unused",),
                        co_varnames=code.co_varnames + ("unused",), co_nlocals=code.co_nlocals + 1)
    return types.FunctionType(code, {"np": np})(comm, x)


def copy_compiled_without_docstrings(comm, x):
    # -OO drops the docstring, and the constants after it move: other bytecode
    with open(SOURCE_FILE) as f:
        namespace = {"__name__": "mine"}
        exec(compile(f.read(), "mine.py", "exec", optimize=2), namespace)
    return namespace["ring_allgather"](comm, x)


COPIES = [copy_pickled, copy_built_from_data, copy_unmarshalled_after_changing_the_guard,
          copy_into_a_function_s_code, copy_compiled_from_the_source, copy_in_a_raw_thread,
          copy_with_constants_names_and_variables_added, copy_compiled_without_docstrings]


def gc_objects(comm, x):
    import gc
    gc.get_objects()
    return x


def other_threads_frames(comm, x):
    import sys
    sys._current_frames()                   # a thread's frame may be inside the hook
    return x


def objects_whose_comparisons_run_code(comm, x):
    """Fake audit events, and code with a constant, whose type's type compares and
    hashes with the program's code: the hook never runs it (from inside the hook it
    would reach the hook's frame)."""
    import sys
    import types
    ran = []

    class Meta(type):
        def __eq__(cls, other):
            ran.append(1)
            return False

        def __hash__(cls):
            ran.append(1)
            return 0

    class Odd(metaclass=Meta):
        pass
    odd = Odd()
    sys.audit("open", odd, "r", 0)
    sys.audit("exec", odd)
    sys.audit("object.__setattr__", odd, "__code__", odd)
    code = (lambda: 0).__code__
    types.FunctionType(code.replace(co_consts=code.co_consts + (odd, (odd,), frozenset([1]))), {})
    return np.array([float(len(ran))])


def subinterpreter(comm, x):
    import _xxsubinterpreters                # an interpreter that runs no audit hook of ours
    _xxsubinterpreters.create()
    return x


def recursion_at_the_hook(comm, x):
    """An event raised at the recursion limit: a RecursionError from inside the hook
    would carry the hook's frame in its traceback."""
    import sys
    seen = set()

    def deep(n):
        if n:
            return deep(n - 1)
        try:
            sys.audit("open", "/dev/null", "r", 0)
        except RecursionError as e:
            tb = e.__traceback__
            while tb is not None:
                seen.add(tb.tb_frame.f_code.co_filename)
                tb = tb.tb_next
    here, frame = 0, sys._getframe()
    while frame is not None:
        here, frame = here + 1, frame.f_back
    limit = sys.getrecursionlimit() - here
    for depth in range(limit + 3, limit - 30, -1):        # from too deep to deep enough
        try:
            deep(depth)
        except RecursionError:
            pass
    return np.array([float(sandbox.__file__ in seen)])


def signal_handler(comm, x):
    import signal
    signal.signal(signal.SIGALRM, lambda *args: None)
    return x


def own_ring(comm, x):
    """Right, and the learner's own: passes, with what a program may use besides."""
    import collections
    import sys
    import threading
    Block = collections.namedtuple("Block", "index data")     # exec at run time
    sys._getframe(0)                                          # frames, profilers, threads
    sys.setprofile(None)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    n, r = comm.world_size, comm.rank
    blocks = [None] * n
    blocks[r] = Block(r, np.array(x, copy=True))
    for k in range(n - 1):
        data = comm.sendrecv(blocks[(r - k) % n].data, (r + 1) % n, (r - 1) % n)
        blocks[(r - k - 1) % n] = Block((r - k - 1) % n, data)
    return np.concatenate([b.data for b in blocks])


def run(program):
    program.__module__ = "__main__"                  # pickled by value, as from a notebook
    return run_isolated(program, [np.arange(2.0) + 10 * r for r in range(3)], banned=BANNED,
                        warm_up=False)


@pytest.mark.parametrize("program", COPIES, ids=lambda f: f.__name__)
def test_a_copy_of_an_answer_fails_the_rank_however_it_is_made(program):
    with pytest.raises(RankError) as caught:
        run(program)
    assert type(caught.value.exc).__name__ == "ReferenceCalled", caught.value
    assert str(caught.value.exc) == f"the program made a copy of {ANSWER_IS}"
    assert not caught.value.program_traceback      # as a stub's report: no frame of the guard's


@pytest.mark.parametrize("program, words", [
    (gc_objects, "the program used gc.get_objects (a way to every object of the process)"),
    (other_threads_frames, "the program used sys._current_frames (every thread's frame)"),
    (subinterpreter, "import of _xxsubinterpreters halted"),
    (signal_handler, "module 'signal' has no attribute 'signal'")],
    ids=["gc", "frames", "subinterpreter", "signal"])
def test_ways_to_the_guard_s_own_objects_fail_the_rank(program, words):
    with pytest.raises(RankError) as caught:
        run(program)
    assert words in str(caught.value.exc)


def test_the_hook_runs_none_of_the_program_s_code():
    assert all(out[0] == 0 for out in run(objects_whose_comparisons_run_code).outputs)


def test_no_exception_leaves_the_hook():
    """An error inside the hook (at the recursion limit any call raises one) fails the
    rank; if even the report cannot be made, the rank waits for its time limit. The
    error never reaches the program, whose traceback would hold the hook's frame."""
    from ringlab.errors import ProgramTimeout
    recursion_at_the_hook.__module__ = "__main__"
    try:
        result = run_isolated(recursion_at_the_hook, [np.zeros(1)], banned=BANNED,
                              warm_up=False, timeout=5)
    except ProgramTimeout:
        return
    except RankError as e:
        assert "the grader could not check what the program did ('open')" in str(e.exc)
        return
    assert result.outputs[0][0] == 0


def test_the_program_s_own_code_passes_the_guard():
    result = run(own_ring)
    assert all(np.array_equal(out, [0, 1, 10, 11, 20, 21]) for out in result.outputs)


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


@pytest.mark.parametrize("factory", [sandbox._hook, sandbox._rule, sandbox._copy_finder,
                                     sandbox._reporter], ids=lambda f: f.__name__)
def test_the_guard_looks_up_no_name_as_it_runs(factory):
    """What the hook runs binds every name when it is made: a global or builtin looked up
    at each event would be the program's to replace."""
    inner = [c for c in _codes(factory.__code__) if c is not factory.__code__]
    assert inner
    for code in inner:
        looked_up = [i.argval for i in dis.get_instructions(code)
                     if i.opname in ("LOAD_GLOBAL", "LOAD_NAME", "IMPORT_NAME")]
        assert not looked_up, f"{code.co_qualname} looks up {looked_up}"


def test_the_reporter_writes_what_the_wire_reads():
    """The report is bytes the reporter writes itself: the wire's reader (an independent
    implementation, pipe.recv) reads them as pipe.send would have sent the same value."""
    ours, theirs = Pipe()
    pid = os.fork()
    if pid == 0:                                       # the child reports, and is ended by it
        sandbox.STREAM.sid = 7
        sandbox._reporter(theirs)('copied "the answer" \u00e9' * 50, "ReferenceCalled")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pipe.recv(ours) == [7, ["error", "ReferenceCalled", ('copied "the answer" \u00e9' * 50)[:600], ""]]


def test_no_code_of_the_library_or_the_solutions_looks_like_another_s_answer():
    """The hook fails a rank for a copy of an answer's code: no function of the library
    (every module compiled from its source), no cell of the solution notebooks, may
    look like one unless it is that answer, or a right program would fail."""
    import glob
    import json
    from pathlib import Path

    import ringlab
    from ringlab import answers
    from ringlab.grading.trusted import _import_every_answer
    _import_every_answer()
    codes = sandbox._answers(answers.forbidden(None))
    shapes = {}
    for key in codes:
        module = next(m for m in list(__import__("sys").modules.values())
                      if getattr(m, "__file__", None) == key[0])
        obj = module
        for part in key[1].split("."):
            obj = getattr(obj, part)
        while obj.__code__.co_qualname != key[1]:
            obj = obj.__wrapped__
        shapes[sandbox.shape(obj.__code__)] = key
    assert len(shapes) >= len(codes) - 1 >= 60          # every answer found (two share code)
    copied = sandbox._copy_finder(shapes)
    root = Path(ringlab.__file__).parent
    sources = [(str(f), f.read_text()) for f in root.rglob("*.py")]
    for notebook in glob.glob(str(root.parent / "solutions" / "**" / "*.ipynb"), recursive=True):
        cells = json.loads(Path(notebook).read_text())["cells"]
        sources += [(notebook, "".join(c["source"])) for c in cells if c["cell_type"] == "code"
                    and not "".join(c["source"]).lstrip().startswith(("%", "!"))]
    clashes = []
    for file, text in sources:
        for code in _codes(compile(text, os.path.abspath(file), "exec")):
            key = copied(code)               # the answer it is, or holds: not a clash
            if key is not None and key not in {(c.co_filename, c.co_qualname) for c in _codes(code)}:
                clashes.append(f"{file}: {code.co_qualname} looks like {key[1]}")
    assert not clashes
    assert len(sources) > 150


def test_the_copy_finder_compares_the_program_s_objects_only_when_plain():
    """A copy's constants are compared with the answer's by type, with ``is``, before
    any ``==`` or hash: an object of the program's (in a frozenset too) is never
    hashed or compared, where its code would run inside the hook."""
    def answer(x):
        return x in {"a", "b"}, (1, 2.5)               # a frozenset and a tuple constant
    ran = []

    class Meta(type):
        def __eq__(cls, other):
            ran.append("eq")
            return False

        def __hash__(cls):
            ran.append("hash")
            return 0

    class Odd(metaclass=Meta):
        def __hash__(self):                             # as "b": a set compares them
            ran.append("hash")
            return hash("b")

        def __eq__(self, other):
            ran.append("eq")
            return True
    code = answer.__code__
    odd = {frozenset: frozenset({Odd(), "a"}), tuple: (Odd(), 2.5)}
    with_odd = [code.replace(co_consts=tuple(odd.get(type(c), c) if c is not None else c
                                             for c in code.co_consts))]
    with_odd.append(code.replace(co_consts=code.co_consts[:1] + (Odd(),) * (len(code.co_consts) - 1)))
    copied = sandbox._copy_finder({sandbox.shape(code): "the answer"})
    ran.clear()
    assert copied(code.replace(co_name="mine")) == "the answer"
    assert [copied(c) for c in with_odd] == [None, None] and not ran


def _reference_rule(event, args):
    """The rule for ``open`` as it read with ``os.path.realpath`` (Python code over module
    globals, which the hook may not call): the reference the guard's own path resolution
    (``sandbox._rule``, with ``os.lstat`` and ``os.readlink`` bound) must agree with."""
    path = os.path.realpath(os.fsdecode(args[0]))
    if args[2] & sandbox._WRITES and path != os.devnull:
        return f"the program opened a file for writing ({path})"
    if os.path.isdir(path):
        return f"the program opened the directory {path}"
    parts = path.split(os.sep)
    if len(parts) > 1 and parts[1] == "proc" and (len(parts) < 3 or parts[2] != str(os.getpid())) \
            and path not in ("/proc/cpuinfo", "/proc/meminfo"):
        return f"the program opened {path}: /proc beyond the rank's own process"
    if path.startswith(("/dev/shm", "/run/shm")):
        return f"the program opened {path}: shared memory"
    if path.endswith(".ipynb"):
        return f"the program opened {path}: a rank runs"
    return None


def test_the_rule_resolves_paths_as_realpath_does(tmp_path, monkeypatch):
    """Symbolic links (to /proc of another process, to shared memory, to a notebook,
    chains, loops, relative ones), "..", ".", "//", relative paths and bytes: every
    verdict of the rule on ``open`` is the one ``os.path.realpath`` gives."""
    other = os.getppid()
    (tmp_path / "dir").mkdir()
    (tmp_path / "nb.ipynb").write_text("{}")
    links = {"to_proc": f"/proc/{other}/status", "to_self": "/proc/self/status",
             "to_shm": "/dev/shm", "to_nb": str(tmp_path / "nb.ipynb"), "rel": "dir/../nb.ipynb",
             "chain": "to_proc", "loop_a": "loop_b", "loop_b": "loop_a", "up": "..",
             "to_dir": "dir", "dangling": "nowhere/x"}
    for name, target in links.items():
        os.symlink(target, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    paths = [*links, *(f"{name}/x" for name in links), "dir/../to_proc", "./to_nb",
             "to_dir/../to_shm", "up/" + tmp_path.name + "/to_proc", "//proc/self/status",
             f"/proc/{other}/../{os.getpid()}/status", "/proc/self/root/proc/self/status",
             f"/proc/self/root/proc/{other}/mem", "/dev/null", "/dev/./null", "nb.ipynb",
             str(tmp_path / "to_dir" / ".." / "nb.ipynb"), "plain.txt", "/tmp", "/proc/locks",
             "/proc", "/proc/self/../locks", "/proc/thread-self/status", "/proc/cpuinfo"]
    paths += [p.encode() for p in paths[:6]]
    checked = 0
    for path in paths:
        for flags in (os.O_RDONLY, os.O_WRONLY | os.O_CREAT, os.O_RDWR):
            want = _reference_rule("open", (path, "r", flags))
            got = sandbox.way_between_ranks("open", (path, "r", flags))
            assert (got is None) == (want is None) and (got or "").startswith(want or ""), (
                path, flags, got, want)
            checked += want is not None
    assert checked > 40


# Ways between rank processes outside the messages (a red team's), each refused.
def write_by_a_str_subclass(comm, x):
    class Path(str):
        pass
    with open(Path(os.path.join(os.environ.get("TMPDIR", "/tmp"), "ringlab-rank")), "wb") as f:
        f.write(b"x")
    return x


def sqlite_file(comm, x):
    import sqlite3
    sqlite3.connect(os.path.join(os.environ.get("TMPDIR", "/tmp"), "ringlab-rank.db"))
    return x


def child_without_audit(comm, x):
    import _posixsubprocess
    _posixsubprocess.fork_exec
    return x


def limits_of_another_process(comm, x):
    import resource
    resource.prlimit(os.getppid(), resource.RLIMIT_CORE)
    return x


def kernel_lock_table(comm, x):
    open("/proc/locks").read()
    return x


def signal_by_pidfd(comm, x):
    os.pidfd_open(os.getppid())
    return x


def a_directory_s_descriptor(comm, x):
    os.open("/tmp", os.O_RDONLY)            # then dir_fd= would take paths around the rule
    return x


def another_process_s_files(comm, x):
    os.listdir(f"/proc/{os.getppid()}/fd")
    return x


def functions_taken_away(comm, x):
    import posix
    import subprocess
    gone = [f"{m.__name__}.{n}" for m, n in ((posix, "getpriority"), (posix, "pidfd_open"),
            (posix, "posix_fadvise"), (posix, "preadv"), (subprocess, "_fork_exec"))
            if hasattr(m, n)]
    raise AttributeError(f"still there: {gone}" if gone else "all gone")


@pytest.mark.parametrize("program, words", [
    (a_directory_s_descriptor, "the program opened the directory /tmp"),
    (another_process_s_files, "/proc beyond the rank's own process"),
    (functions_taken_away, "all gone"),
    (write_by_a_str_subclass, "the program opened a file for writing"),
    (sqlite_file, "the program used sqlite3"),
    (child_without_audit, "has no attribute 'fork_exec'"),
    (limits_of_another_process, "the program used resource.prlimit on another process"),
    (kernel_lock_table, "the program opened /proc/locks: /proc beyond the rank's own process"),
    (signal_by_pidfd, "has no attribute 'pidfd_open'")], ids=lambda p: getattr(p, "__name__", ""))
def test_ways_between_ranks_outside_the_messages_fail_the_rank(program, words):
    with pytest.raises(RankError) as caught:
        run(program)
    assert words in str(caught.value.exc)


def open_files(comm, x):
    import stat
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    shared = [fd for fd in fds if fd <= 2 and not stat.S_ISCHR(os.fstat(fd).st_mode)]
    return np.array([float(len(fds)), float(len(shared))])


def stdin_and_tempdir(comm, x):
    import sys
    import tempfile
    assert sys.stdin.read() == "" and tempfile.gettempdir()
    with open("/proc/cpuinfo") as f:
        f.read(10)
    return x


def test_what_a_right_program_may_read_still_works():
    """Its standard input (empty: it reads nothing), the temporary folder's name, what
    the kernel says of the machine."""
    assert len(run(stdin_and_tempdir).outputs) == 3


def test_a_rank_keeps_no_file_the_zygote_had_open():
    """Every rank inherited the zygote's open files, whose flags (O_NONBLOCK) all of them
    share: a channel. A rank has its standard streams (its own /dev/null), its pipe to the
    grader and the directory it lists."""
    for count, shared in run(open_files).outputs:
        assert count == 5 and shared == 0
