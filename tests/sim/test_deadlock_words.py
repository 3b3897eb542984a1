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


def test_everyone_receiving_first_is_named_with_its_remedy():
    with pytest.raises(DeadlockError) as err:
        ringlab.run(everyone_receives_first, [np.ones(2)] * 3)
    words, hint = err.value.explain()
    assert words == ("In plain words: every rank waits to receive, and no rank has sent "
                     "anything yet.")
    assert "comm.sendrecv" in hint


def test_a_finished_peer_ends_the_chain():
    with pytest.raises(DeadlockError) as err:
        ringlab.run(rank_one_returns_early, [np.ones(2)] * 3)
    words, hint = err.value.explain()
    assert words == ("In plain words: rank 2 waits for a message from rank 1, which has "
                     "finished without sending it.")
    assert hint.startswith("Rank 1 has finished while rank 2 still waits for it")
