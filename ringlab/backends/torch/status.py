"""What each worker is doing right now, in memory the parent can read.

A real rank blocked in ``dist.recv`` cannot answer questions, so it writes its
state into a small shared memory block before it blocks: "waiting for rank 1,
tag 0, my clock is 3". The parent reads all blocks to tell a deadlock (every
unfinished rank waits, and nothing is on its way to any of them) from a slow
program, and to name the ranks still waiting when it gives up.

Only the program's thread reports here, not a rank's ``comm.start`` works.

Layout: int64 words [state, peer (a global rank; -1 for recv_any), tag, clock, 4 spare], then ``sent[MAX_RANKS]``
(messages this rank sent to each rank) and ``received[MAX_RANKS]``; after
that, from byte ``TEXT``, a length and some UTF-8 text (the stack of a rank
that ran out of time). No torch here: the parent imports this module.
"""

import mmap
import os

import numpy as np

IDLE, RUNNING, RECV, SEND, DONE, FAILED, AGREE = range(7)
NAMES = {IDLE: "idle", RUNNING: "running", RECV: "waiting in recv", SEND: "waiting in send",
         DONE: "finished", FAILED: "failed",
         AGREE: "waiting in a barrier, split, new_group or work.wait()"}
MAX_RANKS = 64
# Where things are in the block, in int64 words (see the layout above). SENT and
# RECEIVED are where the two counter arrays start: sent[dst] is word SENT + dst.
STATE, PEER, TAG, CLOCK = range(4)
SENT = 8
RECEIVED = SENT + MAX_RANKS
WORDS = RECEIVED + MAX_RANKS
SIZE = 8192
TEXT = 8 * WORDS                  # in bytes


class Status:
    """A view of one worker's shared block (the worker writes, the parent reads)."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.words = np.frombuffer(buffer, np.int64, WORDS)
        self.sent = self.words[SENT:RECEIVED]
        self.received = self.words[RECEIVED:]

    @classmethod
    def create(cls):
        """A new block, backed by an unnamed file; pass ``fd`` to the child."""
        fd = os.memfd_create("ringlab-status") if hasattr(os, "memfd_create") else _unlinked_file()
        os.ftruncate(fd, SIZE)
        self = cls(mmap.mmap(fd, SIZE))
        self.fd = fd
        return self

    @classmethod
    def attach(cls, fd):
        return cls(mmap.mmap(fd, SIZE))

    @classmethod
    def dummy(cls):
        """Plain memory, for a rank nobody watches (e.g. under torchrun)."""
        return cls(bytearray(SIZE))

    def reset(self):
        self.words[:] = 0
        self.write_text("")

    def set(self, state, peer, tag, clock):
        w = self.words
        w[PEER], w[TAG], w[CLOCK] = peer, tag, clock
        w[STATE] = state    # last: a reader that sees the state sees its details

    def count_send(self, dst):
        self.sent[dst] += 1

    def count_recv(self, src):
        self.received[src] += 1

    def snapshot(self):
        return self.words.copy()

    def write_text(self, text):
        data = text.encode()[: SIZE - TEXT - 8]
        self.buffer[TEXT + 8: TEXT + 8 + len(data)] = data
        self.buffer[TEXT: TEXT + 8] = len(data).to_bytes(8, "little")

    def read_text(self):
        n = int.from_bytes(self.buffer[TEXT: TEXT + 8], "little")
        return bytes(self.buffer[TEXT + 8: TEXT + 8 + n]).decode(errors="replace")


def _unlinked_file():
    import tempfile
    f = tempfile.TemporaryFile()
    return os.dup(f.fileno())


def describe(words):
    """A ``Wait``: 'waits in recv(src=1) (its clock: step 3)', as the simulator says it."""
    from ...errors import Wait
    state, peer, tag, clock = (int(words[i]) for i in (STATE, PEER, TAG, CLOCK))
    if state == RECV:
        return Wait("recv", peer, f"waits in recv(src={peer}" + (f", tag={tag}" if tag else "")
                    + f") (its clock: step {clock})")
    if state == SEND:
        return Wait("send", peer, f"waits until rank {peer} receives what it sent (its clock: step {clock})")
    return Wait(NAMES.get(state, "?"), None, f"{NAMES.get(state, '?')} (its clock: step {clock})")
