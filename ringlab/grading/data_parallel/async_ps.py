"""Grader for exercise ``async_ps``: asynchronous SGD with a parameter server, SSP bound s.

Signature: ``async_ps(comm, spec, s) -> (params, log)`` on rank 0 (the
server), with ``log`` an int array of shape (updates, 2), row i =
``(worker, version_read)`` of the i-th gradient applied; the workers (ranks
1..P) return nothing. The protocol is the one ``ringlab.data_parallel.async_ps``
documents (parameters or ``STOP`` down, one gradient of ``task.work`` up per
parameter message, ``params -= task.lr * grad`` in ``recv_any``'s order).

The learner's log and result are never trusted: every check is derived from
the trace and its payloads (the run records them), on hidden worker speeds
(a random straggler, 2-3x slower) and s in {0, 1, 2, inf}:

1. it runs: no exception, deadlock or unreceived message;
2. the server returns ``(params, log)``;
3. messages go only between the server and a worker, as float64; the server
   sends parameters or STOP, a worker sends gradients;
4. each worker pulls, computes, pushes, pulls ... and ends on one STOP;
5. each gradient is the one ``task.work`` computes from the parameters the
   worker was sent (one ``"gradient"`` compute per push, of exactly the hidden time);
6. exactly ``task.updates`` gradients are pushed in all;
7. the log lists the gradients in the order they arrived, each once;
8. every parameter message is the initial parameters with the first v
   arrived gradients applied, v including the worker's own last gradient;
9. the log's versions are those the workers were sent;
10. the final parameters are the replay of all arrived gradients, in order;
11. staleness never above s: a worker starts clock n only with parameters
    holding at least n - s gradients of every worker;
12. no worker waits when it need not: the reply to a gradient carries the
    first version at which the SSP bound lets the worker go on;
13. no idling, in simulated time: a worker computes only its gradients, each
    starting when its parameters arrive; the server sends each parameter
    message as soon as it may (when the gradient that allows it has arrived,
    or when its send port is free);
14. throughput, a backstop: the run's simulated time is at most 1.5x the
    reference's on the same hidden speeds. (Not tighter: which worker gets
    the last updates decides the makespan, and a correct server that releases
    held workers in another order takes another, equally valid path; 10-20%
    apart was seen.)

Gradients are compared bit for bit: apply exactly ``params -= task.lr * grad``.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..kit import checks
from ..kit.report import Case, Failure, numbers
from ..kit.running import plain_array, run_case
from ...data_parallel.async_ps import NETWORK, replay, run_async_ps
from ...data_parallel.async_ps import clocks as ssp_clocks
from ...data_parallel.ps_task import PSTask

NAME = "async_ps"
SLACK = 1.5           # the stated throughput factor: at most 1.5x the reference's time
EPS = 1e-9            # simulated seconds: float noise in times
RECV_ANY = ("Receive with `w, grad = comm.recv_any()` and apply each gradient at once, "
            "in the order recv_any returns them.")


def cases(rng):
    """Small worlds first; hidden speeds: means in [50, 150] ms, one straggler 2-3x."""
    for workers, s, updates in ((3, math.inf, 18), (4, 0, 24), (4, 1, 30), (3, 2, 25),
                                (5, math.inf, 30), (2, 0, 10), (6, 1, 33)):
        means = rng.uniform(0.05, 0.15, workers)
        straggler = int(rng.integers(workers))
        means[straggler] *= rng.uniform(2.0, 3.0)
        seed = int(rng.integers(10**6))
        task = PSTask(PSTask.make(sizes=(4, 8, 3), seed=seed).init, updates, 0.1,
                      tuple(float(m) for m in means), 0.25, seed, sizes=(4, 8, 3))
        label = f"{workers} workers, s={s}, updates={updates}, straggler rank {straggler + 1}"
        # Every rank gets plain data (isolated rank processes take nothing else).
        yield Case(workers + 1, [task.spec] * (workers + 1), label, args=(s,),
                   info={"task": task, "s": s})


class _Run:
    """One case's run and what the checks have read from it so far."""

    def __init__(self, case, res):
        self.case, self.res = case, res
        self.task, self.s, self.label = case.info["task"], case.info["s"], case.label
        self.n_params, self.T = self.task.init.size, self.task.updates
        self.workers = range(1, case.world_size)

    def fail(self, check, what, **kw):
        return Failure(self.label, check, what, **kw)

    def pay(self, e):
        return self.res.payload(e)

    def computes(self, w):
        return [c for c in self.res.trace.computes if c.rank == w]

    def first(self, w, k):
        """The first version that can hold worker w's gradient k - 1 (0 for k = 0)."""
        return self.index[id(self.up[w][k - 1])] + 1 if k else 0

    def ready(self, w, k):
        """The first version at which the SSP bound lets worker w start clock k."""
        return next(u for u in range(self.first(w, k), len(self.clocks))
                    if k - min(self.clocks[u].values()) <= self.s)


