"""The zygote's index of functions (``sandbox.index_functions``): a rank process
forked from it finds the banned answers there, and finds the same functions a
scan of every object would, so that replacing them misses none."""

import gc
import types

import numpy as np

from ringlab.backends.isolated import run_isolated
from ringlab.collectives import ring_allreduce


def _what_the_rank_finds(comm, x):
    """In the rank: [index used, same functions as a scan of every object, how
    many functions the index holds for ring_allreduce]."""
    import os

    from ringlab.backends.isolated import sandbox
    from ringlab.collectives import allreduce
    code = getattr(allreduce.ring_allreduce, "__wrapped__", allreduce.ring_allreduce).__code__
    key = (code.co_filename, code.co_qualname)
    zygote, index = sandbox._INDEX
    found = {id(f) for f in sandbox._functions({key: "the answer"})}
    gc.unfreeze()                      # the zygote froze its objects: a scan sees them now
    scanned = {id(o) for o in gc.get_objects() if isinstance(o, types.FunctionType)
               and (o.__code__.co_filename, o.__code__.co_qualname) == key}
    return np.array([zygote == os.getppid(), found == scanned, len(found)], dtype=float)


def test_a_rank_finds_the_answers_in_the_zygotes_index():
    # The rank scans every object of its process (the slow path, on purpose): seconds
    # on a loaded machine, so more than run_isolated's default 10 s.
    out = run_isolated(_what_the_rank_finds, [np.zeros(1)] * 2, timeout=120).outputs
    for used_index, same, count in out:
        assert used_index == 1 and same == 1 and count >= 1


def test_without_the_index_every_function_is_scanned():
    from ringlab.backends.isolated import sandbox
    code = getattr(ring_allreduce, "__wrapped__", ring_allreduce).__code__
    key = (code.co_filename, code.co_qualname)
    saved = list(sandbox._INDEX)
    try:
        sandbox._INDEX[:] = [None, {}]       # this process was not forked from a zygote
        gc.freeze()                          # and frozen objects are found too
        found = sandbox._functions({key: "the answer"})
        assert len(found) > 1000 and all(isinstance(f, types.FunctionType) for f in found)
    finally:
        sandbox._INDEX[:] = saved
