"""The simulated world: N ranks running one SPMD program, one message at a time.

You write a program once; ``run`` calls it once per rank, like ``torchrun``
or ``mpirun`` would::

    >>> import numpy as np, ringlab
    >>> def pass_right(comm, x):
    ...     right = (comm.rank + 1) % comm.world_size
    ...     left = (comm.rank - 1) % comm.world_size
    ...     comm.send(x, right)
    ...     return comm.recv(left)
    >>> res = ringlab.run(pass_right, [np.array([0.]), np.array([1.]), np.array([2.])])
    >>> [float(y[0]) for y in res.outputs]
    [2.0, 0.0, 1.0]

How ranks run. All ranks are greenlets (cooperative coroutines) in one OS
thread. A rank runs until it has to wait for a message, then hands control to
the scheduler, which resumes the next rank that can make progress, always in
the same order. So learner code stays plain blocking ``send``/``recv``, every
run is reproducible, and a deadlock is simply "no rank can run". A watchdog
thread interrupts a program that never finishes (an infinite loop), since a
loop that never calls ``recv`` never gives control back.

Steps come from causality, not from timing (the one-port model): each rank has
a clock; a send is stamped ``step = clock + 1`` and moves the clock there;
receiving a message stamped ``s`` sets ``clock = max(clock, s)``. A rank sends
at most one message per step, and a message can only be forwarded in a later
step than the one that brought it.
"""

from __future__ import annotations

import ctypes
import functools
import signal
import threading
import traceback
from collections import defaultdict, deque
from contextlib import contextmanager
from dataclasses import dataclass

import greenlet
import numpy as np

from .errors import (CommError, DeadlockError, ProgramTimeout, RankError,
                     UnreceivedMessagesError)
from .trace import Event, Span, Trace

MODES = ("buffered", "rendezvous")


class _Interrupt(BaseException):
    """Thrown into the running code by the watchdog. A BaseException, so that a
    learner's ``except Exception`` cannot swallow it."""


class Request:
    """A pending ``isend`` or ``irecv``. Call ``wait()`` to complete it;
    for a receive, ``wait()`` returns the array."""

    __slots__ = ("_world", "kind", "owner", "peer", "tag", "done", "payload",
                 "step", "error", "expect", "out", "event")

    def __init__(self, world, kind, owner, peer, tag):
        self._world, self.kind, self.owner, self.peer, self.tag = world, kind, owner, peer, tag
        self.done, self.payload, self.step, self.error = False, None, 0, None
        self.expect = self.out = self.event = None

    def wait(self):
        return self._world._wait(self)

    def is_completed(self):
        return self.done

    def describe(self):
        if self.kind == "recv":
            return f"recv(src={self.peer}" + (f", tag={self.tag}" if self.tag else "") + ")"
        return (f"send(dst={self.peer}" + (f", tag={self.tag}" if self.tag else "")
                + f") of step {self.event.step}, waiting for rank {self.peer} to post a matching recv")


class _Rank:
    __slots__ = ("rank", "glet", "clock", "waiting", "finished", "result", "spans", "span_path")

    def __init__(self, rank):
        self.rank, self.glet, self.clock = rank, None, 0
        self.waiting, self.finished, self.result = None, False, None
        self.spans, self.span_path = [], ""


class Comm:
    """What a rank's program talks through. One per rank.

    The calls mirror ``torch.distributed``'s point-to-point API, so the same
    program can later run on real processes.
    """

    def __init__(self, world, rank):
        self._world, self._me = world, world.ranks[rank]
        self.rank = rank
        self.world_size = world.world_size

    @property
    def step(self):
        """This rank's clock: the step of the last message it sent or received."""
        return self._me.clock

    def send(self, array, dst, *, chunk=None, op=None, tag=0):
        """Send ``array`` to rank ``dst``. ``chunk`` and ``op`` label the message
        in the trace (which piece moves, and what the receiver does with it)."""
        self.isend(array, dst, chunk=chunk, op=op, tag=tag).wait()

    def isend(self, array, dst, *, chunk=None, op=None, tag=0):
        """Start a send; returns a request. The payload is copied now, so you may
        change ``array`` afterwards without changing what arrives."""
        return self._world._isend(self._me, array, dst, chunk, op, tag)

    def recv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        """Receive the next message from rank ``src`` and return it.

        Pass ``out=`` (an array to fill, as in ``torch.distributed.recv``) or
        ``shape=``/``dtype=`` to have the message checked against what you expect.
        """
        return self.irecv(src, out=out, shape=shape, dtype=dtype, tag=tag).wait()

    def irecv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        """Post a receive; ``request.wait()`` returns the array."""
        return self._world._irecv(self._me, src, out, shape, dtype, tag)

    def sendrecv(self, array, dst, src, *, chunk=None, op=None, tag=0):
        """Send to ``dst`` and receive from ``src`` at once (like ``MPI_Sendrecv``).
        Safe even in rendezvous mode, because the send does not block the receive."""
        req = self.isend(array, dst, chunk=chunk, op=op, tag=tag)
        got = self.recv(src, tag=tag)
        req.wait()
        return got

    @contextmanager
    def span(self, name):
        """Label every message sent inside the block as part of ``name``.
        Spans nest: ``"mlp.forward/ring_allreduce"``."""
        me = self._me
        outer = me.span_path
        me.span_path = f"{outer}/{name}" if outer else name
        start = me.clock
        try:
            yield
        finally:
            me.spans.append(Span(self.rank, me.span_path, start, me.clock))
            me.span_path = outer

    def __repr__(self):
        return f"<Comm rank={self.rank} world_size={self.world_size} step={self.step}>"