def check(program, case, backend="sim"):
    # Payloads and simulated time are the simulator's: this grader runs there.
    res, failure = run_case(program, case, "sim", record_payloads=True, network=NETWORK)
    if failure:
        return failure
    run = _Run(case, res)
    # Each step returns a Failure or None; later steps read what earlier ones found.
    for step in (_returns, _messages, _protocol, _gradients, _count, _log_order, _replay,
                 _log_versions, _final, _staleness, _no_idling, _throughput):
        failure = step(run)
        if failure:
            return failure
    return None


def _returns(r):
    """2. The server returns (params, log)."""
    out = r.res.outputs[0]
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], np.ndarray)
            and out[0].shape == (r.n_params,)):
        return r.fail("the server returns (params, log)",
                      f"rank 0 returned {type(out).__name__}",
                      expected=f"a tuple (params of shape ({r.n_params},), log: an int array "
                               f"of shape (updates, 2), rows (worker, version_read))")
    params, log = out
    failure = plain_array(r.case, "the server", params, f"params of shape ({r.n_params},)")
    if failure:
        return failure
    rows = np.asarray(log) if isinstance(log, (np.ndarray, list, tuple)) else None
    if (rows is None or rows.ndim != 2 or rows.shape[1:] != (2,)
            or not np.issubdtype(rows.dtype, np.integer)):
        return r.fail("the server returns (params, log)",
                      f"the log is {type(log).__name__}" + (
                          f" of shape {rows.shape}, dtype {rows.dtype}" if rows is not None
                          else ""),
                      expected="an int array of shape (updates, 2): row i = (worker, "
                               "version_read) of the i-th applied gradient",
                      hint="Collect (worker, version_read) pairs in a list, and return "
                           "np.array(log).")
    r.params, r.log = params, [(int(w), int(v)) for w, v in rows]


def _messages(r):
    """3. Who sends what: the server parameters or STOP, a worker gradients."""
    r.down, r.up = defaultdict(list), defaultdict(list)     # per worker, in step order
    for e in r.res.trace:
        if 0 not in (e.src, e.dst):
            return r.fail("messages go only between the server and a worker",
                          f"at step {e.step} worker {e.src} sent worker {e.dst} a message",
                          hint="Workers never talk to each other in a parameter server.")
        # float32 on the way rounds what travels: the replay below is bit for bit.
        failure = checks.narrow_floats(
            r.res, r.case, events=[e], check="parameters and gradients travel as float64",
            carried="the parameters" if e.src == 0 else "its gradient", who=_who,
            hint="Send the float64 arrays as they are, no astype on the way: the grader "
                 "replays the updates bit for bit.")
        if failure:
            return failure
        x = r.pay(e)
        if e.src == 0 and not (x.size == 0 or (x.shape == (r.n_params,)
                                               and x.dtype == np.float64)):
            return r.fail("the server sends parameters or STOP",
                          f"at step {e.step} the server sent worker {e.dst} shape {x.shape}, "
                          f"dtype {x.dtype}",
                          expected=f"the parameters, shape ({r.n_params},), or STOP "
                                   f"(np.empty(0))")
        if e.src != 0 and x.shape != (r.n_params,):
            return r.fail("a worker pushes one gradient per message",
                          f"at step {e.step} worker {e.src} sent shape {x.shape}",
                          expected=f"a gradient of shape ({r.n_params},)")
        (r.down[e.dst] if e.src == 0 else r.up[e.src]).append(e)


