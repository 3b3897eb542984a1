"""What a rank sees: ``Comm``, the object every ringlab program talks through.

A program is written once and runs on every rank (SPMD), like under
``torchrun``. ``comm.rank`` and ``comm.world_size`` say who this is; ``send``,
``recv`` and friends mirror ``torch.distributed``'s point-to-point calls::

    >>> import numpy as np, ringlab
    >>> def pass_right(comm, x):
    ...     comm.send(x, (comm.rank + 1) % comm.world_size)
    ...     return comm.recv((comm.rank - 1) % comm.world_size)
    >>> res = ringlab.run(pass_right, [np.array([0.]), np.array([1.]), np.array([2.])])
    >>> [float(y[0]) for y in res.outputs]
    [2.0, 0.0, 1.0]

A ``Comm`` belongs to a *group* of ranks. The one ``run`` hands out is the
whole world; ``comm.new_group(ranks)`` and ``comm.split(color)`` make smaller
ones (``ringlab.DeviceMesh`` makes a grid of them). In a group, ``rank``,
``world_size`` and the peers you name are the group's own numbers (0 .. size-1);
the trace records global rank numbers and the group's name.

The same class serves every way a program runs: the simulator
(``ringlab.sim``), real processes (``ringlab.backends.torch``) and the
isolated rank processes of trusted grading (``ringlab.backends.isolated``).
Each supplies a *world* (the ``World`` protocol below) that the methods call
into. The checks of a call's arguments live here, so that every backend
reports a mistake in the same words.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import CommError
from .trace import Span


@dataclass(frozen=True)
class Group:
    """A set of global ranks that talk among themselves.

    ``ranks``: global rank numbers, in group-rank order. ``label``: what the
    trace records (the name, or the tuple of ranks; None for the whole world).
    ``gid``: the message space's number; messages never cross spaces.
    """

    ranks: tuple
    label: object
    gid: int

    @property
    def size(self):
        return len(self.ranks)


def group_label(name, ranks, groups):
    """The trace's label for a new group: its name, else its ranks. A label
    already taken gets "#k", k one more than the groups of the same ranks so
    far, and higher until it is free: labels must be unique, since recorded
    payloads and per-group checks are keyed by them (a program that named a
    group "x#2" must not make two groups share a label).

    ``groups``: the groups made so far (``Group`` objects).

    >>> g = [Group((0, 1), (0, 1), 1), Group((2, 3), "(0, 1)#2", 2)]
    >>> group_label(None, (0, 1), g)
    '(0, 1)#3'
    """
    label = name if name is not None else ranks
    taken = {str(g.label) for g in groups if g.label is not None}
    k = sum(1 for g in groups if g.ranks == ranks)
    while str(label) in taken:
        k += 1
        label = f"{name if name is not None else ranks}#{k}"
    return label


class World(Protocol):
    """What a world offers the ``Comm`` objects of its ranks: the one interface
    between a rank's program and whatever runs it.

    Three worlds implement it: the simulator (``ringlab.sim.world.World``),
    real processes (``ringlab.backends.torch``'s ``ProcessWorld``) and a rank
    in a process of its own, whose every call goes to a simulator in the
    grader (``ringlab.backends.isolated``). ``Comm`` checks a call's arguments
    and turns group ranks into global ranks; the world does the rest. Each
    method gets the calling ``Comm`` first: its ``_me`` is the calling actor
    (``.rank``, ``.stream``, ``.clock``, ``.time``; the program is stream 0, a
    ``comm.start`` work stream 1), its ``group`` the group called on.

    ``send``, ``recv``, ``sendrecv`` and the spans have defaults here, built
    from the others; a world overrides them where it can do better (one round
    trip instead of two, a send without a copy).
    """

    def isend(self, comm, array, dst, chunk, op, tag):
        """Start sending ``array`` to global rank ``dst``; returns a request
        (``wait()``, ``is_completed()``)."""

    def irecv(self, comm, src, expect, out, tag):
        """Post a receive from global rank ``src``; ``expect``: ``(shape, dtype)``
        or ``ANY``; ``out``: the array to fill, or None. Returns a request whose
        ``wait()`` gives the array."""

    def recv_any(self, comm, tag):
        """The first message from any rank of the group: ``(global src, array)``."""

    def compute(self, comm, seconds, label, meta):
        """Spend ``seconds`` of simulated time (``meta``: a dict for the trace)."""

    def memory(self, comm, label, nbytes):
        """``comm.alloc`` (``nbytes > 0``) or ``comm.free`` (``nbytes < 0``;
        None: all of ``label``). The world keeps the book (see ``Ledger``)."""

    def start(self, comm, fn, args, kwargs):
        """Run ``fn(stream_comm, *args, **kwargs)`` on the communication stream;
        returns a work (``wait()``, ``is_completed()``)."""

    def new_group(self, comm, ranks, name):
        """The ``Group`` of global ``ranks`` (every rank of ``comm`` calls it alike)."""

    def agree(self, comm, value, what):
        """A barrier (``what="barrier"``) or split: every rank of the group's ``value``."""

    def split(self, comm, color, key, name):
        """``comm.split``: this rank's new ``Group``, or None. Every rank learns
        every rank's color and key (an agreement), then creates every group, in
        the same order, as ``new_group`` requires."""
        told = self.agree(comm, ("split", color, key), "split")
        colors = sorted({c for _, c, _ in told if c is not None}, key=repr)
        mine = None
        for c in colors:
            members = sorted((k, r) for r, (_, cc, k) in enumerate(told) if cc == c)
            label = None if name is None else (name if len(colors) == 1 else f"{name}[{c}]")
            group = self.new_group(comm, comm._group_ranks([r for _, r in members]), label)
            if c == color:
                mine = group
        return mine

    def send(self, comm, array, dst, chunk, op, tag):
        self.isend(comm, array, dst, chunk, op, tag).wait()

    def recv(self, comm, src, expect, out, tag):
        return self.irecv(comm, src, expect, out, tag).wait()

    def sendrecv(self, comm, array, dst, src, chunk, op, tag):
        req = self.isend(comm, array, dst, chunk, op, tag)
        got = self.recv(comm, src, ANY, None, tag)
        req.wait()
        return got

    def span_enter(self, comm, name):
        """Messages sent from now on are part of ``name`` (nested in the current span)."""
        me = comm._me
        outer = me.span_path
        me.span_path = f"{outer}/{name}" if outer else name
        return outer, me.clock, me.time

    def span_exit(self, comm, token):
        me = comm._me
        outer, start, t0 = token
        me.spans.append(Span(me.rank, me.span_path, start, me.clock, comm.group.label, me.stream,
                             t0, me.time))
        me.span_path = outer


class Ledger:
    """``comm.alloc``/``comm.free``'s book: what each rank holds, by label, one
    book per rank for all its streams. A world keeps one and asks it first."""

    def __init__(self):
        self.held = {}          # rank -> {label: bytes}

    def change(self, comm, label, nbytes):
        """The signed bytes that ``alloc`` (``nbytes >= 0``) or ``free``
        (``nbytes < 0``, or None: all of ``label``) changes, after checking the
        book. A 0-byte alloc holds its label (with nothing in it) until freed."""
        me = comm._me
        held = self.held.setdefault(me.rank, {})
        if nbytes is not None and nbytes >= 0:
            held[label] = held.get(label, 0) + nbytes
            return nbytes
        have = held.get(label)
        n = have if nbytes is None else -nbytes
        if have is None or n > have:
            call = f"free({label!r})" if nbytes is None else f"free({label!r}, {n})"
            why = (f"holds only {have} bytes under {label!r}" if have is not None
                   else f"holds nothing under {label!r}")
            raise CommError(f"rank {me.rank}, step {me.clock}: {call}: this rank {why} "
                            f"(all it holds: {held}). Hint: free what you alloc, "
                            f"under the same label")
        if n == have:
            del held[label]         # so an error lists only what is really held
        else:
            held[label] = have - n
        return -n


class Comm:
    """One rank's handle on one group (the whole world by default)."""

    def __init__(self, world, actor, group, stream=0):
        self._world, self._me, self.group, self._stream = world, actor, group, stream
        self.rank = group.ranks.index(actor.rank)
        self.world_size = group.size
        self._to_global = group.ranks
        self._index = {g: i for i, g in enumerate(group.ranks)}

    # -- where we are -----------------------------------------------------------
    @property
    def global_rank(self):
        """This rank's number in the whole world."""
        return self._me.rank

    @property
    def step(self):
        """This rank's step clock: the step of the last message it sent or received."""
        return self._me.clock

    @property
    def time(self):
        """This rank's simulated time in seconds (0 unless compute or a network model)."""
        return self._me.time

    def _peer(self, peer, call, what):
        """A group rank -> the global rank, with the checks and their wording."""
        n = self.world_size
        if type(peer) is int and 0 <= peer < n and peer != self.rank:
            return self._to_global[peer]          # the common case, checked cheaply
        me, where = self._me, f"rank {self.rank}, step {self._me.clock + 1}"
        if self.group.label is not None:
            where = f"rank {self.rank} of group {self.group.label!r} (global rank {me.rank}), step {me.clock + 1}"
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)):
            raise CommError(f"{where}: {call}({what}={peer!r}): {what} must be an int rank in 0..{n - 1}")
        if not 0 <= peer < n:
            raise CommError(f"{where}: {call}({what}={peer}): there is no rank {peer}; ranks are "
                            f"0..{n - 1} (world_size={n}). Hint: neighbours wrap around, e.g. "
                            f"(rank + 1) % world_size.")
        raise CommError(f"{where}: {call}({what}={peer}): a rank cannot {call} to or from itself; "
                        f"keep your own data locally.")

    def _array(self, array, dst):
        if not isinstance(array, np.ndarray):
            raise CommError(f"rank {self.rank}, step {self._me.clock + 1}: send(dst={self._index[dst]}) "
                            f"needs a numpy array, got {type(array).__name__}. Hint: np.asarray(value).")
        return array

    # -- point to point ----------------------------------------------------------
    def send(self, array, dst, *, chunk=None, op=None, tag=0):
        """Send ``array`` to rank ``dst``. ``chunk`` and ``op`` label the message
        in the trace (which piece moves, and what the receiver does with it)."""
        dst = self._peer(dst, "send", "dst")
        self._world.send(self, self._array(array, dst), dst, chunk, op, tag)

    def isend(self, array, dst, *, chunk=None, op=None, tag=0):
        """Start a send; returns a request. The payload is copied now, so you may
        change ``array`` afterwards without changing what arrives."""
        dst = self._peer(dst, "send", "dst")
        return self._world.isend(self, self._array(array, dst), dst, chunk, op, tag)

    def recv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        """Receive the next message from rank ``src`` and return it.

        Pass ``out=`` (an array to fill, as in ``torch.distributed.recv``) or
        ``shape=``/``dtype=`` to have the message checked against what you expect.
        """
        gsrc, expected = self._receive(src, out, shape, dtype)
        return self._world.recv(self, gsrc, expected, out, tag)

    def irecv(self, src, *, out=None, shape=None, dtype=None, tag=0):
        """Post a receive; ``request.wait()`` returns the array."""
        gsrc, expected = self._receive(src, out, shape, dtype)
        return self._world.irecv(self, gsrc, expected, out, tag)

    def _receive(self, src, out, shape, dtype):
        gsrc = self._peer(src, "recv", "src")
        expected = ANY if out is None and shape is None and dtype is None else expect(
            self.rank, src, out, shape, dtype)
        return gsrc, expected

    def recv_any(self, *, tag=0):
        """Receive the first message to arrive from any rank of the group:
        returns ``(src, array)`` (``MPI_ANY_SOURCE``, ``dist.recv(src=None)``).

        "First" is the earliest simulated arrival; ties, and runs without a
        network model, go to the earliest step, then the lowest sending rank.
        """
        src, array = self._world.recv_any(self, tag)
        return self._index[src], array

    def sendrecv(self, array, dst, src, *, chunk=None, op=None, tag=0):
        """Send to ``dst`` and receive from ``src`` at once (like ``MPI_Sendrecv``).
        Safe even in rendezvous mode, because the send does not block the receive."""
        gdst, gsrc = self._peer(dst, "send", "dst"), self._peer(src, "recv", "src")
        return self._world.sendrecv(self, self._array(array, gdst), gdst, gsrc, chunk, op, tag)

    # -- time ----------------------------------------------------------------------
    def compute(self, seconds, label="compute", **meta):
        """Spend ``seconds`` of simulated time computing; the trace records it
        with ``label`` and ``meta`` (``layer=3``, ``microbatch=0``, ...)."""
        if not (isinstance(seconds, (int, float, np.floating, np.integer)) and seconds >= 0):
            raise CommError(f"rank {self.rank}, step {self._me.clock}: compute(seconds={seconds!r}) "
                            f"needs a number of seconds >= 0")
        self._world.compute(self, float(seconds), label, meta)

    # -- memory ----------------------------------------------------------------------
    def alloc(self, label, nbytes):
        """Say that this rank now holds ``nbytes`` more bytes under ``label``
        ("params", "grads", "adam.m", "params.layer3", ...); an array counts its
        ``nbytes``. Nothing is allocated: the trace records a ``MemoryEvent`` at
        this rank's simulated time, and ``trace.peak_memory()`` adds them up.

            >>> import numpy as np, ringlab
            >>> def step(comm, w):
            ...     comm.alloc("params", w)             # 8 float64: 64 bytes
            ...     comm.compute(1.0, "backward")
            ...     comm.alloc("grads", w)
            ...     comm.compute(0.5, "update")
            ...     comm.free("grads")
            >>> trace = ringlab.run(step, [np.ones(8)] * 2).trace
            >>> trace.memory_timeline(0)
            [(0.0, 64), (1.0, 128), (1.5, 64)]
        """
        self._world.memory(self, self._label(label, "alloc"), self._nbytes("alloc", label, nbytes))

    def free(self, label, nbytes=None):
        """Give back ``nbytes`` (an int or an array) of what this rank holds under
        ``label``; ``None``: all of it."""
        n = None if nbytes is None else -self._nbytes("free", label, nbytes)
        self._world.memory(self, self._label(label, "free"), n)

    def _label(self, label, call):
        if not isinstance(label, str):
            raise CommError(f"rank {self._me.rank}, step {self._me.clock}: {call}(label={label!r}) "
                            f"needs a str label, such as 'params' or 'adam.m'")
        return label

    def _nbytes(self, call, label, nbytes):
        self._label(label, call)
        n = getattr(nbytes, "nbytes", nbytes)       # an array counts its bytes
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
            raise CommError(f"rank {self._me.rank}, step {self._me.clock}: {call}({label!r}, "
                            f"{nbytes!r}) needs a number of bytes (an int >= 0) or an array")
        return int(n)

    def start(self, fn, *args, **kwargs):
        """Run ``fn(comm, *args, **kwargs)`` on this rank's communication stream,
        concurrently with the program (like ``dist.all_reduce(..., async_op=True)``).

        Returns a ``Work``: ``work.wait()`` gives ``fn``'s result. Works started
        on one group run one after another, in order; their messages have a
        message space of their own, so they never mix with the program's.
        """
        if not callable(fn):
            raise CommError(f"rank {self.rank}, step {self._me.clock}: start(fn={fn!r}) needs a "
                            f"function to run on the communication stream")
        return self._world.start(self, fn, args, kwargs)

    # -- groups ----------------------------------------------------------------------
    def new_group(self, ranks, name=None):
        """A sub-communicator over ``ranks`` (this group's rank numbers).

        Every rank of this group calls it, with the same arguments, like
        ``torch.distributed.new_group``; members get a ``Comm`` whose ``rank``
        and ``world_size`` are the new group's, the others get ``None``.
        """
        group = self._world.new_group(self, self._group_ranks(ranks), name)
        return self._sub(group) if self._me.rank in group.ranks else None

    def _group_ranks(self, ranks):
        """``ranks`` (this group's numbers), checked, as global ranks."""
        try:
            members = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise CommError(f"rank {self.rank}: new_group(ranks={ranks!r}) needs a list of ints") from None
        bad = [r for r in members if not 0 <= r < self.world_size]
        if bad or len(set(members)) != len(members) or not members:
            raise CommError(f"rank {self.rank}: new_group(ranks={members}) needs distinct ranks in "
                            f"0..{self.world_size - 1}, at least one")
        return tuple(self._to_global[r] for r in members)

    def split(self, color, key=0, name=None):
        """MPI's ``Comm.Split``: ranks that pass the same ``color`` form a group,
        ordered by ``key`` and then by their rank here. A rank passing
        ``color=None`` joins none and gets ``None``. Every rank of this group calls it."""
        group = self._world.split(self, color, key, name)
        return None if group is None else self._sub(group)

    def barrier(self):
        """Wait until every rank of the group has called ``barrier``."""
        self._world.agree(self, None, "barrier")

    def _sub(self, group):
        return Comm(self._world, self._me, group, self._stream)

    # -- labels ------------------------------------------------------------------------
    @contextmanager
    def span(self, name):
        """Label every message sent inside the block as part of ``name``.
        Spans nest: ``"mlp.forward/ring_allreduce"``."""
        token = self._world.span_enter(self, str(name))
        try:
            yield
        finally:
            self._world.span_exit(self, token)

    def __repr__(self):
        g = "" if self.group.label is None else f" group={self.group.label!r}"
        return f"<Comm rank={self.rank} world_size={self.world_size}{g} step={self.step}>"


