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
eager limit.) One exception, ``ProcessWorld.sendrecv``: it sends the array
without a copy and returns once the peer has it, as ``MPI_Sendrecv`` does.

Receives are posted lazily: ``irecv`` only queues a request, and ``wait``
receives the messages of that channel in order up to it. That is enough
because sends never wait for receives. A channel is (group label, stream,
global peer, tag): each group has its own process groups (see ``ProcessWorld``).

``comm.start`` works run on a thread per group; ``barrier``/``split`` and the
check of ``new_group`` calls use ``dist.all_gather_object`` (no messages in the
trace, as in the simulator). ``recv_any`` takes whichever message really comes
first, so unlike the simulator's its choice depends on timing.

Live clocks (``comm.step``) are causal stamps: the one-port steps (in the
trace) come from replaying each rank's log in the simulator (``sim.replay``),
since a step depends on the receiver's port, which the sender can't know.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import time
import traceback
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch.distributed as dist

from ...errors import CommError, said
from ...trace import Compute, Event, MemoryEvent
from ...comm import ANY, Comm, Group, Ledger, group_label, dtype_name as _dtype_name, mismatch as _mismatch
from ...trace import payload_key
from ...comm import World
from ...sim import world as sim_world
from ...sim.world import Actor
from . import status as st
from . import framing as wire
from .outcome import Outcome

MAX_NDIM = wire.HEADER_WORDS - 6
# The dtypes that can travel; a message sends its index in this list.
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
_CODE = {name: i for i, name in enumerate(DTYPES)}
MAX_IN_FLIGHT = (4096, 256 << 20)     # buffered sends not yet known to be received: messages, bytes
current_world = None                  # the ProcessWorld of the run in progress (see worker.py)


class _Actor(Actor):
    """The program (stream 0) or one ``comm.start`` work (stream 1) of this
    rank, with its own ``log`` of what it did (see ``sim.replay``)."""

    __slots__ = ("log",)

    def __init__(self, rank, stream=0, clock=0):
        super().__init__(rank, stream, clock)
        self.log = []


class _Lane:
    """What one thread of a rank owns: its unconfirmed buffered sends, and the
    status block it reports in. Only the program's thread writes the real block:
    the parent's deadlock rule is about the program (see ``supervisor._deadlock``)."""

    def __init__(self, status):
        self.status, self.in_flight, self.in_flight_bytes = status, deque(), 0


class _Request:
    """A pending ``isend`` or ``irecv``. A buffered send is done at once; an
    unbuffered one (inside ``sendrecv``) holds its transfers in ``works``.
    ``key``: its channel, (group label, stream, global peer, tag)."""

    __slots__ = ("_world", "comm", "kind", "peer", "tag", "key", "done", "payload", "step", "error",
                 "expect", "out", "works", "index", "logged")

    def __init__(self, world, comm, kind, peer, tag):
        self._world, self.comm, self.kind, self.peer, self.tag = world, comm, kind, peer, tag
        self.key = (comm.group.label, comm._stream, peer, tag)
        self.done, self.payload, self.step, self.error = kind == "send", None, 0, None
        self.expect = self.out = self.works = None
        self.index, self.logged = 0, False

    def wait(self):
        return self._world._wait(self)

    def is_completed(self):
        return self.done


class _Work:
    """What ``comm.start`` returns here: a function running on this rank's
    communication thread. ``wait()`` returns its result (or raises its error)."""

    def __init__(self, world, actor, index):
        self._world, self.actor, self.index, self.future = world, actor, index, None

    def wait(self):
        return self._world._wait_work(self)

    def is_completed(self):
        # Real timing decides this; a program that polls may see other answers
        # than in the simulator (whose steps then differ too).
        return self.future.done()


