"""How one ringlab message travels as torch.distributed point-to-point transfers.

A ringlab receiver need not say what it expects (``recv(src)`` returns "the
next message"), but ``torch.distributed.recv`` must be handed a buffer big
enough for it. So every message starts with a header of 16 int64 =
``[step, dtype code, nbytes, has_chunk, chunk, ndim, shape...]`` (``step`` is
the sender's causal stamp, so the receiver's clock moves as in the simulator)
and the payload's raw bytes follow. Transfers on one (src, dst, tag) channel
arrive in the order they were sent, which is what keeps the two together.
Every method takes the process group that carries the message (``group``,
None for the default one: see ``ProcessWorld._pg``); a channel is
(group, peer, tag), since torch.distributed tags are per process group.

Done naively that costs two round trips per message: the receiver can only
post the payload's receive once the header is in. gloo accepts a message
*smaller* than the receive buffer, which allows two shortcuts:

* small messages (up to ``EAGER`` bytes) travel inside the header transfer:
  the receiver always posts ``header + EAGER`` bytes for it;
* for a big message, the receiver posts, together with the header's receive,
  a receive as big as the previous big message on the channel (a ring sends
  chunks of the same size step after step). Sender and receiver both know
  that size, so the sender knows whether the payload fits; if it doesn't, it
  first sends one dummy byte into that buffer, then the payload on its own.

Receive buffers are reused: the header's always (its bytes never leave
``recv``), a big message's once the program has let go of the array it got
(see ``_spare``), because first-touching fresh memory is slow on some machines.

NCCL needs a receive of exactly the size sent, so there (``device`` given)
every message is a plain header transfer and then a payload transfer; and
``sendrecv`` goes as two groups of a send and a receive (``exchange``).
"""

import sys
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

HEADER_WORDS = 16
HEADER_BYTES = 8 * HEADER_WORDS
EAGER = 64 << 10
_DUMMY = np.zeros(1, np.uint8)


def as_bytes(array):
    """A flat uint8 view of a contiguous array (any dtype travels as bytes)."""
    return array.reshape(-1).view(np.uint8)


def _references(array):
    return sys.getrefcount(array)


def _alone():
    buf = np.empty(1, np.uint8)        # held by this local name only, as in Wire._spare
    return _references(buf)


_ALONE = _alone()    # 3 on CPython 3.11 (local, argument, getrefcount's own); measured, not assumed


