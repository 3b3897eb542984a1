"""One rank of a ringlab program on a real process group (torch.distributed).

This is the rank side of the torch backend: it gives the program the same
``Comm`` as the simulator, but every ``send``/``recv`` becomes a
``torch.distributed`` point-to-point call. It runs inside a process whose
default process group is already initialised (by the worker pool of
``ringlab.backends.pool``, or by ``torchrun`` in ``ringlab.launch``).

Every message is a header (with the sender's causal step stamp, so clocks
move exactly as in the simulator) and the payload's bytes: see ``wire.py``.

The trace is recorded by the *sender* (it knows step, chunk, op, span, shape,
dtype and the channel's sequence number), so the events of all ranks together
are the simulator's events, and ``Trace`` sorts them the same way.

Sends are buffered, as in the simulator's default mode: ``send`` copies the
array, starts ``dist.isend`` and returns at once; the transfer completes when
the receiver posts its ``recv``. ``finish`` waits for all of them at the end.
(gloo tells that a send is complete only by blocking in ``wait()``, so past
``MAX_IN_FLIGHT`` unconfirmed sends, ``send`` waits for the oldest, like MPI's
eager limit.) One exception, ``ProcessComm.sendrecv``: it sends the array
without a copy and returns once the peer has it, as ``MPI_Sendrecv`` does.

Receives are posted lazily: ``irecv`` only queues a request, and ``wait``
receives the messages of that (src, tag) channel in order up to it. That is
enough because sends never wait for receives.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
import traceback
from collections import defaultdict, deque

import numpy as np

from ...errors import CommError
from ...trace import Event, Span
from ...comm import Comm, Group, dtype_name as _dtype_name, mismatch as _mismatch
from ...sim.world import Actor
from . import status as st
from . import wire
from .outcome import Outcome

MAX_NDIM = wire.HEADER_WORDS - 6
# The dtypes that can travel; a message sends its index in this list.
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
_CODE = {name: i for i, name in enumerate(DTYPES)}
MAX_IN_FLIGHT = (4096, 256 << 20)     # buffered sends not yet known to be received: messages, bytes
current_world = None                  # the ProcessWorld of the run in progress (see worker.py)


class _Request:
    """A pending ``isend`` or ``irecv``. A buffered send is done at once; an
    unbuffered one (inside ``sendrecv``) holds its transfers in ``works``."""

    __slots__ = ("_world", "kind", "peer", "tag", "done", "payload", "step", "error", "expect",
                 "out", "works", "index", "logged")

    def __init__(self, world, kind, peer, tag):
        self._world, self.kind, self.peer, self.tag = world, kind, peer, tag
        self.done, self.payload, self.step, self.error = kind == "send", None, 0, None
        self.expect = self.out = self.works = None
        self.index, self.logged = 0, False

    def wait(self):
        return self._world._wait(self)

    def is_completed(self):
        return self.done


class ProcessWorld:
    """What ``Comm`` talks to on one real rank: the same methods as the
    simulator's world (``_isend``, ``_irecv``, ``_wait``) over torch.distributed."""

    def __init__(self, rank, world_size, device=None, status=None):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.me = Actor(rank)                     # this process's one rank
        self.ranks = {rank: self.me}              # as the simulator's world has them, for Comm
        self.events = []
        self.log = []                             # what the program did, for sim.replay
        self.posted_count = defaultdict(int)      # (src, tag) -> irecvs posted
        self.sent = defaultdict(int)              # (dst, tag) -> messages sent
        self.received = defaultdict(int)          # (src, tag) -> messages received
        self.posted = defaultdict(deque)          # (src, tag) -> irecvs not yet received
        self.in_flight = deque()                  # (works, tensors, dst, nbytes) of buffered sends
        self.in_flight_bytes = 0
        self.status = status or st.Status.dummy()
        self.wire = wire.Wire(device)

    # -- sending --------------------------------------------------------------
    def _isend(self, comm, array, dst, chunk, op, tag, buffered=True):
        me = comm._me
        dst, payload, header = self._outgoing(me, array, dst, chunk, op, tag, buffered)
        self.status.count_send(dst)        # before the isend: "in flight" is never undercounted
        works, tensors = self.wire.send(header, payload, dst, tag)
        req = _Request(self, "send", dst, tag)
        if not buffered:
            req.done, req.works = False, (works, tensors, dst, payload.nbytes)
            return req
        self.in_flight.append((works, tensors, dst, payload.nbytes))
        self.in_flight_bytes += payload.nbytes
        # gloo tells that a send is complete only by blocking in wait(), so we
        # can't free finished ones as we go. Like MPI's "eager limit": past a
        # bound, wait for the oldest (its receiver must have posted the recv).
        while len(self.in_flight) > MAX_IN_FLIGHT[0] or self.in_flight_bytes > MAX_IN_FLIGHT[1]:
            self._retire_oldest()
        return req

    def _outgoing(self, me, array, dst, chunk, op, tag, buffered):
        """Check a send, move the clock, record the event: ``(dst, payload, header)``."""
        if array.dtype.name not in _CODE:
            raise CommError(f"rank {me.rank}, step {me.clock + 1}: send(dst={dst}): dtype "
                            f"{array.dtype} cannot travel between processes; use one of {', '.join(DTYPES)}")
        if array.ndim > MAX_NDIM:
            raise CommError(f"rank {me.rank}, step {me.clock + 1}: send(dst={dst}): at most "
                            f"{MAX_NDIM} dimensions, got {array.ndim}")
        # Buffered: a private, contiguous, native-byte-order copy travels.
        payload = array if not buffered and array.flags.c_contiguous and array.dtype.isnative else (
            np.array(array, copy=True, order="C", dtype=array.dtype.newbyteorder("=")))
        me.clock += 1
        self.log.append(("send", dst, tag))
        seq = self.sent[(dst, tag)]
        self.sent[(dst, tag)] = seq + 1
        self.events.append(Event(me.clock, me.rank, dst, chunk, op, payload.nbytes, me.span_path,
                                 tag, payload.shape, _dtype_name(payload.dtype), seq))
        header = np.zeros(wire.HEADER_WORDS, np.int64)
        has_chunk = isinstance(chunk, (int, np.integer)) and not isinstance(chunk, bool)
        header[:6] = (me.clock, _CODE[payload.dtype.name], payload.nbytes, has_chunk,
                      int(chunk) if has_chunk else 0, payload.ndim)
        header[6:6 + payload.ndim] = payload.shape
        return dst, payload, header

    def _sendrecv_grouped(self, me, array, dst, src, chunk, op, tag):
        """``sendrecv`` on GPUs: the send and the receive go to NCCL as one group
        (``batch_isend_irecv``), headers first, then payloads. Issued one after
        the other, an NCCL send may wait for its receive, so two ranks sending
        to each other first would wait for ever (NVIDIA/nccl#479)."""
        dst, payload, header = self._outgoing(me, array, dst, chunk, op, tag, buffered=False)
        req = self._irecv(None, src, (None, None), None, tag)
        queue = self.posted[(req.peer, tag)]
        while queue[0] is not req:         # messages already due on that channel come first
            self._receive_next(me, req.peer, tag)
        queue.popleft()
        self.status.count_send(dst)
        self.status.set(st.RECV, req.peer, tag, me.clock)
        words, data = self.wire.exchange(header, payload, dst, req.peer, tag)
        self._deliver(me, req, words, data)
        return self._wait(req)

    def _complete(self, transfer):
        """Wait until ``(works, tensors, dst, nbytes)``, a send, has been received."""
        works, _, dst, _ = transfer
        clock = self.me.clock
        self.status.set(st.SEND, dst, 0, clock)
        for w in reversed(works):          # the last one done means all are: one wake-up
            w.wait()
        self.status.set(st.RUNNING, -1, 0, clock)

    def _retire_oldest(self):
        """Complete the oldest buffered send, and stop counting its bytes."""
        transfer = self.in_flight.popleft()
        self._complete(transfer)
        self.in_flight_bytes -= transfer[3]      # (works, tensors, dst, nbytes)

    # -- receiving ------------------------------------------------------------
    def _irecv(self, comm, src, expect, out, tag):
        req = _Request(self, "recv", src, tag)
        req.index = self.posted_count[(src, tag)]
        self.posted_count[(src, tag)] += 1
        req.out, req.expect = out, expect
        self.posted[(src, tag)].append(req)
        return req

    def _wait(self, req):
        if req.kind == "send":
            if req.works is not None:       # an unbuffered send: wait until it is received
                self._complete(req.works)
                req.works, req.done = None, True
            return None
        me = self.me
        # Receives on one channel complete in the order they were posted, like
        # the messages on it: receive earlier ones first.
        while not req.done:
            self._receive_next(me, req.peer, req.tag)
        if not req.logged:
            req.logged = True
            self.log.append(("recv", req.peer, req.tag, req.index))
        me.clock = max(me.clock, req.step)
        if req.error is not None:
            err, req.error = req.error, None
            raise err
        return req.payload

    def _receive_next(self, me, src, tag):
        req = self.posted[(src, tag)].popleft()
        self.status.set(st.RECV, src, tag, me.clock)
        self._deliver(me, req, *self.wire.recv(src, tag))

    def _deliver(self, me, req, words, data):
        """Complete receive ``req`` with a message's header words and bytes."""
        src, tag = req.peer, req.tag
        step, code, nbytes, has_chunk, chunk, ndim = words[:6]
        shape, dtype = tuple(words[6:6 + ndim]), np.dtype(DTYPES[code])
        array = data.view(dtype).reshape(shape)
        error = _mismatch(self.rank, src, step, req.expect, shape, dtype, chunk if has_chunk else None)
        if error is not None:
            req.error = error
        elif req.out is not None:
            req.out[...] = array
            array = req.out
        self.received[(src, tag)] += 1
        self.status.count_recv(src)
        self.status.set(st.RUNNING, -1, 0, max(me.clock, step))
        req.payload, req.step, req.done = array, step, True

    def _span(self, me, path, start, t_start, group):
        return Span(me.rank, path, start, me.clock, group, me.stream, t_start, me.time)

    # -- the end ----------------------------------------------------------------
    def unwaited(self):
        """``{(src, tag): n}``: receives posted with irecv but never waited for.
        The simulator counts their messages as received, so we must too."""
        return {k: len(q) for k, q in dict(self.posted).items() if q}

    def report(self, **fields):
        """An ``Outcome`` with what this rank sent and received so far. Safe to
        call from another thread: it only copies (atomically, under the GIL)."""
        me = self.me
        unwaited = self.unwaited()
        received = dict(self.received)
        for key, n in unwaited.items():
            received[key] = received.get(key, 0) + n
        return Outcome(self.rank, events=list(self.events), spans=list(me.spans), log=list(self.log),
                       received=received,
                       unwaited=unwaited, step=me.clock, **fields)

    def finish(self, drain=None):
        """Receive the messages of posted-but-unwaited irecvs (``drain`` says how
        many exist), then wait until every message we sent has been received."""
        for (src, tag), count in (drain or {}).items():
            for _ in range(count):
                self._receive_next(self.me, src, tag)
        while self.in_flight:
            self._retire_oldest()


