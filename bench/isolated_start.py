"""What a rank process of an isolated run (``ringlab grade``) costs to start.

Times a one-rank world whose program returns its input at once, isolated
(``run_isolated``: a process forked from the zygote, the sandbox set up, the memory
read twice) and in this process (``ringlab.run``), and 4 ranks that sum their
vectors round a ring (3 steps) both ways. Target: a rank starts in under 60 ms.

    python bench/isolated_start.py [--repeat 20]

Measured on this project's 2-core machine, median of 20, with the answers of
``ring_allreduce`` banned as ``ringlab grade`` bans them: a one-rank world 46 ms
isolated (0.24 ms in process); the 4-rank ring sum 205 ms (0.36 ms). Before the
zygote indexed its functions (``zygote.py``), each rank scanned every object of its
fresh fork for the banned answers, which copied every page of its memory: about 160 ms for
the one-rank world.
"""

import argparse
import statistics
import time

import numpy as np

import ringlab
from ringlab.backends.isolated import run_isolated
from ringlab.grading.trusted import banned_answers


def returns_its_input(comm, x):
    return x


def ring_sum(comm, x):
    """The sum of every rank's x, passed N - 1 times round a ring (the learner's
    own code: ringlab's answers are banned in a rank)."""
    total, passing = x.copy(), x
    for _ in range(comm.world_size - 1):
        passing = comm.sendrecv(passing, dst=(comm.rank + 1) % comm.world_size,
                                src=(comm.rank - 1) % comm.world_size)
        total += passing
    return total


def median_seconds(run, repeat):
    run()                                   # the first run starts the zygote
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    repeat = parser.parse_args().repeat
    banned = banned_answers("ring_allreduce")       # as ringlab grade sets a rank up
    one, four = [np.zeros(4)], [np.ones(64) for _ in range(4)]
    rows = [("one rank, returns its input", returns_its_input, one, 0.060),
            ("4 ranks, a sum round a ring, 64 floats", ring_sum, four, None)]
    for name, program, inputs, target in rows:
        isolated = median_seconds(lambda: run_isolated(program, inputs, banned=banned), repeat)
        here = median_seconds(lambda: ringlab.run(program, inputs), repeat)
        goal = f"; target < {target * 1e3:.0f} ms" if target else ""
        print(f"{name:34} isolated {isolated * 1e3:7.1f} ms, in process {here * 1e3:6.2f} ms "
              f"({isolated / here:5.0f}x){goal}")


if __name__ == "__main__":
    main()