def collective(fn):
    """Decorator: run ``fn(comm, ...)`` inside ``comm.span(fn.__name__)`` so the
    trace shows it as one labelled collective call."""
    @functools.wraps(fn)
    def wrapper(comm, *args, **kwargs):
        with comm.span(fn.__name__):
            return fn(comm, *args, **kwargs)
    return wrapper


@dataclass
class RunResult:
    """What ``run`` returns: per-rank ``outputs`` (in rank order) and the ``trace``."""

    outputs: list
    trace: Trace
    payloads: dict | None = None   # (src, dst, tag, seq) -> array, if record_payloads

    def payload(self, event):
        """The array message ``event`` carried (the run must have had ``record_payloads=True``)."""
        return self.payloads[(event.src, event.dst, event.tag, event.seq)]

    @property
    def world_size(self):
        return self.trace.world_size

    @property
    def steps(self):
        return self.trace.steps


class _Channel:
    __slots__ = ("messages", "receives", "sent")

    def __init__(self):
        self.messages = deque()   # sent, not yet matched: (event, payload, send_request)
        self.receives = deque()   # posted receives, not yet matched
        self.sent = 0


class _World:
    def __init__(self, world_size, mode, record_payloads):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.world_size, self.mode = world_size, mode
        self.ranks = [_Rank(r) for r in range(world_size)]
        self.channels = defaultdict(_Channel)   # (src, dst, tag) -> _Channel, made on first use
        self.events = []
        self.payloads = {} if record_payloads else None
        self.ready = deque()
        self.current = None
        self.failure = None
        self.aborting = False

    # -- validation ----------------------------------------------------------
    def _check_peer(self, me, peer, call, what):
        n = self.world_size
        if type(peer) is int and 0 <= peer < n and peer != me.rank:
            return peer          # the common case, checked cheaply
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)):
            raise CommError(f"rank {me.rank}, step {me.clock + 1}: {call}({what}={peer!r}): "
                            f"{what} must be an int rank in 0..{n - 1}")
        if not 0 <= peer < n:
            raise CommError(f"rank {me.rank}, step {me.clock + 1}: {call}({what}={peer}): there is "
                            f"no rank {peer}; ranks are 0..{n - 1} (world_size={n}). "
                            f"Hint: neighbours wrap around, e.g. (rank + 1) % world_size.")
        if peer == me.rank:
            raise CommError(f"rank {me.rank}, step {me.clock + 1}: {call}({what}={peer}): a rank "
                            f"cannot {call} to or from itself; keep your own data locally.")
        return int(peer)

    def _check_send(self, me, array, dst):
        """Check a send's arguments; returns ``dst`` as an int."""
        dst = self._check_peer(me, dst, "send", "dst")
        if not isinstance(array, np.ndarray):
            raise CommError(f"rank {me.rank}, step {me.clock + 1}: send(dst={dst}) needs a numpy "
                            f"array, got {type(array).__name__}. Hint: np.asarray(value).")
        return dst

    # -- point to point ----------------------------------------------------------
    def _isend(self, me, array, dst, chunk, op, tag):
        dst = self._check_send(me, array, dst)
        payload = np.array(array, copy=True)   # buffered: later changes do not travel
        me.clock += 1
        ch = self.channels[(me.rank, dst, tag)]
        ev = Event(me.clock, me.rank, dst, chunk, op, payload.nbytes, me.span_path, tag,
                   payload.shape, _dtype_name(payload.dtype), ch.sent)
        ch.sent += 1
        self.events.append(ev)
        if self.payloads is not None:   # keyed as RunResult.payload looks it up
            self.payloads[(me.rank, dst, tag, ev.seq)] = payload
        req = Request(self, "send", me, dst, tag)
        req.event = ev
        req.done = self.mode == "buffered"
        if ch.receives:
            self._match(ev, payload, req, ch.receives.popleft())
        else:
            ch.messages.append((ev, payload, req))
        return req

    def _expect(self, me, src, out, shape, dtype):
        """Check a receive's arguments: (src, (shape or None, dtype or None)) it expects."""
        src = self._check_peer(me, src, "recv", "src")
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise CommError(f"rank {me.rank}: recv(src={src}, out=...) needs a numpy array to fill")
            shape, dtype = out.shape, out.dtype
        if shape is not None:
            shape = tuple(int(d) for d in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
        return src, (shape, None if dtype is None else np.dtype(dtype))

    def _irecv(self, me, src, out, shape, dtype, tag):
        src, expect = self._expect(me, src, out, shape, dtype)
        req = Request(self, "recv", me, src, tag)
        req.out, req.expect = out, expect
        ch = self.channels[(src, me.rank, tag)]
        if ch.messages:
            self._match(*ch.messages.popleft(), req)
        else:
            ch.receives.append(req)
        return req

    def _match(self, ev, payload, send_req, recv_req):
        error = _mismatch(recv_req.owner.rank, ev.src, ev.step, recv_req.expect,
                          tuple(payload.shape), payload.dtype, ev.chunk)
        if error is not None:
            recv_req.error = error
        elif recv_req.out is not None:
            recv_req.out[...] = payload
            payload = recv_req.out
        recv_req.payload, recv_req.step, recv_req.event = payload, ev.step, ev
        self._complete(recv_req)
        if not send_req.done:
            self._complete(send_req)

    def _complete(self, req):
        req.done = True
        owner = req.owner
        if owner.waiting is req:
            owner.waiting = None
            self.ready.append(owner)

    def _wait(self, req):
        me = req.owner
        if self.current is not me:
            raise CommError(f"rank {self.current.rank if self.current else '?'} waited on a request "
                            f"of rank {me.rank}; each rank may only wait on its own requests")
        while not req.done:
            me.waiting = req
            self._yield()
        if req.kind == "recv":
            me.clock = max(me.clock, req.step)
            if req.error is not None:
                err, req.error = req.error, None
                raise err
            return req.payload
        return None

    def _yield(self):
        # Give control back to the scheduler until someone completes our request.
        self.hub.switch()
        if self.aborting:
            raise greenlet.GreenletExit

    # -- scheduling ------------------------------------------------------------------
    def _rank_main(self, me, program, comm, x, args, kwargs):
        try:
            me.result = program(comm, x, *args, **kwargs)
            me.finished = True
        except greenlet.GreenletExit:
            raise
        except _Interrupt as e:
            self.failure = ("timeout", me, e)
        except BaseException as e:  # noqa: BLE001 - reported with the rank's traceback
            self.failure = ("error", me, e)

    def run(self, program, inputs, args, kwargs):
        self.hub = greenlet.getcurrent()
        for me in self.ranks:
            comm = Comm(self, me.rank)
            me.glet = greenlet.greenlet(
                functools.partial(self._rank_main, me, program, comm, inputs[me.rank], args, kwargs),
                parent=self.hub)
            self.ready.append(me)
        while self.ready and self.failure is None:
            me = self.ready.popleft()
            self.current = me
            me.glet.switch()
            self.current = None

    def kill_unfinished(self):
        self.aborting = True
        for me in self.ranks:
            if me.glet:     # a greenlet is true while started and not yet finished
                try:
                    me.glet.throw(greenlet.GreenletExit)
                except BaseException:  # noqa: BLE001 - a dying rank cannot report anything more
                    pass


def _mismatch(rank, src, step, expect, shape, dtype, chunk):
    """The error for a message (``shape``, ``dtype``, ``chunk`` label, sent at
    ``step`` by ``src``) that is not what ``rank``'s receive ``expect``-ed
    (``(shape or None, dtype or None)``); None if it fits. The simulator and the
    torch backend both use it, so they report a mismatch in the same words."""
    want_shape, want_dtype = expect
    if (want_shape is not None and shape != want_shape) or (want_dtype is not None and dtype != want_dtype):
        want = f"shape {want_shape if want_shape is not None else 'any'} {want_dtype if want_dtype is not None else ''}".strip()
        return CommError(
            f"rank {rank}, step {step}: recv(src={src}) expected {want} but rank {src} sent "
            f"shape {shape} {dtype} (its message of step {step}" + (f", chunk {chunk}" if chunk is not None else "") + ")")
    return None


@functools.cache
def _dtype_name(dtype):
    return dtype.name    # numpy computes this slowly; a run asks hundreds of thousands of times


def _program_traceback(exc):
    """The traceback of ``exc`` without ringlab's scheduler frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    if isinstance(exc, _Interrupt):
        return text + "(stopped here by the time limit)"
    return text + "".join(traceback.format_exception_only(type(exc), exc))


_WAKE = getattr(signal, "SIGUSR2", None)    # None on Windows


def _woken(signum, frame):
    """Does nothing: running it is what lets the pending interrupt be raised."""


class _Watchdog:
    """Interrupts the thread running the world after ``seconds``.

    The interrupt is an asynchronous exception, which Python raises between
    two bytecodes, so a program stuck in one long C call (``time.sleep(60)``,
    waiting on a lock) would only see it when that call returns. On the main
    thread the watchdog also sends a signal: it cuts the call short, Python
    runs the (empty) handler, and the interrupt is raised there. The signal is
    used only if nobody else handles it.
    """

    def __init__(self, seconds):
        self.seconds, self.fired, self.wake = seconds, False, None
        self.thread_id = threading.get_ident()
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        if not self.stop.wait(self.seconds):
            with self.lock:
                if not self.stop.is_set():
                    self.fired = True
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self.thread_id), ctypes.py_object(_Interrupt))
                    if self.wake is not None:
                        signal.pthread_kill(self.thread_id, self.wake)

    def __enter__(self):
        if self.seconds is not None:
            if (_WAKE is not None and threading.current_thread() is threading.main_thread()
                    and signal.getsignal(_WAKE) in (signal.SIG_DFL, _woken)):
                signal.signal(_WAKE, _woken)
                self.wake = _WAKE
            self.thread.start()
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.stop.set()
            if self.fired:   # fired but maybe not yet delivered: withdraw it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)
        if self.wake is not None and not self.fired:
            # Nothing was sent: put the default back. After a wake-up we keep the
            # empty handler, because a signal still on its way would otherwise
            # meet the default action, which ends the process.
            signal.signal(self.wake, signal.SIG_DFL)
        return False


def run(program, inputs, *, args=(), kwargs=None, mode="buffered", timeout=10.0,
        check_unreceived=True, record_payloads=False, backend="sim"):
    """Run ``program(comm, inputs[r], *args, **kwargs)`` on every rank r.

    Returns a ``RunResult`` with ``.outputs`` (rank order) and ``.trace``.

    ``mode="buffered"`` (default): a send completes at once (the payload is
    copied). ``mode="rendezvous"``: a send waits until its receive is posted,
    which shows why "everyone sends, then everyone receives" deadlocks.
    ``timeout`` (seconds, or None) stops a program that never finishes.

    Raises ``RankError``, ``DeadlockError``, ``ProgramTimeout`` or
    ``UnreceivedMessagesError`` with a diagnosis instead of hanging; a
    ``RankError`` or ``DeadlockError`` carries the trace so far as ``.trace``.
    """
    if backend != "sim":
        from . import backends
        return backends.run(backend, program, inputs, args=args, kwargs=kwargs,
                            timeout=timeout, check_unreceived=check_unreceived)
    inputs = list(inputs)
    if not inputs:
        raise ValueError("run() needs one input per rank; got an empty list (world_size 0)")
    world = _World(len(inputs), mode, record_payloads)
    try:
        with _Watchdog(timeout):
            try:
                world.run(program, inputs, args, kwargs or {})
            except _Interrupt as e:      # landed in the scheduler, between ranks
                world.failure = ("timeout", world.current, e)
            finally:
                world.kill_unfinished()
    except _Interrupt as e:              # landed while cleaning up
        world.failure = world.failure or ("timeout", None, e)

    # The trace so far: a failed run's errors carry it too, to explain where it stopped.
    left = [ev for ch in world.channels.values() for ev, _, _ in ch.messages]
    trace = Trace(world.events, world.world_size, [s for me in world.ranks for s in me.spans], left)
    if world.failure is not None:
        kind, me, exc = world.failure
        if kind == "timeout":
            where = _program_traceback(exc) if me is not None else ""
            raise ProgramTimeout(timeout, me.rank if me else None, me.clock if me else None,
                                 where) from None
        raise RankError(me.rank, me.clock, exc, _program_traceback(exc), trace) from exc

    unfinished = [me for me in world.ranks if not me.finished]
    if unfinished:
        raise DeadlockError({me.rank: "waits in " + me.waiting.describe() + f" (its clock: step {me.clock})"
                             for me in unfinished},
                            [me.rank for me in world.ranks if me.finished], trace)

    if left and check_unreceived:
        raise UnreceivedMessagesError(trace.unreceived)
    return RunResult([me.result for me in world.ranks], trace, world.payloads)
