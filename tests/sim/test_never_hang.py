"""No program can hang the simulator or crash it with an internal error: each
of these ends within the time limit plus a little, with a diagnosis."""

import os
import textwrap
import time

import greenlet
import numpy as np
import pytest

import ringlab
from ringlab.sim.budget import WALL_FACTOR


def ring_recv(comm):
    return comm.recv((comm.rank + 1) % comm.world_size)


def test_a_retry_loop_around_a_deadlock_is_a_deadlock_not_a_hang():
    def retry(comm, x):
        while True:
            try:
                return ring_recv(comm)
            except:  # noqa: E722 - the learner's bare except is the point
                continue
    t = time.monotonic()
    with pytest.raises(ringlab.DeadlockError):
        ringlab.run(retry, [np.ones(2)] * 3, timeout=5)
    assert time.monotonic() - t < 1


# The last: every interrupt lands in the inner loop, inside the try, so the run
# must give up on the rank (it hung forever when the watchdog traced lines
# instead: Python drops a trace function as soon as it raises). On two lines:
# in Python 3.11, "while True: pass" on one line jumps to itself, and an
# interrupt raised at that jump counts as outside the try.
@pytest.mark.parametrize("body", ["pass", "time.sleep(0.001)", "while True:\n    pass"])
def test_a_bare_except_cannot_swallow_the_time_limit(body):
    code = f"""
def stubborn(comm, x):
    while True:
        try:
{textwrap.indent(body, " " * 12)}
        except BaseException:
            continue
"""
    scope = {"time": time}
    exec(code, scope)
    t = time.monotonic()
    with pytest.raises(ringlab.ProgramTimeout, match="in stubborn") as e:
        ringlab.run(scope["stubborn"], [None] * 2, timeout=0.5)
    assert time.monotonic() - t < 4
    assert e.value.rank == 0
    # The rank left suspended does not disturb the next run.
    assert ringlab.run(lambda comm, x: x + 1, [1, 2]).outputs == [2, 3]


def test_a_long_blocking_call_is_cut_short():
    t = time.monotonic()
    with pytest.raises(ringlab.ProgramTimeout):
        ringlab.run(lambda comm, x: time.sleep(30), [None] * 2, timeout=0.5)
    assert time.monotonic() - t < 3


def test_a_rank_raising_greenlet_exit_is_its_error():
    def prog(comm, x):
        raise greenlet.GreenletExit("bye")
    with pytest.raises(ringlab.RankError, match="rank 0 raised GreenletExit"):
        ringlab.run(prog, [None] * 2)


def test_os_exit_in_a_rank_does_not_end_the_process():
    with pytest.raises(ringlab.RankError, match=r"os\._exit\(3\) was called"):
        ringlab.run(lambda comm, x: os._exit(3), [None] * 2)
    assert os._exit.__name__ == "_exit"           # put back after the run


def test_the_next_run_after_a_timeout_is_not_disturbed():
    with pytest.raises(ringlab.ProgramTimeout):
        ringlab.run(lambda comm, x: time.sleep(30), [None] * 2, timeout=0.3)
    from ringlab.collectives import ring_allreduce
    res = ringlab.run(ring_allreduce, [np.ones(3)] * 3)
    assert float(res.outputs[0][0]) == 3.0


def test_a_rank_cannot_ignore_or_block_the_wake_up_signal():
    import signal

    def ignores(comm, x):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        time.sleep(30)

    def blocks(comm, x):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
        time.sleep(30)
    for program in (ignores, blocks):
        t = time.monotonic()
        with pytest.raises(ringlab.RankError, match="SIGUSR2 is ringlab's"):
            ringlab.run(program, [None] * 2, timeout=1)
        assert time.monotonic() - t < 3
    # Put back after the run: the process's own code may use them freely again.
    assert (signal.signal.__name__, signal.pthread_sigmask.__name__) == ("signal", "pthread_sigmask")


# -- the self-check (ringlab.grade) runs in a process of its own --------------------
def _ring(comm, x):
    from ringlab.collectives import ring_allreduce
    return ring_allreduce(comm, x)


def test_a_loop_in_c_code_ends_the_self_check_with_a_failure(monkeypatch):
    import itertools
    from ringlab.grading.kit import apart

    def stuck(comm, x):
        if comm.rank == 1:
            sum(itertools.repeat(1))        # one C call that never checks for signals
        return _ring(comm, x)
    # The loop burns CPU until the parent kills the child: at the run's limit (the
    # grader's 10 s, as the child tells it) plus the grace, in the child's CPU seconds.
    # Here 1 s + 1 s, not 10 + 5: the same path, 13 CPU seconds fewer.
    beat = apart.beat
    monkeypatch.setattr(apart, "beat", lambda timeout, where=None: beat(
        1.0 if where is None and timeout == 10.0 else timeout, where))
    monkeypatch.setattr(apart, "GRACE", 1.0)
    t = time.monotonic()
    report = ringlab.grade("ring_allreduce", stuck, seed=1)
    # On a loaded machine up to WALL_FACTOR times as many wall seconds (sim/budget.py).
    assert time.monotonic() - t < WALL_FACTOR * (1 + 1) + 3
    assert "within its time limit (1.0 s)" in report.failure.what, report
    assert not report.passed and report.failure.check == "the program finishes"
    assert "stuck inside one call into C code" in report.failure.what, report
    assert report.cases_passed == 0 and report.cases_total == 18


def test_a_crash_in_c_code_is_a_failed_grade_not_a_dead_process():
    def crash(comm, x):
        import ctypes
        ctypes.string_at(0)                 # reads address 0: a segmentation fault
    report = ringlab.grade("ring_allreduce", crash, seed=1)
    assert not report.passed and report.failure.check == "the program runs without error"
    assert "segmentation fault" in report.failure.what, report


def test_a_program_that_breaks_python_for_the_simulator_is_graded_not_an_internal_error():
    import builtins

    def breaks(comm, x):
        builtins.len = lambda obj: 0         # the simulator uses len() too
        return _ring(comm, x)
    real = builtins.len
    report = ringlab.grade("ring_allreduce", breaks, seed=1)
    assert builtins.len is real             # the grade ran in a child: nothing changed here
    assert not report.passed and "Traceback" not in str(report), report


def test_the_self_check_sees_the_learners_globals_and_prints():
    seen = []

    def program(comm, x):
        seen.append(comm.rank)              # runs in the child: the parent's list stays empty
        return _ring(comm, x)
    assert ringlab.grade("ring_allreduce", program, seed=1).passed
    assert seen == []
