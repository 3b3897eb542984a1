"""Asynchronous SGD with a parameter server, and bounded staleness (SSP).

Rank 0 is the **parameter server**: it holds the parameters and applies every
gradient the moment it arrives (``comm.recv_any``). Ranks 1..P are
**workers**: each pulls the parameters, computes a gradient on its own
mini-batch, pushes it, and goes on without waiting for the others.

Bounded staleness (the Stale Synchronous Parallel model, Ho et al. 2013): a
worker's *clock* counts its gradients the server has applied. A worker may
start clock n only while n - s <= the slowest worker's clock; otherwise the
server holds its parameters back until the slowest catches up. ``s = 0`` is
synchronous SGD (every gradient of round k is computed from the same
parameters); ``s = math.inf`` is fully asynchronous.

The protocol, which the ``async_ps`` exercise grades:

* the server sends every worker the parameters (a float64 vector), and after
  each gradient it applies, sends that worker the current parameters again,
  at once or, under SSP, as soon as the worker may go on;
* the server hands out exactly ``task.updates`` parameter messages in all (one
  gradient comes back for each); a worker asking for more gets ``STOP``, an
  empty array, and returns;
* every rank gets the task as plain data, ``spec`` (see ``ps_task``), and
  rebuilds it with ``PSTask.from_spec(spec)``;
* a worker computes its k-th gradient with ``task.work(comm, params, k)``,
  which spends the gradient's simulated compute time, and sends it to rank 0;
* the server applies ``params -= task.lr * grad`` and logs ``(worker,
  version_read)``; the version is the number of gradients applied so far. It
  returns ``(params, log)``, the log as an int array of shape (updates, 2);
  a worker returns nothing. (Results are arrays: trusted grading passes
  nothing else between processes.)

    >>> import math
    >>> task = PSTask.make(workers=3, updates=12, seed=0)
    >>> res = run_async_ps(task, s=math.inf)
    >>> len(res.log), res.pushes
    (12, [5, 4, 3])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..answers import answer
from ..cost.alpha_beta import AlphaBeta
from ..runner import run
from .ps_task import STOP, PSTask

__all__ = ["async_ps", "ps_server", "ps_worker", "run_async_ps", "PSRun", "staleness",
           "replay", "sync_sgd", "clocks", "max_clock_gap", "NETWORK", "PSTask", "STOP"]


# -- the program ------------------------------------------------------------------------------

@answer('async_ps')
def async_ps(comm, spec, s=math.inf):
    """Asynchronous SGD, SSP bound ``s`` (0: synchronous, ``math.inf``: fully async).

    ``spec``: the task as plain data (``PSTask.spec``). Rank 0 returns
    ``(params, log)``: the final parameters and, per applied gradient in
    order, a row ``(worker, version_read)`` of an int array. A worker returns
    nothing.
    """
    task = PSTask.from_spec(spec)
    if comm.rank == 0:
        return ps_server(comm, task, s)
    return ps_worker(comm, task)


@answer('async_ps')
def ps_worker(comm, task):
    pushed = 0
    while True:
        params = comm.recv(0)            # pull: blocks while the server holds us back
        if params.size == 0:             # STOP: the server has handed out all the work
            return None
        grad = task.work(comm, params, pushed)
        comm.send(grad, 0, op="apply")   # push, and go on at once: no barrier
        pushed += 1


@answer('async_ps')
def ps_server(comm, task, s):
    params = task.init.copy()
    workers = range(1, comm.world_size)
    clock = {w: 0 for w in workers}     # gradients of w applied: w's SSP clock
    read = {}                           # the version each worker last read
    log, held, issued = [], [], 0       # held: workers SSP keeps waiting

    def reply(w):
        # One parameter message = one gradient to come. Hand out exactly
        # task.updates of them; later askers get STOP, so none is wasted.
        nonlocal issued
        if issued < task.updates:
            read[w], issued = len(log), issued + 1
            comm.send(params, w, op="copy")
        else:
            comm.send(STOP, w)

    for w in workers:
        reply(w)
    while len(log) < issued:                 # gradients still out there
        w, grad = comm.recv_any()            # whoever's arrives first
        log.append((w, read[w]))
        params -= task.lr * grad             # applied as it arrives, exactly once
        clock[w] += 1
        held.append(w)
        slowest = min(clock.values())
        # Release, in arrival order, every worker within s clocks of the
        # slowest (s = inf: at once). Nobody waits longer than SSP needs.
        for v in list(held):
            if clock[v] - slowest <= s or issued >= task.updates:
                held.remove(v)
                reply(v)
    return params, np.array(log, dtype=np.int64).reshape(-1, 2)


# -- running it, and what to read off the run ------------------------------------------------

NETWORK = AlphaBeta(alpha=1e-3, beta=1e-9)   # 1 ms per message: small next to a gradient


@dataclass
class PSRun:
    """One run: final ``params``, the server's ``log``, the ``trace``, ``time``
    (simulated seconds) and per-worker ``pushes``."""

    task: PSTask
    s: float
    params: np.ndarray
    log: list
    trace: object
    time: float
    pushes: list
    grads: list = field(repr=False, default_factory=list)   # applied, in arrival order

    @property
    def staleness(self):
        """Per applied gradient: the server's version then minus the version read."""
        return staleness(self.log)

    @property
    def apply_times(self):
        """Per applied gradient, the simulated second it reached the server."""
        return sorted(e.end for e in self.trace if e.dst == 0)

    @property
    def throughput(self):
        """Gradients applied per simulated second."""
        return len(self.log) / self.time

    def losses(self, every=1):
        """``(versions, losses)``: the full-data loss after every ``every`` updates."""
        versions, states = replay(self.task, self.grads, every)
        return versions, [self.task.loss(p) for p in states]


