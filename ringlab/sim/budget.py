"""A time limit that counts the CPU time a program uses, with a cap on wall time.

A limit in wall-clock seconds fails right programs on a busy machine (a class's
notebooks graded at once, a CI runner doing three things): there the program
gets a share of a core, and its 2 seconds of work take 6. So a limit counts
the CPU seconds of the process that runs the program, and gives up anyway
after ``WALL_FACTOR`` times the limit in wall time, since a program that sleeps
or blocks uses no CPU at all. On an idle machine both clocks agree.

    >>> budget = Budget(0.05)
    >>> while not budget.over():
    ...     pass
    >>> budget.cpu() >= 0.05 or budget.wall() >= 4 * 0.05
    True
"""

import os
import time

WALL_FACTOR = 4.0

# /proc/<pid>/stat counts CPU time in clock ticks.
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid=None):
    """CPU seconds (user + system) used so far by process ``pid`` (None: this
    one); None where the system does not say (no /proc, the process is gone)."""
    if pid is None:
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: count fields after its ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Budget:
    """``seconds`` of CPU time for process ``pid`` (None: this process), from now,
    and at most ``WALL_FACTOR * seconds`` of wall time. Where the CPU time of
    ``pid`` cannot be read, wall time counts as CPU time (a plain wall limit)."""

    def __init__(self, seconds, pid=None):
        self.seconds, self.pid = seconds, pid
        self.started = time.monotonic()
        self.cpu_start = cpu_seconds(pid)

    def wall(self):
        """Wall seconds since the budget began."""
        return time.monotonic() - self.started

    def cpu(self):
        """CPU seconds used since the budget began."""
        now = cpu_seconds(self.pid) if self.cpu_start is not None else None
        return self.wall() if now is None else now - self.cpu_start

    def left(self):
        """Wall seconds until the budget can be over at the earliest (0 when over):
        the CPU time left, as the process cannot use it faster than the clock."""
        return max(0.0, min(self.seconds - self.cpu(), WALL_FACTOR * self.seconds - self.wall()))

    def over(self):
        return self.left() <= 0.0
