"""The guard of `ringlab grade`'s rank processes against ringlab's own answers, layer by
layer: the answers' code is replaced by a stub (tests/grading/pipeline covers the ways to
reach it), and a profiler that records every call fails a rank that called a *copy* of an
answer, a function with the answer's code that no stub replaced, on any of its threads."""

import types

import numpy as np
import pytest

from ringlab.backends.isolated import run_isolated
from ringlab.collectives import allgather
from ringlab.errors import RankError

BANNED = ("ringlab.collectives.allgather:ring_allgather",)
# The answer's code, in a function of the program's own: what pasting the library's
# source into a notebook makes. No stub replaces it: only its code tells.
_ANSWER = allgather.ring_allgather
while hasattr(_ANSWER, "__wrapped__"):
    _ANSWER = _ANSWER.__wrapped__
COPY = types.FunctionType(_ANSWER.__code__, {"np": np}, "my_allgather")
SOLO = types.SimpleNamespace(world_size=1, rank=0)     # a comm of one: the copy sends nothing


def copy_called(comm, x):
    return COPY(comm, x)


def copy_in_a_work(comm, x):
    return comm.start(COPY, x).wait()


def copy_in_a_thread(comm, x):
    import threading
    out = []
    thread = threading.Thread(target=lambda: out.append(COPY(SOLO, x)))
    thread.start()
    thread.join()
    return out[0]


def copy_after_a_second_watch(comm, x):
    import threading
    threading._profile_hook(None, "call", None)     # the guard's own starter, called again
    return COPY(comm, x)


def copy_under_a_forged_watch(comm, x):
    import _lsprof
    import threading
    watch = threading._profile_hook.__closure__[0].cell_contents
    # The guard's own code, over a profiler of the program's: one the grader never reads.
    forged = types.FunctionType(watch.__code__, watch.__globals__, "watch", None,
                                (types.CellType(_lsprof.Profiler()),))
    forged()
    return COPY(comm, x)


def own_ring(comm, x):
    """Right, and the learner's own: passes."""
    n, r = comm.world_size, comm.rank
    blocks = [None] * n
    blocks[r] = np.array(x, copy=True)
    for k in range(n - 1):
        blocks[(r - k - 1) % n] = comm.sendrecv(blocks[(r - k) % n], (r + 1) % n, (r - 1) % n)
    return np.concatenate(blocks)


def run(program):
    program.__module__ = "__main__"                  # pickled by value, as from a notebook
    return run_isolated(program, [np.arange(2.0) + 10 * r for r in range(3)], banned=BANNED,
                        warm_up=False)


@pytest.mark.parametrize("program", [copy_called, copy_in_a_work, copy_in_a_thread,
                                     copy_after_a_second_watch], ids=lambda f: f.__name__)
def test_a_copy_of_an_answer_fails_the_rank_on_any_thread(program):
    with pytest.raises(RankError) as caught:
        run(program)
    assert type(caught.value.exc).__name__ == "ReferenceCalled"
    assert str(caught.value.exc) == ("the program called ringlab's own answer to ring_allgather, "
                                     "fix_ring_allgather (ringlab.collectives.allgather.ring_allgather)")
    assert not caught.value.program_traceback      # as a stub's report: no frame of the guard's


def test_a_profiler_the_guard_did_not_make_cannot_be_switched_on():
    with pytest.raises(RankError) as caught:
        run(copy_under_a_forged_watch)
    assert "the program called sys.setprofile" in str(caught.value.exc)


def test_the_program_s_own_code_passes_the_guard():
    result = run(own_ring)
    assert all(np.array_equal(out, [0, 1, 10, 11, 20, 21]) for out in result.outputs)
