"""Causality: a message carries only what its sender could know.

A rank knows its own input and what it has received. So the content of a
message rank r sends at step s may depend on rank j's input only if j is in
r's *causal past* at s: j = r, or r received, before s, a message whose
sender had j in its causal past when it sent it (Lamport's happens-before).
A program that shares data outside the messages (module-level state, a file,
the other ranks' frames) breaks this, even when every message has the right
shape: "totals in every message", sent before the ranks they sum were heard from.

The check needs no rule per exercise. It runs the program once more for each
rank j with rank j's input nudged (every float multiplied by 1 + 2^-20, then
2^-20 added, so zeros move too) and compares every message with the same
message of the plain run: the messages that changed depend on j's input.

    >>> import numpy as np
    >>> def honest(comm, x):                  # a ring sum: 3 hops, each one partial sum more
    ...     n, r = comm.world_size, comm.rank
    ...     piece = x.copy()
    ...     for _ in range(n - 1):
    ...         piece = x + comm.sendrecv(piece, (r + 1) % n, (r - 1) % n)
    ...     return piece
    >>> inputs = [np.full(2, float(r)) for r in range(4)]
    >>> print(violation(honest, inputs, (), 10.0))
    None
    >>> shared = {}
    >>> def cheat(comm, x):                   # every rank posts its input where all can read it
    ...     shared[comm.rank] = x
    ...     comm.barrier()
    ...     total = sum(shared.values())
    ...     n, r = comm.world_size, comm.rank
    ...     for _ in range(n - 1):            # and sends the finished total from the start
    ...         comm.sendrecv(total, (r + 1) % n, (r - 1) % n)
    ...     return total
    >>> print(violation(cheat, inputs, (), 10.0)[1].split(":")[0])
    at step 1 rank 0 sent rank 1 a message that depends on rank 1's input
"""

from __future__ import annotations

import copy

import numpy as np

from ...trace import payload_key
from .running import active_runner

NUDGE = 2.0 ** -20


def nudged(value):
    """A copy of ``value`` (arrays, lists, tuples, dicts of them) with every
    float array changed a little, or None if nothing in it is a float array."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "fc" and value.size:
        return value * (1 + NUDGE) + NUDGE
    if isinstance(value, (list, tuple)):
        parts = [nudged(v) for v in value]
        if all(p is None for p in parts):
            return None
        out = [copy.deepcopy(v) if p is None else p for v, p in zip(value, parts)]
        if isinstance(value, list):
            return out
        return tuple(out) if type(value) is tuple else type(value)(*out)     # a namedtuple
    if isinstance(value, dict):
        parts = {k: nudged(v) for k, v in value.items()}
        if all(p is None for p in parts.values()):
            return None
        return {k: copy.deepcopy(value[k]) if p is None else p for k, p in parts.items()}
    return None


def causal_past(trace):
    """``{payload_key(e): set of ranks}``: the ranks whose inputs the sender of
    e could know when it sent it. A receive completes before a send of the same
    rank only if its message's step is smaller (a rank's clock moves to a
    received message's step, and a send takes a later step), so counting every
    received message of a smaller step can only make a past larger: no honest
    program is blamed."""
    past, received = {}, {}
    for e in sorted(trace, key=lambda e: (e.step, e.src, e.dst, e.seq)):
        known = {e.src}
        for m in received.get(e.src, ()):
            if m.step < e.step:
                known |= past[payload_key(m)]
        past[payload_key(e)] = known
        received.setdefault(e.dst, []).append(e)
    return past


def violation(program, inputs, args, timeout, runner=None, depends_on_all=False):
    """``(check, words)`` for what breaks causality, or None: the first message
    (in step order) that depends on the input of a rank outside its sender's
    causal past; with ``depends_on_all`` (an exercise whose every result needs
    every rank's data: a reduction, a layer split over the ranks), a rank whose
    result does not change with another rank's input: it was worked out from
    its own copy of everything, and the messages were for show. Runs
    ``program`` 1 + N times; a run that fails or changes shape is left out (the
    other checks report failures)."""
    run = runner or active_runner()
    base = run(program, copy.deepcopy(inputs), args=args, timeout=timeout, record_payloads=True)
    past = causal_past(base.trace)
    depends = {k: set() for k in past}
    unmoved = {}                        # rank -> the ranks whose input its result ignored
    for j in range(len(inputs)):
        changed = nudged(inputs[j])
        if changed is None:
            continue
        trial = [copy.deepcopy(x) if r != j else changed for r, x in enumerate(inputs)]
        try:
            other = run(program, trial, args=args, timeout=timeout, record_payloads=True)
        except Exception:  # noqa: BLE001 - a run that fails here says nothing about causality
            continue
        for key, payload in base.payloads.items():
            got = other.payloads.get(key)
            if got is not None and not _same(got, payload):
                depends[key].add(j)
        for r, (a, b) in enumerate(zip(base.outputs, other.outputs)):
            if r != j and _same(a, b):
                unmoved.setdefault(r, []).append(j)
    for e in sorted(base.trace, key=lambda e: (e.step, e.src, e.dst, e.seq)):
        outside = sorted(depends[payload_key(e)] - past[payload_key(e)])
        if outside:
            j = outside[0]
            return ("every message carries only what its sender knew",
                    f"at step {e.step} rank {e.src} sent rank {e.dst} a message that depends "
                    f"on rank {j}'s input: rank {e.src} had not received rank {j}'s data by "
                    f"then, directly or through another rank, so it cannot have come through "
                    f"the messages")
    if depends_on_all and unmoved:
        r = min(unmoved)
        j = unmoved[r][0]
        return ("every rank's result needs every rank's data",
                f"rank {r}'s result stayed the same when rank {j}'s input changed: rank {r} "
                f"worked it out without rank {j}'s data (from its own copy of everything?), "
                f"and the messages did not carry what the result needs")
    return None


def _same(a, b):
    """Whether two results (arrays, or lists, tuples and dicts of them) are equal."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object that cannot say: call them different
        return False
