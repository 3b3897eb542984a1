"""Grader for exercise ``fix_ring_allgather``: spot the bug.

``BUGGY_SOURCE`` below is a ring AllGather with one bug. It passes with two
ranks and fails from three on; the exercise shows it with its grade report,
and the learner fixes it. Signature and checks are those of
``ring_allgather`` (the same cases, the same ``check``): see that grader.

``buggy_ring_allgather`` is the compiled program, so notebooks and tests run
exactly the text they show.
"""

import numpy as np

from .ring_allgather import cases, check  # noqa: F401 - graded like ring_allgather

NAME = "fix_ring_allgather"
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True

BUGGY_SOURCE = '''\
def ring_allgather(comm, x):
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    blocks = [None] * n
    blocks[rank] = x
    for k in range(n - 1):
        # pass a block to the right, take the next one from the left
        got = comm.sendrecv(x, right, left)
        blocks[(rank - k - 1) % n] = got
    return np.concatenate(blocks)
'''


def _compile(source):
    namespace = {"np": np}
    exec(compile(source, f"<{NAME}>", "exec"), namespace)   # noqa: S102 - our own constant text
    return namespace["ring_allgather"]


buggy_ring_allgather = _compile(BUGGY_SOURCE)
