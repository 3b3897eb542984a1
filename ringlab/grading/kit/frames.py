"""What a receiver did with what it received, and tracebacks without ours.

With ``record_payloads=True`` the simulator keeps a copy of each payload and
hands every receiver a copy of its own (``RunResult.handed``), so a program
that changes what it received in place (``got += mine``, or ``got[:] = 0`` to
hide what arrived) cannot change the grader's record; ``changed_in_place``
tells which receivers did.
"""

from __future__ import annotations

import os

import numpy as np


def changed_in_place(result, handed):
    """The events whose received array the program changed afterwards, in trace
    order (needs the run's recorded payloads)."""
    if result.payloads is None:
        return []
    changed = [e for e, mine in handed if e is not None
               and not (mine.shape == result.payload(e).shape and np.array_equal(mine, result.payload(e)))]
    return sorted(changed, key=lambda e: (e.step, e.src))


# The grading package's folder: the frames of its files (the graders' drivers,
# which run inside the ranks) are not the learner's to read.
GRADERS_FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def without_grader_frames(text):
    """A traceback without the frames of the graders' own files (a driver's): the
    learner's code is theirs to read, ours not."""
    if not text:
        return text
    out, skip = [], False
    for line in str(text).splitlines(keepends=True):
        if line.startswith('  File "'):
            path = line[len('  File "'):].split('"', 1)[0]
            skip = os.path.abspath(path).startswith(GRADERS_FOLDER + os.sep)
        elif not line.startswith("    "):
            skip = False
        if not skip:
            out.append(line)
    return "".join(out)
