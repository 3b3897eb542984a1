"""The zygote's index of functions (``sandbox.index_functions``): a rank process
forked from it finds the banned answers there, and finds the same functions a
scan of every object would, so that replacing them misses none."""

import gc
import types

import numpy as np

from ringlab.backends.isolated import run_isolated
from ringlab.collectives import ring_allreduce


def _what_the_rank_finds(comm, x):
    """In the rank: [index used, how many functions the index holds for ring_allreduce]
    (a rank may not ask gc for its objects: the scan to compare with is the next test's)."""
    import os

    from ringlab.backends.isolated import sandbox
    from ringlab.collectives import allreduce
    code = getattr(allreduce.ring_allreduce, "__wrapped__", allreduce.ring_allreduce).__code__
    key = (code.co_filename, code.co_qualname)
    zygote, index, _ = sandbox._INDEX
    found = sandbox._functions({key: "the answer"})
    return np.array([zygote == os.getppid(), len(found)], dtype=float)


def test_a_rank_finds_the_answers_in_the_zygotes_index():
    out = run_isolated(_what_the_rank_finds, [np.zeros(1)] * 2, timeout=60).outputs
    for used_index, count in out:
        assert used_index == 1 and count >= 1


# Run in a process of its own: forking a test process that has threads (pytest-xdist's)
# may leave the child waiting on a lock that a thread held.
_FORKED = """
import gc, os, types
from ringlab.backends.isolated import sandbox
from ringlab.collectives import ring_allreduce
code = getattr(ring_allreduce, "__wrapped__", ring_allreduce).__code__
key = (code.co_filename, code.co_qualname)
sandbox.index_functions()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    sandbox.CONN[0] = object()                             # as in a rank process
    found = {id(f) for f in sandbox._functions({key: "the answer"})}
    gc.unfreeze()
    scanned = {id(o) for o in gc.get_objects() if isinstance(o, types.FunctionType)
               and (o.__code__.co_filename, o.__code__.co_qualname) == key}
    os.write(write, bytes([found == scanned, len(found)]))
    os._exit(0)
os.waitpid(pid, 0)
print(list(os.read(read, 2)))
"""


def test_a_forked_process_finds_in_the_index_what_a_scan_finds():
    """The index, built before a fork and read after it (as the zygote's by a rank),
    holds the same functions for a key as a scan of every object in the child."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _FORKED], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    same, count = eval(out)
    assert same == 1 and count >= 1


def test_without_the_index_every_function_is_scanned():
    from ringlab.backends.isolated import sandbox
    code = getattr(ring_allreduce, "__wrapped__", ring_allreduce).__code__
    key = (code.co_filename, code.co_qualname)
    saved = list(sandbox._INDEX)
    try:
        sandbox._INDEX[:] = [None, {}, {}]   # this process was not forked from a zygote
        gc.freeze()                          # and frozen objects are found too
        found = sandbox._functions({key: "the answer"})
        assert len(found) > 1000 and all(isinstance(f, types.FunctionType) for f in found)
    finally:
        sandbox._INDEX[:] = saved
