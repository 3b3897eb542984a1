"""The reference scheduler: ``ringlab/sim/world.py`` as it was before its fast
path (commit e029f30), kept verbatim but for its imports and this note, with
the alpha-beta ports of that commit too. It is the straightforward code the
simulator's fast path is checked against: ``tests/sim/test_fast_path.py`` runs
random programs on both and wants bit-identical traces. Change it only to follow
a deliberate change of the simulator's semantics.
"""

from __future__ import annotations

import functools
import heapq
import threading
import types
from collections import defaultdict, deque

import greenlet
import numpy as np

from ringlab.comm import ANY, Comm, Group, Ledger, group_label, mismatch, dtype_name
from ringlab.comm import World as WorldProtocol
from ringlab.errors import CommError, Wait
from ringlab.trace import Compute, Event, MemoryEvent, Trace
from ringlab.cost.alpha_beta import Ports
from ringlab.sim.watchdog import Interrupt

MODES = ("buffered", "rendezvous")
# Ranks that refused to unwind. Kept alive on purpose: collecting a suspended
# greenlet throws GreenletExit into it again, and it would loop again.
_ABANDONED = []
WORLD = 0        # the whole world's group id
_INF = float("inf")
_LAST = 1 << 62      # a heap order after every actor's (see World._order)


class Actor:
    """A rank's program (stream 0) or one of its works (stream 1)."""

    __slots__ = ("rank", "stream", "glet", "clock", "time", "waiting", "finished", "result",
                 "spans", "span_path", "comm", "unwinding", "abandoned", "timer", "polled")

    def __init__(self, rank, stream=0, clock=0, time=0.0):
        self.rank, self.stream, self.glet, self.clock, self.time = rank, stream, None, clock, time
        self.waiting, self.finished, self.result = None, False, None
        self.spans, self.span_path, self.comm = [], "", None
        self.unwinding = False
        self.abandoned = False     # it kept catching the time limit: never resumed again
        self.timer = None          # its heap entry while a polling loop waits (see _poll_wait)
        self.polled = None         # (time, clock, ids of what it polled then): see _poll

    def key(self):
        return (self.time, self.clock, self.rank, self.stream)


class Request:
    """A pending ``isend`` or ``irecv``. Call ``wait()`` to complete it;
    for a receive, ``wait()`` returns the array."""

    __slots__ = ("_world", "kind", "owner", "comm", "peer", "tag", "done", "payload", "step",
                 "end", "error", "expect", "out", "event", "posted",
                 "index", "partner")     # a send on a flow network: its event, its receive

    def __init__(self, world, kind, comm, peer, tag, done=False, step=0, end=0.0):
        self._world, self.kind, self.comm, self.owner = world, kind, comm, comm._me
        self.peer, self.tag, self.done, self.step, self.end = peer, tag, done, step, end
        self.payload = self.error = self.expect = self.out = self.event = None
        self.posted = self.owner.time

    def wait(self):
        return self._world._wait(self)

    def is_completed(self):
        """Whether it is complete at this rank's simulated time (see ``World._poll``:
        a poll costs no time; a loop that only polls waits for the next event)."""
        return self._world._poll(self.owner, self, lambda: self.end if self.done else None)

    def describe(self):
        comm, tag = self.comm, f", tag={self.tag}" if self.tag else ""
        where = "" if comm.group.label is None else f" in group {comm.group.label!r}"
        peer = comm._index[self.peer]
        if self.kind == "recv":
            return f"recv(src={peer}{tag}){where}"
        return (f"send(dst={peer}{tag}){where} of step {self.step}, waiting for rank {peer} "
                f"to post a matching recv")


class Work:
    """What ``comm.start`` returns: ``wait()`` gives the function's result."""

    def __init__(self, world, actor, name):
        self._world, self.actor, self.name = world, actor, name
        self.done, self.result, self.waiters = False, None, []

    def wait(self):
        return self._world._wait_work(self)

    def is_completed(self):
        """Whether the work has finished by this rank's simulated time (see ``World._poll``)."""
        return self._world._poll(self._world.current, self,
                                 lambda: self.actor.time if self.done else None)

    def describe(self):
        return f"work.wait() for {self.name} on the communication stream"