def _who(rank):
    return "the server" if rank == 0 else f"worker {rank}"


def _protocol(r):
    """4. Each worker pulls, computes, pushes, pulls, ..., and ends on one STOP."""
    order = "each worker pulls, computes, pushes, then pulls again"
    for w in r.workers:
        d, u = r.down[w], r.up[w]
        stops = [i for i, e in enumerate(d) if e.nbytes == 0]
        if stops != [len(d) - 1]:
            return r.fail("every worker ends on one STOP",
                          f"worker {w} was sent {len(stops)} STOP messages" if len(stops) != 1
                          else f"worker {w} was sent parameters after its STOP",
                          expected="parameter messages, then one STOP (np.empty(0)), last")
        if len(d) - 1 != len(u):
            return r.fail("one gradient comes back for every parameter message",
                          f"worker {w} was sent {len(d) - 1} parameter messages and pushed "
                          f"{len(u)} gradients",
                          hint="A worker answers each parameter message with exactly one "
                               "gradient.")
        for k in range(len(u)):
            if u[k].step < d[k].step:
                return r.fail(order, f"worker {w} pushed gradient {k} (step {u[k].step}) before "
                                     f"it received the parameters for it (step {d[k].step})",
                              hint="After a push the worker must wait for the server's reply: "
                                   "`params = comm.recv(0)`, and compute from those.")
            if d[k + 1].step < u[k].step:
                return r.fail(order, f"the server sent worker {w} new parameters (step "
                                     f"{d[k + 1].step}) before its gradient {k} (step "
                                     f"{u[k].step})",
                              hint="Reply to a worker only after its gradient arrived.")


def _gradients(r):
    """5. The gradients are task.work's, from the parameters sent."""
    task, once = r.task, "one gradient computed per push"
    for w in r.workers:
        comp = [c for c in r.computes(w) if c.label == "gradient"]
        if len(comp) != len(r.up[w]) or [c.get("k") for c in comp] != list(range(len(comp))):
            return r.fail(once, f"worker {w} computed gradients k={[c.get('k') for c in comp]} "
                                f"and pushed {len(r.up[w])}",
                          hint="Call task.work(comm, params, k) once per push, k = 0, 1, 2, ...")
        for c in comp:
            # The hidden compute time is part of the task: a shorter one fakes speed.
            if not np.isclose(c.duration, task.compute_time(w, c.get("k")), rtol=1e-9, atol=0):
                return r.fail(once, f"worker {w} spent {c.duration:.6g} s on gradient "
                                    f"k={c.get('k')}, but that gradient takes "
                                    f"{task.compute_time(w, c.get('k')):.6g} s",
                              hint="Let task.work(comm, params, k) spend the compute time: do "
                                   "not call comm.compute yourself for the gradient.")
        for k, e in enumerate(r.up[w]):
            if np.array_equal(r.pay(e), task.gradient(r.pay(r.down[w][k]), w, k)):
                continue
            older = k and np.array_equal(r.pay(e), task.gradient(r.pay(r.down[w][k - 1]), w, k))
            return r.fail("each gradient is computed from the parameters the worker was sent",
                          f"worker {w}'s gradient {k} is not task.work of the parameters it "
                          f"received before it" + (
                              f": it is computed from the parameters of pull {k - 1}, so the "
                              f"worker pushed again without waiting for fresh ones"
                              if older else ""),
                          hint="Push exactly what task.work(comm, params, k) returns, for the "
                               "params of the latest comm.recv(0).")