class Wire:
    def __init__(self, device=None):
        self.device = device
        self.shortcuts = device is None
        self.sender_big = defaultdict(int)     # (group, dst, tag) -> bytes the receiver pre-posts next
        self.receiver_big = defaultdict(int)   # (group, src, tag) -> the same, on the receiving side
        self.heads = {}                        # (group, src, tag) -> the buffer headers arrive in
        self.spares = {}                       # (group, src, tag) -> the last big message's buffer

    def send(self, header, payload, dst, tag, group=None):
        """Start sending one message; returns (works, tensors): wait for the works,
        and keep the tensors alive until then."""
        nbytes, head = payload.nbytes, header.view(np.uint8)
        key = (group, dst, tag)
        if not self.shortcuts:
            buffers = [head] + ([as_bytes(payload)] if nbytes else [])
        else:
            posted = self.sender_big[key]
            if nbytes <= EAGER:
                buffers = [np.concatenate([head, as_bytes(payload)])] + ([_DUMMY] if posted else [])
            else:
                buffers = [head] + ([_DUMMY] if posted and nbytes > posted else []) + [as_bytes(payload)]
            self.sender_big[key] = nbytes if nbytes > EAGER else 0
        tensors = [self._tensor(b) for b in buffers]
        return [dist.isend(t, dst, group=group, tag=tag) for t in tensors], tensors

    def recv(self, src, tag, group=None):
        """Receive one message: its header words and its payload bytes."""
        key = (group, src, tag)
        first = self._head(key)
        return self._rest(key, first, self._irecv(first, src, tag, group))

    def recv_any(self, tag, group=None):
        """Receive one message from whichever rank's comes first (``dist.recv``
        with ``src=None``): ``(src, words, data)``, ``src`` a global rank. Only
        the header comes from "anyone"; the rest of the message then comes from
        that sender, on its channel, as in ``recv``."""
        first = self._head((group, None, tag))
        src = dist.recv(torch.from_numpy(first), None, group=group, tag=tag)
        return (src, *self._rest((group, src, tag), first, None))

    def _head(self, key):
        first = self.heads.get(key)
        if first is None:
            first = self.heads[key] = np.empty(HEADER_BYTES + (EAGER if self.shortcuts else 0), np.uint8)
        return first

    def _rest(self, key, first, first_work):
        """The rest of a message whose header lands in ``first`` (``first_work``:
        its receive, None if it is in already)."""
        group, src, tag = key
        posted = self.receiver_big[key] if self.shortcuts else 0
        if posted:
            big = self._spare(key, posted)
            big_work = self._irecv(big, src, tag, group)
            # Whatever the sender sends, something lands in each of the two
            # buffers, in order: waiting for the second first wakes us once.
            big_work.wait()
        if first_work is not None:
            first_work.wait()
        words = first[:HEADER_BYTES].view(np.int64).tolist()
        nbytes = words[2]
        if self.shortcuts and nbytes <= EAGER:
            data = first[HEADER_BYTES:HEADER_BYTES + nbytes].copy()
        elif posted and nbytes <= posted:
            data = big if nbytes == posted else big[:nbytes].copy()
        else:
            data = self._spare(key, nbytes)
            if nbytes:
                self._irecv(data, src, tag, group).wait()
        if self.shortcuts:
            self.receiver_big[key] = nbytes if nbytes > EAGER else 0
        if nbytes > EAGER:
            self.spares[key] = data            # next time, if the program is done with it
        return words, data

    def exchange(self, header, payload, dst, src, tag, group=None):
        """Send one message to ``dst`` and receive one from ``src``, each step as
        one group (``batch_isend_irecv``): the two headers, then the two payloads,
        whose sizes the headers tell. Used on GPUs (see ``ProcessWorld``)."""
        head_in = np.empty(HEADER_BYTES, np.uint8)
        self._group([(header.view(np.uint8), dst)], [(head_in, src)], tag, group)
        words = head_in.view(np.int64).tolist()
        data = np.empty(words[2], np.uint8)
        self._group([(as_bytes(payload), dst)] if payload.nbytes else [],
                    [(data, src)] if data.nbytes else [], tag, group)
        return words, data

    def _group(self, sends, recvs, tag, group):
        """Post ``sends`` [(array, dst)] and ``recvs`` [(array, src)] together and
        wait for all of them; what arrives is copied into the recvs' arrays."""
        ops, landing = [], []
        for array, dst in sends:
            ops.append(dist.P2POp(dist.isend, self._tensor(array), dst, group, tag=tag))
        for array, src in recvs:
            t = self._landing(array)
            ops.append(dist.P2POp(dist.irecv, t, src, group, tag=tag))
            landing.append((array, t))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        if self.device is not None:
            for array, t in landing:
                array[...] = t.cpu().numpy()

    def _spare(self, key, nbytes):
        """A buffer for ``nbytes``: the channel's previous one if it has that size
        and nothing refers to it any more (then its contents are no one's)."""
        buf = self.spares.pop(key, None)
        # The program's array, any view of it, or a tensor sharing its memory
        # would each add a reference to the ones of a buffer held only by `buf`.
        if buf is None or buf.nbytes != nbytes or _references(buf) > _ALONE:
            buf = np.empty(nbytes, np.uint8)
        return buf

    def _tensor(self, array):
        t = torch.from_numpy(array)            # shares memory: no copy on the CPU
        return t if self.device is None else t.to(self.device)

    def _landing(self, array):
        """Where a receive into ``array`` lands: ``array``'s own memory on the CPU,
        a GPU tensor of its size on a device (copied into ``array`` afterwards)."""
        if self.device is None:
            return torch.from_numpy(array)
        return torch.empty(array.shape, dtype=torch.uint8, device=self.device)

    def _irecv(self, array, src, tag, group=None):
        tensor = self._landing(array)
        work = dist.irecv(tensor, src, group=group, tag=tag)
        return work if self.device is None else _DeviceRecv(work, array, tensor)


class _DeviceRecv:
    """A receive into GPU memory, copied to ``array`` on ``wait()``."""

    def __init__(self, work, array, tensor):
        self.work, self.array, self.tensor = work, array, tensor

    def wait(self):
        self.work.wait()
        self.array[...] = self.tensor.cpu().numpy()
