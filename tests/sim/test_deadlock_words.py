"""A deadlock raised by ``ringlab.run`` explains itself in plain words (``err.explain()``)."""

import numpy as np
import pytest

import ringlab
from ringlab import DeadlockError


def everyone_receives_first(comm, x):
    n = comm.world_size
    got = comm.recv((comm.rank - 1) % n)
    comm.send(x, (comm.rank + 1) % n)
    return got


def rank_one_returns_early(comm, x):
    if comm.rank == 1:
        return x
    if comm.rank == 2:
        return comm.recv(1)
    return x


@pytest.mark.parametrize("program, words, hint", [
    (everyone_receives_first,
     "In plain words: every rank waits to receive, and no rank has sent anything yet.",
     "Every rank waits to receive before anyone sends: send first, or use comm.sendrecv"),
    (rank_one_returns_early,
     "In plain words: rank 2 waits for a message from rank 1, which has finished without "
     "sending it.",
     "Rank 1 has finished while rank 2 still waits for it"),
])
def test_the_error_says_who_waits_for_whom_and_what_to_try(program, words, hint):
    with pytest.raises(DeadlockError) as err:
        ringlab.run(program, [np.ones(2)] * 3)
    assert err.value.explain()[0] == words
    assert err.value.explain()[1].startswith(hint)
