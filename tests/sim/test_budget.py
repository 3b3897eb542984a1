"""Time limits count CPU time, with a cap on wall time (ringlab/sim/budget.py)."""

import os
import time

import numpy as np
import pytest

import ringlab
from ringlab.sim.budget import WALL_FACTOR, Budget, cpu_seconds


def test_cpu_seconds_of_this_process_agree_with_proc():
    mine = cpu_seconds(os.getpid())
    assert mine is not None and abs(mine - time.process_time()) < 0.1   # ticks are 10 ms


def test_a_budget_counts_cpu_time_not_wall_time():
    budget = Budget(0.2)
    time.sleep(0.3)                       # waiting uses no CPU: not over
    assert budget.wall() >= 0.3 and budget.cpu() < 0.1 and not budget.over()
    while budget.cpu() < 0.2:             # work uses it
        pass
    assert budget.over() and budget.left() == 0.0


def test_a_sleeping_process_is_over_at_the_wall_cap():
    budget = Budget(0.05)
    time.sleep(WALL_FACTOR * 0.05 + 0.01)
    assert budget.cpu() < 0.05 and budget.over()


def test_a_process_that_is_gone_counts_wall_time():
    budget = Budget(0.05, pid=2 ** 22 + 12345)     # above the usual pid_max: no such process
    assert budget.cpu_start is None
    time.sleep(0.06)
    assert budget.over()


def test_a_program_sharing_its_core_is_not_stopped_early():
    """Two ranks that need 0.1 s of CPU each, with a limit of 0.5 s, on a core that
    two other processes keep busy: the run takes more than 0.5 s of wall time (it
    gets a third of the core at most) and still finishes."""
    spinners = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:                      # another process: spin on core 0
            os.sched_setaffinity(0, {0})
            end = time.monotonic() + 10
            while time.monotonic() < end:
                pass
            os._exit(0)
        spinners.append(pid)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        def work(comm, x):
            start = time.process_time()
            while time.process_time() - start < 0.1:
                pass
            return x
        t = time.monotonic()
        assert ringlab.run(work, [np.zeros(1)] * 2, timeout=0.5).outputs[0].shape == (1,)
        assert time.monotonic() - t > 0.5        # a wall-clock limit would have stopped it
    finally:
        os.sched_setaffinity(0, mask)
        for pid in spinners:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


def test_an_endless_loop_is_stopped_after_its_cpu_seconds():
    def spin(comm, x):
        while True:
            pass
    t = time.monotonic()
    with pytest.raises(ringlab.ProgramTimeout):
        ringlab.run(spin, [None] * 2, timeout=0.3)
    assert time.monotonic() - t < WALL_FACTOR * 0.3 + 1.5