class ProcessWorld(World):
    """What ``Comm`` talks to on one real rank: the same methods as the
    simulator's world (``ringlab.comm.World``: ``isend``, ``irecv``, ``new_group``, ...)
    over torch.distributed.

    Groups: every group has two process groups, one for the program's messages
    and one for its communication stream's (``comm.start``), so that the two
    never mix: torch.distributed tags are per process group. The whole world's
    program messages use the default group. Both are made when the group is,
    on every rank in the same order, as ``dist.new_group`` requires."""

    def __init__(self, rank, world_size, device=None, status=None, record_payloads=False):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.me = _Actor(rank)                    # this process's program
        self.ranks = {rank: self.me}              # as the simulator's world has them, for Comm
        self.events, self.computes, self.memory_events = [], [], []
        self.ledger = Ledger()                    # comm.alloc/free's book
        self.payloads = {} if record_payloads else None   # payload_key -> array, for graders
        self.log = self.me.log                    # what the program did, for sim.replay
        self.world_group = Group(tuple(range(world_size)), None, 0)
        self.groups = {None: self.world_group}    # label -> Group, in creation order
        self.pgs = {(None, 0): None}              # (label, stream) -> process group (None: default)
        self.works, self.threads, self.last_work = [], {}, {}   # threads, last work: per group label
        self.local = threading.local()            # .actor: the work a communication thread runs
        self.t0 = time.perf_counter()
        # Channels are (group label, stream, global peer, tag); one thread uses each.
        self.posted_count = defaultdict(int)      # channel -> irecvs posted
        self.sent = defaultdict(int)              # channel -> messages sent
        self.received = defaultdict(int)          # channel -> messages received
        self.posted = defaultdict(deque)          # channel -> irecvs not yet received
        self.status = status or st.Status.dummy()
        self.lanes = {0: _Lane(self.status), 1: _Lane(st.Status.dummy())}
        self.wire = wire.Wire(device)

    def setup(self):
        """Collective, on every rank at the start: the world's stream process group."""
        self.pgs[(None, 1)] = _new_group(list(range(self.world_size)))

    def _pg(self, comm):
        return self.pgs[(comm.group.label, comm._stream)]

    def _current(self):
        """The actor (program or work) of the calling thread."""
        return getattr(self.local, "actor", self.me)

    # -- sending --------------------------------------------------------------
    def isend(self, comm, array, dst, chunk, op, tag, buffered=True):
        dst, payload, header = self._outgoing(comm, array, dst, chunk, op, tag, buffered)
        lane = self.lanes[comm._stream]
        lane.status.count_send(dst)        # before the isend: "in flight" is never undercounted
        works, tensors = self.wire.send(header, payload, dst, tag, self._pg(comm))
        req = _Request(self, comm, "send", dst, tag)
        if not buffered:
            req.done, req.works = False, (works, tensors, dst, payload.nbytes)
            return req
        lane.in_flight.append((works, tensors, dst, payload.nbytes))
        lane.in_flight_bytes += payload.nbytes
        # gloo tells that a send is complete only by blocking in wait(), so we
        # can't free finished ones as we go. Like MPI's "eager limit": past a
        # bound, wait for the oldest (its receiver must have posted the recv).
        while len(lane.in_flight) > MAX_IN_FLIGHT[0] or lane.in_flight_bytes > MAX_IN_FLIGHT[1]:
            self._retire_oldest(lane)
        return req

    def _outgoing(self, comm, array, dst, chunk, op, tag, buffered):
        """Check a send, move the clock, record the event: ``(dst, payload, header)``."""
        me = comm._me
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
        label = comm.group.label
        me.log.append(("send", dst, tag, label))
        key = (label, comm._stream, dst, tag)
        seq = self.sent[key]
        self.sent[key] = seq + 1
        self.events.append(Event(me.clock, me.rank, dst, chunk, op, payload.nbytes, me.span_path,
                                 tag, payload.shape, _dtype_name(payload.dtype), seq, label, comm._stream))
        if self.payloads is not None:     # a copy: the program may change its array later
            self.payloads[payload_key(self.events[-1])] = np.array(payload, copy=True)
        header = np.zeros(wire.HEADER_WORDS, np.int64)
        has_chunk = isinstance(chunk, (int, np.integer)) and not isinstance(chunk, bool)
        header[:6] = (me.clock, _CODE[payload.dtype.name], payload.nbytes, has_chunk,
                      int(chunk) if has_chunk else 0, payload.ndim)
        header[6:6 + payload.ndim] = payload.shape
        return dst, payload, header

    def _sendrecv_grouped(self, comm, array, dst, src, chunk, op, tag):
        """``sendrecv`` on GPUs: the send and the receive go to NCCL as one group
        (``batch_isend_irecv``), headers first, then payloads. Issued one after
        the other, an NCCL send may wait for its receive, so two ranks sending
        to each other first would wait for ever (NVIDIA/nccl#479)."""
        dst, payload, header = self._outgoing(comm, array, dst, chunk, op, tag, buffered=False)
        req = self.irecv(comm, src, ANY, None, tag)
        queue = self.posted[req.key]
        while queue[0] is not req:         # messages already due on that channel come first
            self._receive_next(req.key)
        queue.popleft()
        lane = self.lanes[comm._stream]
        lane.status.count_send(dst)
        lane.status.set(st.RECV, req.peer, tag, comm._me.clock)
        words, data = self.wire.exchange(header, payload, dst, req.peer, tag, self._pg(comm))
        self._deliver(req, words, data)
        return self._wait(req)

    def _complete(self, transfer, lane):
        """Wait until ``(works, tensors, dst, nbytes)``, a send, has been received."""
        works, _, dst, _ = transfer
        clock = self._current().clock
        lane.status.set(st.SEND, dst, 0, clock)
        for w in reversed(works):          # the last one done means all are: one wake-up
            w.wait()
        lane.status.set(st.RUNNING, -1, 0, clock)

    def _retire_oldest(self, lane):
        """Complete the oldest buffered send, and stop counting its bytes."""
        transfer = lane.in_flight.popleft()
        self._complete(transfer, lane)
        lane.in_flight_bytes -= transfer[3]      # (works, tensors, dst, nbytes)

    # -- receiving ------------------------------------------------------------
    def irecv(self, comm, src, expect, out, tag):
        req = _Request(self, comm, "recv", src, tag)
        req.index = self.posted_count[req.key]
        self.posted_count[req.key] += 1
        req.out, req.expect = out, expect
        self.posted[req.key].append(req)
        return req

    def _wait(self, req):
        if req.kind == "send":
            if req.works is not None:       # an unbuffered send: wait until it is received
                self._complete(req.works, self.lanes[req.comm._stream])
                req.works, req.done = None, True
            return None
        me = req.comm._me
        # Receives on one channel complete in the order they were posted, like
        # the messages on it: receive earlier ones first.
        while not req.done:
            self._receive_next(req.key)
        if not req.logged:
            req.logged = True
            me.log.append(("recv", req.peer, req.tag, req.index, req.comm.group.label))
        me.clock = max(me.clock, req.step)
        if req.error is not None:
            err, req.error = req.error, None
            raise err
        return req.payload

    def _receive_next(self, key):
        req = self.posted[key].popleft()
        self.lanes[req.comm._stream].status.set(st.RECV, req.peer, req.tag, req.comm._me.clock)
        self._deliver(req, *self.wire.recv(req.peer, req.tag, self._pg(req.comm)))

    def _deliver(self, req, words, data):
        """Complete receive ``req`` with a message's header words and bytes."""
        comm = req.comm
        step, code, nbytes, has_chunk, chunk, ndim = words[:6]
        shape, dtype = tuple(words[6:6 + ndim]), np.dtype(DTYPES[code])
        array = data.view(dtype).reshape(shape)
        error = _mismatch(comm.rank, comm._index[req.peer], step, req.expect, shape, dtype,
                          chunk if has_chunk else None)
        if error is not None:
            req.error = error
        elif req.out is not None:
            req.out[...] = array
            array = req.out
        self.received[req.key] += 1
        lane = self.lanes[comm._stream]
        # RUNNING before the count: a reader that sees the message counted as
        # received must not also see this rank still waiting for it (a busy
        # machine can stop us between the two writes, and the parent would
        # report a deadlock that is not there).
        lane.status.set(st.RUNNING, -1, 0, max(comm._me.clock, step))
        lane.status.count_recv(req.peer)
        req.payload, req.step, req.done = array, step, True

    def recv_any(self, comm, tag):
        """``recv_any``: the first message to arrive here from any rank of the group.
        Which one that is depends on real timing, so it may not be the one the
        simulator picks; the log records the sender, so the replayed steps are
        this run's. (Don't mix it with pending ``irecv``s on the same tag.)"""
        if self.device is not None:
            raise CommError(f"rank {comm.rank}: recv_any needs backend='torch' (gloo): NCCL has "
                            f"no receive from any source")
        lane = self.lanes[comm._stream]
        lane.status.set(st.RECV, -1, tag, comm._me.clock)      # peer -1: any
        src, words, data = self.wire.recv_any(tag, self._pg(comm))
        req = _Request(self, comm, "recv", src, tag)
        req.index = self.posted_count[req.key]
        self.posted_count[req.key] += 1
        req.expect = (None, None)
        self._deliver(req, words, data)
        return src, self._wait(req)

    # -- time and labels ------------------------------------------------------------
    def compute(self, comm, seconds, label, meta):
        # Real processes do not simulate time: the event says when (in real
        # seconds since this rank started) the program said it computes.
        me, now = comm._me, time.perf_counter() - self.t0
        me.log.append(("compute", seconds))     # the replay spends it: it orders the ports
        self.computes.append(Compute(me.rank, label, now, now, me.clock, me.stream,
                                     tuple(sorted(meta.items()))))

    def memory(self, comm, label, nbytes):
        # Recorded at time 0 with a causal step; the replay (sim.replay) gives
        # it the simulator's time and step, as it does the spans.
        nbytes = self.ledger.change(comm, label, nbytes)
        me = comm._me
        me.log.append(("memory", label, nbytes))
        self.memory_events.append(MemoryEvent(me.rank, label, nbytes, me.time, me.clock, me.stream))

    def span_enter(self, comm, name):
        comm._me.log.append(("enter", name, comm.group.label))
        return super().span_enter(comm, name)

    def span_exit(self, comm, token):
        super().span_exit(comm, token)
        comm._me.log.append(("exit",))

    def sendrecv(self, comm, array, dst, src, chunk, op, tag):
        """Unlike the simulator's, this ``sendrecv`` sends the array without
        copying it, so it returns once the peer has received it (as
        ``MPI_Sendrecv`` does, and as the simulator's rendezvous mode would).
        That saves a copy of every chunk of a ring collective. On GPUs the send
        and the receive go to NCCL as one group (see ``_sendrecv_grouped``)."""
        if self.device is not None:
            return self._sendrecv_grouped(comm, array, dst, src, chunk, op, tag)
        req = self.isend(comm, array, dst, chunk, op, tag, buffered=False)
        got = self.recv(comm, src, ANY, None, tag)
        req.wait()
        return got

    # -- groups and agreements ------------------------------------------------------
    def _gather(self, comm, value):
        """Every rank's ``value``, on every rank of ``comm``'s group (control plane:
        no messages in the trace, like the simulator's agreements)."""
        lane, me = self.lanes[comm._stream], comm._me
        lane.status.set(st.AGREE, -1, 0, me.clock)
        told = [None] * comm.world_size
        pg = self._pg(comm)
        dist.all_gather_object(told, value, group=pg)
        lane.status.set(st.RUNNING, -1, 0, me.clock)
        # In the process group's rank order, which older torch sorts: put it in ours.
        order = dist.get_process_group_ranks(pg) if pg is not None else list(range(self.world_size))
        return [told[order.index(g)] for g in comm.group.ranks]

    def agree(self, comm, value, what):
        me = comm._me
        told = self._gather(comm, (what, value, me.clock))
        other = next((w for w, _, _ in told if w != what), None)
        if other is not None:
            raise CommError(f"rank {comm.rank}: called {what}() while other ranks of its group "
                            f"called {other}(): every rank must make the same calls in the same order")
        me.clock = max(c for _, _, c in told)          # as in the simulator: everyone waited for the last
        me.log.append(("agree", comm.group.label, what, value))
        return [v for _, v, _ in told]

    def new_group(self, comm, ranks, name):
        # dist.new_group must be called by every process, for every group, in
        # the same order. A group made from the world's comm by the program
        # gives exactly that; one made from a smaller group, or from a work's
        # thread, would not, so those are refused.
        if comm.group.label is not None or comm._stream:
            raise CommError(f"rank {comm.rank}: on real processes (backend='torch') make groups from "
                            f"the whole world's comm, in the program (not in a comm.start work); "
                            f"this call is on group {comm.group.label!r}, stream {comm._stream}")
        k = sum(1 for op in comm._me.log if op[0] == "new_group")
        told = self._gather(comm, (ranks, name))     # check all agree before dist.new_group can hang
        for other, (asked, asked_name) in enumerate(told):
            if (asked, asked_name) != (ranks, name):
                raise CommError(f"rank {comm.rank}: its new_group call #{k + 1} asks for ranks "
                                f"{list(ranks)} (name {name!r}) but rank {other} asked for ranks "
                                f"{list(asked)} (name {asked_name!r}): every rank must create the "
                                f"same groups in the same order")
        # The simulator's labels: the name, else the ranks; a repeated one gets "#n".
        label = group_label(name, ranks, self.groups.values())
        group = self.groups[label] = Group(ranks, label, len(self.groups))
        for stream in (0, 1):
            self.pgs[(label, stream)] = _new_group(list(ranks))
        comm._me.log.append(("new_group", None, [comm._index[r] for r in ranks], name))
        return group

    # -- the communication stream ----------------------------------------------------
    def start(self, comm, fn, args, kwargs):
        # One thread per group runs its works, one after another, as the
        # simulator runs the works of one (group, rank) in order.
        me, label = comm._me, comm.group.label
        actor = _Actor(me.rank, 1, me.clock)
        actor.span_path = me.span_path          # as the simulator: the starter's span
        work = _Work(self, actor, len(self.works))
        self.works.append(work)
        me.log.append(("start", work.index, label))
        prev = self.last_work.get(label)
        self.last_work[label] = work
        pool = self.threads.get(label)
        if pool is None:
            pool = self.threads[label] = ThreadPoolExecutor(1, thread_name_prefix=f"ringlab-stream-{label}")
        work.future = pool.submit(self._run_work, actor, prev, comm.group, fn, args, kwargs)
        return work

    def _run_work(self, actor, prev, group, fn, args, kwargs):
        self.local.actor = actor
        if prev is not None:           # done already: this thread ran it
            actor.clock = max(actor.clock, prev.actor.clock)
        return fn(Comm(self, actor, group, stream=1), *args, **kwargs)

    def _wait_work(self, work):
        me = self._current()
        me.log.append(("wait_work", work.index))
        lane = self.lanes[me.stream]
        lane.status.set(st.AGREE, -1, 0, me.clock)
        result = work.future.result()      # a work's error is raised here, in the waiter
        lane.status.set(st.RUNNING, -1, 0, me.clock)
        me.clock = max(me.clock, work.actor.clock)
        return result

    def join_works(self):
        """Wait until every work has finished (the simulator's run does too);
        raises the first error of one."""
        try:
            for work in self.works:
                if not work.future.done():
                    self.status.set(st.AGREE, -1, 0, self.me.clock)
                work.future.result()
        finally:
            for pool in self.threads.values():
                pool.shutdown(wait=False, cancel_futures=True)

    # -- the end ----------------------------------------------------------------
    def unwaited(self):
        """``{channel: n}``: receives posted with irecv but never waited for.
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
        spans = list(me.spans) + [s for w in list(self.works) for s in w.actor.spans]
        return Outcome(self.rank, events=list(self.events), spans=spans, log=list(self.log),
                       work_logs=[list(w.actor.log) for w in list(self.works)],
                       computes=list(self.computes), memory=list(self.memory_events), received=received,
                       unwaited=unwaited, step=me.clock, payloads=self.payloads, **fields)

    def finish(self, drain=None):
        """Receive the messages of posted-but-unwaited irecvs (``drain`` says how
        many exist), then wait until every message we sent has been received."""
        for key, count in (drain or {}).items():
            for _ in range(count):
                self._receive_next(key)
        for lane in self.lanes.values():
            while lane.in_flight:
                self._retire_oldest(lane)


def _new_group(ranks):
    """``dist.new_group(ranks)``, in our rank order where torch can keep it
    (``sort_ranks``, torch 2.13); older torch sorts the ranks. Messages name
    global ranks, so only gathered lists depend on it (see ``_gather``)."""
    if "sort_ranks" in inspect.signature(dist.new_group).parameters:
        return dist.new_group(ranks, sort_ranks=False)
    return dist.new_group(ranks)


def run_rank(program, x, args, kwargs, rank, world_size, device=None, status=None,
             record_payloads=False):
    """Run ``program(comm, x, *args, **kwargs)`` as ``rank`` of the current
    process group; returns ``(world, Outcome)``. Never raises for learner bugs."""
    global current_world
    world = current_world = ProcessWorld(rank, world_size, device, status, record_payloads)
    comm = Comm(world, world.me, world.world_group)
    try:
        if device is not None:
            # NCCL sets up its communicator in the first collective, and when that is
            # a batch_isend_irecv (our sendrecv) every rank must take part: make it this.
            dist.barrier()
        world.setup()
    except Exception as e:  # noqa: BLE001 - not the learner's fault: say what broke, in full
        world.status.set(st.FAILED, -1, 0, 0)
        setup = RuntimeError(f"ringlab could not set up the process of rank {rank} "
                             f"(torch {torch_version()}): {type(e).__name__}: {e}")
        return world, world.report(error=setup, traceback=traceback.format_exc())
    world.status.set(st.RUNNING, -1, 0, 0)
    try:
        result = program(comm, x, *args, **(kwargs or {}))
        world.join_works()
    except BaseException as e:  # noqa: BLE001 - reported with the rank's traceback
        world.status.set(st.FAILED, -1, 0, comm.step)
        return world, world.report(**error_report(e))
    world.status.set(st.DONE, -1, 0, comm.step)
    return world, world.report(result=result)


def torch_version():
    import torch
    return torch.__version__


# Frames that are not the learner's: the backends', the simulator's, Comm's, torch's.
_HIDDEN = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
           os.path.dirname(os.path.abspath(sim_world.__file__)) + os.sep,
           os.path.abspath(sys.modules[Comm.__module__].__file__),
           os.path.dirname(os.path.dirname(os.path.abspath(dist.__file__))) + os.sep)


def _hidden(filename):
    return filename.startswith("<frozen") or os.path.abspath(filename).startswith(_HIDDEN)


def _frames(walk):
    """``(filename, lineno, name, firstlineno)`` of the learner's frames. The
    parent turns them into text (see ``outcome.format_frames``): it can read
    lines of notebook cells, which this process cannot."""
    return [(f.f_code.co_filename, lineno, f.f_code.co_name, f.f_code.co_firstlineno)
            for f, lineno in walk if not _hidden(f.f_code.co_filename)]


def error_report(exc):
    """Outcome fields for an exception: its frames and its last line."""
    return dict(error=exc, frames=_frames(traceback.walk_tb(exc.__traceback__)),
                traceback=f"{type(exc).__name__}: {said(exc)}\n")


def stack_report(frame):
    """Where the main thread is now (asked for at a timeout), innermost 6 frames."""
    return json.dumps(_frames(reversed(list(traceback.walk_stack(frame))))[-6:])