class ProcessComm(Comm):
    """The simulator's ``Comm``, with one difference: ``sendrecv`` sends the array
    without copying it, so it returns once the peer has received it (as
    ``MPI_Sendrecv`` does, and as the simulator's rendezvous mode would). That
    saves a copy of every chunk of a ring collective. On GPUs the send and the
    receive go to NCCL as one group (see ``ProcessWorld._sendrecv_grouped``)."""

    @contextmanager
    def span(self, name):
        log = self._world.log
        log.append(("enter", name))
        try:
            with super().span(name):
                yield
        finally:
            log.append(("exit",))

    def sendrecv(self, array, dst, src, *, chunk=None, op=None, tag=0):
        if not isinstance(array, np.ndarray):
            return super().sendrecv(array, dst, src, chunk=chunk, op=op, tag=tag)  # its error
        gdst, gsrc = self._peer(dst, "send", "dst"), self._peer(src, "recv", "src")
        if self._world.device is not None:
            return self._world._sendrecv_grouped(self._me, array, gdst, gsrc, chunk, op, tag)
        req = self._world._isend(self, array, gdst, chunk, op, tag, buffered=False)
        got = self.recv(src, tag=tag)
        req.wait()
        return got


def run_rank(program, x, args, kwargs, rank, world_size, device=None, status=None):
    """Run ``program(comm, x, *args, **kwargs)`` as ``rank`` of the current
    process group; returns ``(world, Outcome)``. Never raises for learner bugs."""
    global current_world
    world = current_world = ProcessWorld(rank, world_size, device, status)
    comm = ProcessComm(world, world.me, Group(tuple(range(world_size)), None, 0))
    if device is not None:
        # NCCL sets up its communicator in the first collective, and when that is
        # a batch_isend_irecv (our sendrecv) every rank must take part: make it this.
        import torch.distributed as dist
        dist.barrier()
    world.status.set(st.RUNNING, -1, 0, 0)
    try:
        result = program(comm, x, *args, **(kwargs or {}))
    except BaseException as e:  # noqa: BLE001 - reported with the rank's traceback
        world.status.set(st.FAILED, -1, 0, comm.step)
        return world, world.report(**error_report(e))
    world.status.set(st.DONE, -1, 0, comm.step)
    return world, world.report(result=result)


def _hidden(filename):
    path = filename.replace("\\", "/")
    return ("/ringlab/backends/" in path or "/ringlab/sim/" in path or path.endswith("/ringlab/comm.py")
            or "/torch/" in path or path.startswith("<frozen"))


def _frames(walk):
    """``(filename, lineno, name, firstlineno)`` of the learner's frames. The
    parent turns them into text (see ``outcome.format_frames``): it can read
    lines of notebook cells, which this process cannot."""
    return [(f.f_code.co_filename, lineno, f.f_code.co_name, f.f_code.co_firstlineno)
            for f, lineno in walk if not _hidden(f.f_code.co_filename)]


def error_report(exc):
    """Outcome fields for an exception: its frames and its last line."""
    return dict(error=exc, frames=_frames(traceback.walk_tb(exc.__traceback__)),
                traceback="".join(traceback.format_exception_only(type(exc), exc)))


def stack_report(frame):
    """Where the main thread is now (asked for at a timeout), innermost 6 frames."""
    return json.dumps(_frames(reversed(list(traceback.walk_stack(frame))))[-6:])