class _Agreement:
    """A barrier or a split in progress: who has arrived, with what."""

    def __init__(self, group, what):
        self.group, self.what = group, what
        self.values, self.arrived, self.waiters = [None] * group.size, set(), []
        self.clock, self.time, self.done = 0, 0.0, False

    def describe(self):
        missing = [r for r in range(self.group.size) if r not in self.arrived]
        where = "" if self.group.label is None else f" of group {self.group.label!r}"
        return f"{self.what}(){where}, which ranks {missing} have not called"


class _AnyRecv:
    def __init__(self, comm, tag):
        self.comm, self.tag, self.src, self.payload, self.step, self.end = comm, tag, None, None, 0, 0.0

    def describe(self):
        tag = f"tag={self.tag}" if self.tag else ""
        return f"recv_any({tag})"


class _Channel:
    __slots__ = ("messages", "receives", "sent")

    def __init__(self):
        self.messages = deque()   # sent, not yet matched: (event index, payload, send request)
        self.receives = deque()   # posted receives, not yet matched
        self.sent = 0


class ReferencePorts:
    """``ringlab.cost.alpha_beta.Ports`` as it was: one booking rule for every model."""

    def __init__(self, model, per="rank"):
        self.model, self.per = model, per
        self.send_free, self.recv_free = {}, {}

    def transfer(self, src, dst, nbytes, ready):
        out, into = (src, dst) if self.per == "rank" else ((src, dst), (src, dst))
        start = max(ready, self.send_free.get(out, 0.0), self.recv_free.get(into, 0.0))
        end = start + self.model.between(src, dst).message(nbytes)
        self.send_free[out] = self.recv_free[into] = end
        return start, end