def _count(r):
    """6. Exactly task.updates gradients."""
    r.arrivals = sorted((e for w in r.workers for e in r.up[w]), key=lambda e: e.step)
    if len(r.arrivals) != r.T:
        return r.fail("the server applies exactly task.updates gradients",
                      f"{len(r.arrivals)} gradients were pushed in all",
                      expected=f"task.updates = {r.T}: hand out exactly {r.T} parameter "
                               f"messages, then STOP",
                      hint="Count the parameter messages sent (each brings one gradient back); "
                           "once it reaches task.updates, answer with STOP.")


def _log_order(r):
    """7. The log: every arrived gradient, once, in arrival order."""
    r.order, logged = [e.src for e in r.arrivals], [w for w, _ in r.log]
    if len(r.log) != len(r.arrivals):
        return r.fail("every pushed gradient is applied exactly once",
                      f"the log has {len(r.log)} entries for {len(r.arrivals)} gradients that "
                      f"arrived",
                      hint="Log one (worker, version_read) per gradient received, as you apply "
                           "it.")
    if logged != r.order:
        i = next(i for i, (a, b) in enumerate(zip(logged, r.order)) if a != b)
        return r.fail("gradients are applied in the order they arrive",
                      f"log entry {i} is a gradient of worker {logged[i]}, but gradient {i} to "
                      f"arrive came from worker {r.order[i]}",
                      expected=f"arrival order {r.order[:i + 3]} ...", got=f"{logged[:i + 3]} ...",
                      hint=RECV_ANY)


def _replay(r):
    """8. Every parameter message is a prefix of the arrivals, replayed."""
    r.index = {id(e): i for i, e in enumerate(r.arrivals)}
    r.grads = [r.pay(e) for e in r.arrivals]
    _, r.states = replay(r.task, r.grads)          # version v: the first v gradients applied
    version_of = {s_.tobytes(): v for v, s_ in enumerate(r.states)}
    r.version = {}                                 # (worker, k) -> version of its k-th params
    for w in r.workers:
        for k, e in enumerate(r.down[w][:-1]):
            x, floor = r.pay(e), r.first(w, k)
            v = version_of.get(x.tobytes())
            if v is None:
                return r.fail("the server applies every gradient once, in arrival order",
                              f"the parameters sent to worker {w} at step {e.step} are not the "
                              f"initial ones with the first v arrived gradients applied, for "
                              f"any v" + _diagnose(x, r.states, r.grads, r.task.lr, floor),
                              hint="params -= task.lr * grad, once per gradient, as it arrives. "
                                   + RECV_ANY)
            if v < floor:
                return r.fail("the server sends the current parameters",
                              f"worker {w}'s parameters at step {e.step} are version {v}, "
                              f"without its own gradient {k - 1}, which arrived as gradient "
                              f"{floor - 1}: version {floor} and later hold it",
                              hint="Apply the gradient first, then reply with the parameters.")
            r.version[w, k] = v


def _log_versions(r):
    """9. The log's versions are the truth."""
    seen = defaultdict(int)
    for i, (w, v) in enumerate(r.log):
        k = seen[w]
        seen[w] += 1
        if v != r.version[w, k]:
            return r.fail("the log records the version each worker read",
                          f"log entry {i} says worker {w} read version {v}, but the parameters "
                          f"it was sent were version {r.version[w, k]}",
                          hint="Remember, per worker, len(log) at the moment you send it "
                               "parameters; log that when its gradient arrives.")


def _final(r):
    """10. The final parameters."""
    if not np.array_equal(r.params, r.states[-1]):
        return r.fail("the final parameters are the replay of the applied gradients",
                      "the server's final parameters differ from the initial ones with every "
                      "arrived gradient applied once, in arrival order"
                      + _diagnose(r.params, r.states, r.grads, r.task.lr, len(r.states) - 1),
                      expected=numbers(r.states[-1], 3), got=numbers(r.params, 3),
                      hint="Return the parameters the server updated, not a copy made "
                           "elsewhere.")