def staleness(log):
    """``i - version_read`` for the i-th applied gradient (versions count from 0)."""
    return [i - int(v) for i, (_, v) in enumerate(log)]


def run_async_ps(task, s=math.inf, program=async_ps, network=NETWORK):
    """Run ``program`` on 1 server + ``task.workers`` workers; returns a ``PSRun``."""
    n = task.workers + 1
    res = run(program, [task.spec] * n, args=(s,), network=network, record_payloads=True)
    params, log = res.outputs[0]
    log = [(int(w), int(v)) for w, v in log]
    pushes = [sum(e.src == w for e in res.trace) for w in range(1, n)]
    # The server's receive port carries one message per step: step order is arrival order.
    arrivals = sorted((e for e in res.trace if e.dst == 0), key=lambda e: e.step)
    return PSRun(task, s, params, log, res.trace, res.time, pushes,
                 [res.payload(e) for e in arrivals])


def replay(task, grads, every=1):
    """Apply ``grads`` (in order) to ``task.init`` as the server does; returns
    ``(versions, states)`` for versions 0, every, 2 * every, ... and the last."""
    p = task.init.copy()
    versions, states = [0], [p.copy()]
    for i, g in enumerate(grads, 1):
        p -= task.lr * g
        if i % every == 0 or i == len(grads):
            versions.append(i)
            states.append(p.copy())
    return versions, states


def sync_sgd(task, rounds, orders=None):
    """Synchronous SGD without a server: in round k every worker computes its
    k-th gradient at the same parameters, then all are applied. ``orders[k]``:
    the order the round's gradients are added in (default: rank order).
    Floating-point addition is not associative, so the order shows in the last bits."""
    p = task.init.copy()
    for k in range(rounds):
        grads = {w: task.gradient(p, w, k) for w in range(1, task.workers + 1)}
        for w in (orders[k] if orders else sorted(grads)):
            p -= task.lr * grads[w]
    return p


def clocks(workers, order):
    """Every worker's SSP clock at each version: entry v is ``{worker: how many of
    the first v applied gradients are its}``; ``order``: the worker of each
    applied gradient, in arrival order (the log's first column).

    >>> clocks([1, 2], [2, 2, 1])
    [{1: 0, 2: 0}, {1: 0, 2: 1}, {1: 0, 2: 2}, {1: 1, 2: 2}]
    """
    out = [dict.fromkeys(workers, 0)]
    for w in order:
        out.append({**out[-1], w: out[-1][w] + 1})
    return out


def max_clock_gap(task, log):
    """The largest SSP gap seen: for each parameter read, the reader's clock
    minus the slowest worker's clock in the version it read."""
    mine = {w: 0 for w in range(1, task.workers + 1)}
    log = [(int(w), int(v)) for w, v in log]
    at = clocks(mine, [w for w, _ in log])
    gaps = []
    for w, v in log:            # the read that produced this gradient
        gaps.append(mine[w] - min(at[v].values()))
        mine[w] += 1
    return max(gaps, default=0)