def collective(fn):
    """Decorator: run ``fn(comm, ...)`` inside ``comm.span(fn.__name__)`` so the
    trace shows it as one labelled collective call."""
    @functools.wraps(fn)
    def wrapper(comm, *args, **kwargs):
        with comm.span(fn.__name__):
            return fn(comm, *args, **kwargs)
    return wrapper


# -- checks shared by every backend -------------------------------------------------------

ANY = (None, None)      # a receive that expects any shape and dtype

def expect(rank, src, out, shape, dtype):
    """A receive's expectation ``(shape or None, dtype or None)``, checked."""
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise CommError(f"rank {rank}: recv(src={src}, out=...) needs a numpy array to fill")
        shape, dtype = out.shape, out.dtype
    if shape is not None:
        shape = tuple(int(d) for d in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    return shape, None if dtype is None else np.dtype(dtype)


def mismatch(rank, src, step, expected, shape, dtype, chunk):
    """The error for a message (``shape``, ``dtype``, ``chunk`` label, sent at
    ``step`` by ``src``) that is not what ``rank``'s receive ``expected``;
    None if it fits."""
    want_shape, want_dtype = expected
    if expected is ANY:
        return None
    if (want_shape is not None and shape != want_shape) or (want_dtype is not None and dtype != want_dtype):
        want = f"shape {want_shape if want_shape is not None else 'any'} {want_dtype if want_dtype is not None else ''}".strip()
        return CommError(
            f"rank {rank}, step {step}: recv(src={src}) expected {want} but rank {src} sent "
            f"shape {shape} {dtype} (its message of step {step}" + (f", chunk {chunk}" if chunk is not None else "") + ")")
    return None


@functools.cache
def dtype_name(dtype):
    return dtype.name    # numpy computes this slowly; a run asks hundreds of thousands of times