def _staleness(r):
    """11-12. The SSP bound, and no waiting beyond it."""
    r.clocks = ssp_clocks(r.workers, r.order)       # per version: gradients of each worker
    for w in r.workers:
        for k in range(len(r.down[w]) - 1):
            v = r.version[w, k]
            clock = r.clocks[v]
            slowest = min(clock, key=clock.get)
            if k - clock[slowest] > r.s:
                return r.fail("staleness never above s",
                              f"worker {w} started clock {k} with parameters of version {v}, "
                              f"which hold only {clock[slowest]} gradients of worker "
                              f"{slowest}: {k} - {clock[slowest]} > s = {r.s}",
                              hint="Hold a worker's reply back while its clock minus the "
                                   "slowest worker's clock is above s.")
            if k and v > r.ready(w, k):
                return r.fail("no worker waits when it need not",
                              f"worker {w} could start clock {k} at version {r.ready(w, k)} "
                              f"(within s = {r.s} of the slowest) but was sent parameters "
                              f"only at version {v}",
                              hint="After each gradient you apply, release every held "
                                   "worker whose clock is within s of the slowest.")


def _no_idling(r):
    """13. No idling, in simulated time: a worker computes when its parameters
    arrive; the server sends as soon as the trigger has arrived and its send
    port is free."""
    for w in r.workers:
        extra = [c for c in r.computes(w) if c.label != "gradient"]
        if extra:
            return r.fail("no worker idles",
                          f"worker {w} computed {extra[0].label!r} for "
                          f"{extra[0].duration * 1e3:.1f} ms",
                          expected="only gradients, with task.work",
                          hint="A worker pulls, computes with task.work, pushes: nothing else.")
        for k, c in enumerate(sorted(r.computes(w), key=lambda c: c.start)):
            arrived = r.down[w][k].end
            if c.start > arrived + EPS:
                return r.fail("no worker idles",
                              f"worker {w}'s parameters for gradient {k} arrived at "
                              f"{arrived * 1e3:.1f} ms, but it started computing at "
                              f"{c.start * 1e3:.1f} ms",
                              hint="Compute as soon as the parameters arrive.")
    port_free = 0.0
    for e in sorted((e for w in r.workers for e in r.down[w]), key=lambda e: e.step):
        w, k = e.dst, r.down[e.dst].index(e)
        if k < len(r.down[w]) - 1:                      # a parameter message, not STOP
            ready = r.ready(w, k)
            could = max(r.arrivals[ready - 1].end if ready else 0.0, port_free)
            if e.start > could + EPS:
                return r.fail("the server never idles",
                              f"the server could send worker {w} its parameters for clock "
                              f"{k} at {could * 1e3:.1f} ms but they left at "
                              f"{e.start * 1e3:.1f} ms",
                              hint="Reply as soon as a gradient is applied; do not compute or "
                                   "wait on the server.")
        port_free = e.end


def _throughput(r):
    """14. Throughput against the reference on the same hidden speeds."""
    ref = r.case.info.get("reference")
    if ref is None:
        ref = r.case.info["reference"] = run_async_ps(r.task, r.s).time
    if r.res.time > SLACK * ref:
        return r.fail("throughput within 1.5x of the reference",
                      f"{r.T} updates took {r.res.time:.3f} simulated seconds",
                      expected=f"at most {SLACK} x {ref:.3f} s",
                      got=f"{r.res.time / ref:.2f} x the reference",
                      hint="Do not wait or compute more than the protocol needs.")
    return None


def _diagnose(x, states, grads, lr, v):
    """Words for parameters that are no prefix: one gradient dropped or applied twice?"""
    for u in range(min(v, len(states) - 1), len(states)):
        for j, g in enumerate(grads[:u]):
            if np.allclose(x, states[u] + lr * g, rtol=0, atol=1e-12):
                return f" (they look like version {u} without gradient {j}: dropped?)"
            if np.allclose(x, states[u] - lr * g, rtol=0, atol=1e-12):
                return f" (they look like version {u} with gradient {j} applied twice)"
        if np.allclose(x, states[u], rtol=0, atol=1e-12):
            return (f" (they equal version {u} up to rounding: applied in another order, "
                    f"or not as params -= task.lr * grad?)")
    return ""