class World(WorldProtocol):
    """The simulator's world: ``ringlab.comm.World``'s methods, run on actors."""

    def __init__(self, world_size, mode, record_payloads, network):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.world_size, self.mode = world_size, mode
        self.rendezvous = mode == "rendezvous"
        self.network, self.ports = network, None if network is None else network.ports(world_size)
        if isinstance(self.ports, Ports):
            self.ports = ReferencePorts(self.ports.model, self.ports.per)
        # A network that decides when a message arrives only later (flow sharing:
        # ringlab.cost.topology) runs as one more actor of the scheduler (see _network_loop).
        self.deferred = getattr(self.ports, "deferred", False)
        self.net_glet = self.net_wake = None
        self.send_step = [0] * world_size     # the last step each rank's send port carried
        self.recv_step = [0] * world_size     # and its receive port
        self.groups = {(): Group(tuple(range(world_size)), None, WORLD)}
        self.asked = {}
        self.group_calls = defaultdict(int)   # (rank, parent gid) -> new_group calls so far
        self.agreements, self.agree_calls = {}, defaultdict(int)
        self.actors = [Actor(r) for r in range(world_size)]
        self.streams = {}                     # (gid, rank) -> the last Work started there
        self.works = []
        self.channels = defaultdict(_Channel)  # (gid, stream, src, dst, tag) -> _Channel
        self.events, self.computes, self.memory_events = [], [], []
        self.ledger = Ledger()                # comm.alloc/free's book
        # Recorded payloads are the grader's record of what travelled: a receiver
        # gets a copy of its own (copy on receive), so that changing what it
        # received in place cannot change the record. ``handed``: (event, the
        # array handed over), to tell later which receiver changed its array.
        self.payloads = {} if record_payloads else None
        self.handed = [] if record_payloads else None
        self.heap, self.pushes = [], 0
        self.any_waiters = []
        self.current = None
        self.thread = threading.get_ident()   # the thread that runs the world (see run)
        self.failure = None
        self.aborting = False

    @property
    def world_group(self):
        return self.groups[()]

    # -- the scheduler --------------------------------------------------------------
    # Heap entries: (time, order, push count, actor), with order = the step
    # clock, then rank, then stream folded into one int: cheap to compare.
    def _order(self, actor):
        return (actor.clock * self.world_size + actor.rank) * 2 + actor.stream

    def _push(self, actor):
        self.pushes += 1
        heapq.heappush(self.heap, (actor.time, self._order(actor), self.pushes, actor))

    def _yield(self):
        """Hand control on until someone wakes us: straight to the next actor
        (one greenlet switch instead of two), or to the scheduler's loop when
        it has more to decide (a recv_any, or nothing left to run)."""
        heap = self.heap
        # Only to an actor already started: one started from here would nest in
        # our stack (greenlet counts its recursion depth from ours).
        if heap and heap[0][-1].glet and not self.any_waiters:
            nxt = heapq.heappop(heap)[-1]
            self.current = nxt
            nxt.glet.switch()
        else:
            self.hub.switch()
        if self.aborting:
            self._abort_here()

    def _block(self, me, on):
        me.waiting = on
        while me.waiting is on:
            self._yield()

    def _sync(self, me):
        """Let every actor that is behind ``me`` run first: what ``me`` does next
        books a port, and ports serve in time order."""
        heap = self.heap
        if not heap:
            return
        top, order = heap[0], self._order(me)
        if top[0] < me.time or top[0] == me.time and top[1] < order:
            if top[-1].glet and not self.any_waiters:
                # Swap places with the top in one heap operation and run it directly.
                self.pushes += 1
                nxt = heapq.heapreplace(heap, (me.time, order, self.pushes, me))[-1]
                self.current = nxt
                nxt.glet.switch()
                if self.aborting:
                    self._abort_here()
            else:
                self._push(me)
                self._yield()

    def _poll(self, me, what, end):
        """``is_completed()`` of ``what`` (a request or a work), asked by ``me``:
        True if it completed at or before ``me``'s simulated time (``end()``:
        its end, or None while it runs).

        A poll costs no simulated time and moves no clock: it first lets every
        actor behind ``me`` run (so the answer is exact at ``me``'s time: an
        ``MPI_Test`` that makes progress), then answers. A program that polls
        once between two computes therefore times exactly as one that does not
        poll. Polling the same thing again at the same instant (a loop that
        only polls, ``while not work.is_completed(): pass``) would never let
        time pass, so that poll waits (``_poll_wait``)."""
        self._same_thread()
        self._sync(me)
        done = end()
        if done is not None and done <= me.time:
            return True
        here = (me.time, me.clock)
        if me.polled is None or me.polled[:2] != here:
            me.polled = (*here, set())
        if id(what) not in me.polled[2]:
            me.polled[2].add(id(what))
            return False
        me.polled = None
        self._poll_wait(me, what, done)
        done = end()
        return done is not None and done <= me.time

    def _poll_wait(self, me, what, done):
        """A polling loop's turn: wait for ``what`` (a request or a work) as a
        blocking wait would, but only until the next thing that happens: the
        next actor that runs (not one that only polls), or ``what``'s own end
        (``done``). Then the loop looks again. Nothing else moves the clock, so
        a loop that polls ends at the same simulated time as a wait; and one
        that polls what never comes, while everyone else only polls too, is a
        deadlock, reported as one."""
        heap = self.heap
        others = [e for e in heap if e[-1].timer is not e and e[-1] is not me]
        until = min((e[0] for e in others), default=None)
        if done is not None:
            until = done if until is None else min(until, done)
        me.waiting = what
        if isinstance(what, Work):
            what.waiters.append(me)
        if until is not None:
            # After every actor of that time: what they do there is what it waits for.
            self.pushes += 1
            me.timer = (max(me.time, until), _LAST, self.pushes, me)
            heapq.heappush(heap, me.timer)
        self._yield()
        if me.timer is not None:           # the timer ran out: time passed while it polled
            me.time, me.timer = max(me.time, me.timer[0]), None
        me.waiting = None

    def _same_thread(self):
        """Ranks run on the thread that runs the world: a call from a thread the
        program started itself would run a rank outside the scheduler."""
        if threading.get_ident() != self.thread:
            raise CommError("communication calls must come from the program or from a work "
                            "(comm.start), not from a thread the program started itself")

    def _wake(self, actor, clock, time):
        actor.waiting = None
        actor.clock, actor.time = max(actor.clock, clock), max(actor.time, time)
        if actor.timer is not None:        # a polling loop's wait ends early: no timer now
            self.heap.remove(actor.timer)
            heapq.heapify(self.heap)
            actor.timer = None
        self._push(actor)

    def _main(self, me, program, comm, x, args, kwargs):
        try:
            me.result = program(comm, x, *args, **kwargs)
            me.finished = True
        except greenlet.GreenletExit as e:
            if not self.aborting:          # the program raised it itself: its error
                self.failure = self.failure or ("error", me, e)
        except BaseException as e:  # noqa: BLE001 - reported with the rank's traceback
            self.failure = self.failure or ("error", me, e)

    def run(self, program, inputs, args, kwargs):
        self.hub, self.thread = greenlet.getcurrent(), threading.get_ident()
        if self.deferred:
            self.ports.bind(self)
            self.net_glet = greenlet.greenlet(self._network_loop, parent=self.hub)
        for me in self.actors:
            me.comm = Comm(self, me, self.world_group)
            me.glet = greenlet.greenlet(
                functools.partial(self._main, me, program, me.comm, inputs[me.rank], args, kwargs),
                parent=self.hub)
            self._push(me)
        heap = self.heap
        while self.failure is None:
            if self.any_waiters and self._resolve_any():
                continue
            if not heap:
                break
            me = heapq.heappop(heap)[-1]
            self.current = me
            me.glet.switch()
            self.current = None

    def all_actors(self):
        return self.actors + [w.actor for w in self.works]

    def _abort_here(self):
        """Called in a rank that the end of the run is unwinding. The first time
        it raises GreenletExit; a rank that caught that and called in again (a
        retry loop with a bare ``except:``) is left suspended instead."""
        me = self.current
        if me is not None and me.glet is greenlet.getcurrent() and not me.unwinding:
            me.unwinding = True
            raise greenlet.GreenletExit
        self.hub.switch()

    def give_up(self, frame):
        """Called by the watchdog's signal handler, in whatever code is running,
        when the program keeps catching the time limit's interrupt. If that is a
        rank (or one of its works), leave it for good: switch back to the
        scheduler and raise the interrupt there. A switch is not an exception,
        so no ``except`` in the rank can stop it; the rank stays suspended here,
        and the run ends with a timeout at ``frame``, where the rank was."""
        me = self.current
        if me is None or me.glet is not greenlet.getcurrent() or me.glet is self.net_glet:
            return          # the scheduler or the network: ringlab's own code, not stuck
        me.abandoned = True
        tb = None           # the rank's frames, innermost last, for the diagnosis
        while frame is not None:
            tb = types.TracebackType(tb, frame, frame.f_lasti, frame.f_lineno)
            frame = frame.f_back
        self.hub.throw(Interrupt, Interrupt(), tb)

    def kill_unfinished(self):
        self.aborting = True
        if self.net_glet:                  # the network's actor: it just stops
            self.net_glet.throw(greenlet.GreenletExit)
        for me in self.all_actors():
            # A greenlet is true while started and not yet finished. One given up
            # on is not resumed: it would go on catching whatever we throw at it.
            if me.glet and not me.abandoned:
                self.current = me
                try:
                    me.glet.throw(greenlet.GreenletExit)
                except BaseException:  # noqa: BLE001 - a dying rank (or give_up) cannot report more
                    pass
            if me.glet:         # it caught the exit and called in again, or was given up on
                _ABANDONED.append(me.glet)
        self.current = None

    # -- point to point -------------------------------------------------------------
    def isend(self, comm, array, dst, chunk, op, tag):
        self._same_thread()
        me = comm._me
        self._sync(me)
        payload = np.array(array, copy=True)   # buffered: later changes do not travel
        src = me.rank
        step = max(me.clock, self.send_step[src], self.recv_step[dst]) + 1
        self.send_step[src] = self.recv_step[dst] = me.clock = step
        gid, stream = comm.group.gid, comm._stream
        ch = self.channels[(gid, stream, src, dst, tag)]
        start = end = None
        if self.ports is not None and not self.rendezvous:
            start, end = self.ports.transfer(src, dst, payload.nbytes, me.time)
        ev = Event(step, src, dst, chunk, op, payload.nbytes, me.span_path, tag, payload.shape,
                   dtype_name(payload.dtype), ch.sent, comm.group.label, stream, start, end)
        ch.sent += 1
        self.events.append(ev)
        if self.payloads is not None:
            self.payloads[(ev.group, stream, src, dst, tag, ev.seq)] = payload
        req = Request(self, "send", comm, dst, tag, not self.rendezvous, step,
                      me.time if end is None else end)
        req.event = ev
        if end is None and start is not None:     # a flow network says later when it arrives
            self._launch(req, len(self.events) - 1)
        if ch.receives:
            self._match(len(self.events) - 1, payload, req, ch.receives.popleft())
        else:
            ch.messages.append((len(self.events) - 1, payload, req))
        return req

    def irecv(self, comm, src, expect, out, tag):
        self._same_thread()
        me = comm._me
        if self.rendezvous and self.ports is not None:
            self._sync(me)
        req = Request(self, "recv", comm, src, tag)
        req.out, req.expect = out, expect
        ch = self.channels[(comm.group.gid, comm._stream, src, me.rank, tag)]
        if ch.messages:
            self._match(*ch.messages.popleft(), req)
        else:
            ch.receives.append(req)
        return req

    def _match(self, index, payload, send_req, recv_req):
        ev = self.events[index]
        if self.rendezvous:
            end = max(send_req.posted, recv_req.posted)
            if self.ports is not None:
                start, end = self.ports.transfer(ev.src, ev.dst, ev.nbytes, end)
                ev = self.events[index] = ev._replace(start=start, end=end)
            if end is None:                       # a flow network: it completes both
                self._launch(send_req, index)
            else:
                send_req.end = end
                send_req.done = True
                if send_req.owner.waiting is send_req:
                    self._wake(send_req.owner, ev.step, end)
        comm = recv_req.comm
        error = None if recv_req.expect is ANY else mismatch(
            comm.rank, comm._index[ev.src], ev.step, recv_req.expect, tuple(payload.shape),
            payload.dtype, ev.chunk)
        if error is not None:
            recv_req.error = error
        elif recv_req.out is not None:
            recv_req.out[...] = payload
            payload = recv_req.out
        elif self.handed is not None:             # copy on receive (see __init__)
            payload = payload.copy()
            self.handed.append((ev, payload))
        recv_req.payload, recv_req.step, recv_req.event = payload, ev.step, ev
        if not send_req.done:                     # on a flow network's wire: _delivered
            send_req.partner = recv_req           # completes the receive too
            return
        recv_req.end = send_req.end
        recv_req.done = True
        if recv_req.owner.waiting is recv_req:
            self._wake(recv_req.owner, ev.step, recv_req.end)

    def _wait(self, req):
        self._same_thread()
        me = req.owner
        if self.current is not me:
            who = self.current.rank if self.current else "?"
            raise CommError(f"rank {who} waited on a request of rank {me.rank}; each rank may "
                            f"only wait on its own requests")
        if not req.done:
            self._block(me, req)
        me.clock, me.time = max(me.clock, req.step), max(me.time, req.end)
        if req.kind == "recv":
            if req.error is not None:
                err, req.error = req.error, None
                raise err
            return req.payload
        return None

    # -- a network that decides arrivals later (flow sharing) -------------------------------
    # Under max-min sharing a message's arrival depends on messages sent after it,
    # so it cannot be priced when it is sent (as AlphaBeta's ports are). Such a
    # network (``ports.deferred``) is one more actor of the scheduler: its heap
    # entries come before every rank's at the same time (order -1), and it runs
    # once every actor has reached its next event, when no send still to come can
    # start earlier and change it. It then ends the flows due (``_delivered``),
    # re-shares the links, and books its next event. Ranks block on a send or
    # receive still on the wire and wake at its arrival, like on any other wait.
    def _launch(self, req, index):
        """Put the message of send ``req`` (event ``index``) on the wire."""
        req.done, req.end, req.index, req.partner = False, _INF, index, None
        ev = self.events[index]
        self.ports.launch(ev.src, ev.dst, ev.nbytes, ev.start, req)

    def _delivered(self, req, end):
        """The network says: the message of send ``req`` arrived at ``end``."""
        ev = self.events[req.index] = Event._make(self.events[req.index][:-1] + (end,))
        req.event, req.end, req.done = ev, end, True
        if req.owner.waiting is req:
            self._wake(req.owner, ev.step, end)
        recv = req.partner
        if recv is not None:
            recv.event, recv.end, recv.done = ev, end, True
            if recv.owner.waiting is recv:
                self._wake(recv.owner, ev.step, end)

    def _network_at(self, time):
        """Make the network run at ``time`` (or earlier, if it already will)."""
        if self.net_wake is not None and self.net_wake.time <= time:
            return
        # A later wake stays in the heap, superseded: it will wake the network for nothing.
        wake = self.net_wake = Actor(-1, 0, 0, time)
        wake.glet = self.net_glet
        self.pushes += 1
        heapq.heappush(self.heap, (time, -1, self.pushes, wake))

    def _network_loop(self):
        try:
            while True:
                wake = self.current
                if wake is self.net_wake:
                    self.net_wake = None
                    self.ports.advance(wake.time)      # delivers, and books its next event
                self._yield()
        except Interrupt as e:                 # the run's timeout landed here
            self.failure = self.failure or ("timeout", None, e)

    # -- receive from anyone --------------------------------------------------------------
    def recv_any(self, comm, tag):
        self._same_thread()
        me = comm._me
        waiter = _AnyRecv(comm, tag)
        self.any_waiters.append(waiter)
        self._block(me, waiter)
        return waiter.src, waiter.payload

    def _resolve_any(self):
        """Give the earliest message to a waiting ``recv_any`` once no runnable
        actor could still send an earlier one. True if one was given."""
        best = None
        for waiter in self.any_waiters:
            comm, me = waiter.comm, waiter.comm._me
            for src in comm.group.ranks:
                ch = self.channels.get((comm.group.gid, comm._stream, src, me.rank, waiter.tag))
                if ch is not None and ch.messages:
                    index, _, send_req = ch.messages[0]
                    ev = self.events[index]
                    key = (send_req.end, ev.step, src, me.rank)
                    if best is None or key < best[0]:
                        best = (key, waiter, ch)
        if best is None:
            return False
        (arrival, step, _, _), waiter, ch = best
        # Any message still to come is posted by a runnable actor, at or after its
        # time and in a step after its clock: the top of the heap bounds them all.
        if self.heap and (arrival, step) > (self.heap[0][0], self.heap[0][1] // (2 * self.world_size)):
            return False
        self.any_waiters.remove(waiter)
        comm = waiter.comm
        req = Request(self, "recv", comm, ch.messages[0][2].owner.rank, waiter.tag)
        req.expect = ANY
        self._match(*ch.messages.popleft(), req)
        waiter.src, waiter.payload = req.peer, req.payload
        self._wake(comm._me, req.step, req.end)
        return True

    # -- time -----------------------------------------------------------------------------
    def compute(self, comm, seconds, label, meta):
        self._same_thread()
        me = comm._me
        self.computes.append(Compute(me.rank, label, me.time, me.time + seconds, me.clock,
                                     me.stream, tuple(sorted(meta.items()))))
        me.time += seconds
        # Let the actors this compute ran past (a work started before it, say) run
        # first: so Python runs side effects in simulated-time order, and a work
        # started before a buffer is written sends the buffer as it was then.
        self._sync(me)

    def memory(self, comm, label, nbytes):
        self._same_thread()
        nbytes = self.ledger.change(comm, label, nbytes)
        me = comm._me       # memory takes no time: just a note at the rank's time and step
        self.memory_events.append(MemoryEvent(me.rank, label, nbytes, me.time, me.clock, me.stream))

    def start(self, comm, fn, args, kwargs):
        self._same_thread()
        me = comm._me
        actor = Actor(me.rank, 1, me.clock, me.time)
        # A work belongs to the span it was started in ("backward/ring_allreduce"),
        # as an async_op collective belongs to the code that issued it.
        actor.span_path = me.span_path
        actor.comm = Comm(self, actor, comm.group, stream=1)
        name = getattr(fn, "__name__", "work")
        work = Work(self, actor, name)
        prev = self.streams.get((comm.group.gid, me.rank))
        self.streams[(comm.group.gid, me.rank)] = work
        actor.glet = greenlet.greenlet(
            functools.partial(self._work_main, actor, work, prev, fn, args, kwargs), parent=self.hub)
        self.works.append(work)
        self._push(actor)
        return work

    def _work_main(self, actor, work, prev, fn, args, kwargs):
        try:
            if prev is not None:           # works on one stream run in order
                self._wait_work(prev, actor)
            work.result = fn(actor.comm, *args, **kwargs)
            work.done = actor.finished = True
            for waiter in work.waiters:
                if waiter.waiting is work:
                    self._wake(waiter, actor.clock, actor.time)
        except greenlet.GreenletExit:
            raise
        except BaseException as e:  # noqa: BLE001
            self.failure = self.failure or ("error", actor, e)

    def _wait_work(self, work, me=None):
        self._same_thread()
        me = me or self.current
        if not work.done:
            work.waiters.append(me)
            self._block(me, work)
        me.clock, me.time = max(me.clock, work.actor.clock), max(me.time, work.actor.time)
        return work.result

    # -- groups ------------------------------------------------------------------------------
    def new_group(self, comm, ranks, name):
        self._same_thread()
        me = comm._me
        k = self.group_calls[(me.rank, comm.group.gid)]
        self.group_calls[(me.rank, comm.group.gid)] = k + 1
        key = (comm.group.gid, k)
        group = self.groups.get(key)
        if group is None:
            label = group_label(name, ranks, self.groups.values())
            group = self.groups[key] = Group(ranks, label, len(self.groups))
            self.asked[key] = (ranks, name, me.rank)
        elif self.asked[key][:2] != (ranks, name):
            asked, asked_name, other = self.asked[key]
            raise CommError(f"rank {comm.rank}: its new_group call #{k + 1} asks for ranks "
                            f"{list(ranks)} (name {name!r}) but rank {comm._index.get(other, other)} "
                            f"asked for ranks {list(asked)} (name {asked_name!r}): "
                            f"every rank must create the same groups in the same order")
        return group

    def agree(self, comm, value, what):
        self._same_thread()
        me = comm._me
        k = self.agree_calls[(me.rank, comm.group.gid)]
        self.agree_calls[(me.rank, comm.group.gid)] = k + 1
        ag = self.agreements.setdefault((comm.group.gid, k), _Agreement(comm.group, what))
        if ag.what != what:
            raise CommError(f"rank {comm.rank}: called {what}() while other ranks of its group "
                            f"called {ag.what}(): every rank must make the same calls in the same order")
        ag.values[comm.rank] = value
        ag.arrived.add(comm.rank)
        ag.clock, ag.time = max(ag.clock, me.clock), max(ag.time, me.time)
        if len(ag.arrived) == comm.group.size:
            ag.done = True
            for waiter in ag.waiters:
                self._wake(waiter, ag.clock, ag.time)
            me.clock, me.time = ag.clock, ag.time
        else:
            ag.waiters.append(me)
            self._block(me, ag)
        return list(ag.values)

    # -- after the run -----------------------------------------------------------------------
    def waits(self):
        """``{rank: Wait}`` for every rank with an actor that cannot go on."""
        out = {}
        for me in self.all_actors():
            if me.finished or me.rank in out or me.waiting is None:
                continue
            w = me.waiting
            kind = w.kind if isinstance(w, Request) else {Work: "work", _AnyRecv: "recv_any"}.get(
                type(w), getattr(w, "what", "?"))
            peer = w.peer if isinstance(w, Request) else None
            stream = " (on the communication stream)" if me.stream else ""
            out[me.rank] = Wait(kind, peer, f"waits in {w.describe()}{stream} (its clock: step {me.clock})")
        return out

    def unreceived(self):
        return [self.events[i] for ch in self.channels.values() for i, _, _ in ch.messages]

    def release(self):
        """Break the world's reference cycles (actor -> comm -> world -> actor) once
        a run is over, so that its arrays are freed when the caller lets go of
        them, not at the next garbage collection: a simulation that runs again
        then reuses warm memory instead of touching fresh pages."""
        for me in self.all_actors():
            me.comm = me.glet = me.waiting = me.result = None
        for container in (self.channels, self.heap, self.works, self.streams,
                          self.agreements, self.any_waiters):
            container.clear()
        self.actors, self.current, self.failure = [], None, None
        self.net_glet = self.net_wake = None
        if self.deferred:
            self.ports.release()

    def trace(self):
        """The run's trace so far (a failed run's errors carry it too, to explain
        where it stopped): messages, spans, computes, unreceived messages, groups, memory."""
        groups = {g.label: g.ranks for g in self.groups.values() if g.label is not None}
        return Trace(self.events, self.world_size, [s for me in self.all_actors() for s in me.spans],
                     self.unreceived(), self.computes, groups, self.memory_events)
