"""The parent side of a run on the torch backend: dispatch, watch, diagnose.

``ringlab.run(program, inputs, backend="torch")`` lands here: it sends each
rank's program and input to a worker of the pool (``pool.py``), collects the
outcomes, merges the trace, and tells the workers to finish. Meanwhile it
watches the status blocks (``status.py``) in which the ranks say what they are
doing. No torch in this process.

Everything that can go wrong ends the same way: the run's workers are killed
(a rank blocked in ``dist.recv`` can't be interrupted otherwise), reaped, and
replaced at the next run, and the same error as the simulator's is raised:

* a rank raises                 -> ``RankError`` with its rank and traceback;
* every unfinished rank waits   -> ``DeadlockError`` naming what each waits for
  and nothing is on its way        (seen in the shared status blocks, at once);
* out of time                   -> ``ProgramTimeout`` (a rank still running) or
                                   ``DeadlockError`` (all of them waiting);
* messages nobody received      -> ``UnreceivedMessagesError``.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import time
from multiprocessing.connection import wait

import numpy as np

from ...errors import DeadlockError, ProgramTimeout, RankError, UnreceivedMessagesError
from ...result import RunResult
from . import status as st
from .outcome import drain_plan, format_frames, format_traceback, merged_trace, peer_gone
from .pool import dumps_program, get_pool

POLL = 0.05                # seconds between looks at the status blocks
STILL = 0.25               # seconds with no change before a deadlock is reported


def run(backend, program, inputs, *, args=(), kwargs=None, timeout=10.0, check_unreceived=True,
        record_payloads=False):
    """``ringlab.run`` on real processes with torch.distributed ``backend``
    ("gloo" or "nccl"): a ``RunResult``, or the simulator's errors."""
    inputs = list(inputs)
    n = len(inputs)
    if not inputs:
        raise ValueError("run() needs one input per rank; got an empty list (world_size 0)")
    if n > st.MAX_RANKS:
        raise ValueError(f"the local torch backend runs at most {st.MAX_RANKS} ranks; use "
                         f"`python -m ringlab.launch` under torchrun for more")
    blobs = [dumps_program((program, x, tuple(args), kwargs or {}, record_payloads)) for x in inputs]
    pool = get_pool()
    workers = pool.take(n)
    run_id = next(pool.run_ids)
    store = os.path.join(pool.tmpdir, f"run{run_id}")
    try:
        for r, w in enumerate(workers):
            w.status.reset()
            w.send(("run", run_id, r, n, backend, store, list(sys.path), blobs[r], timeout))
        outcomes = _collect(workers, timeout, program)
        for o in outcomes:
            if o.printed:
                sys.stdout.write(o.printed)
        trace = merged_trace(outcomes)
        if trace.unreceived:
            pool.discard(workers, replace=True)    # their sends can never complete
            if check_unreceived:
                raise UnreceivedMessagesError(trace.unreceived)
        else:
            plan = drain_plan(outcomes)
            for r, w in enumerate(workers):
                w.send(("finish", plan[r]))
            _wait_idle(pool, workers)
        payloads = {k: v for o in outcomes for k, v in (o.payloads or {}).items()} if record_payloads else None
        return RunResult([o.result for o in outcomes], trace, payloads)
    except BaseException:
        pool.discard(workers, replace=True)
        raise
    finally:
        if os.path.exists(store):
            os.remove(store)


def _collect(workers, timeout, program):
    """Wait for every rank's outcome, or raise the error that ends the run. When
    the run fails, what the ranks that did finish printed is shown first: in the
    simulator it would have been printed already."""
    finished = {}
    try:
        return _wait_for_outcomes(workers, timeout, program, finished)
    except BaseException:
        for r in sorted(finished):
            if finished[r].printed:
                sys.stdout.write(finished[r].printed)
        raise


def _wait_for_outcomes(workers, timeout, program, outcomes):
    """``_collect``'s work; the outcomes of ranks that finished go into ``outcomes``."""
    n = len(workers)
    conns = {w.conn: r for r, w in enumerate(workers)}
    started = set()
    t0 = time.monotonic()
    program_start = None
    previous = None                                # last status snapshot, for deadlock detection
    # Errors: wait a moment for every rank that fails at about the same time,
    # then report the earliest (step, rank), as the simulator would. A gloo
    # "connection closed" is only an echo of another rank's end: last resort.
    failures, echoes, first_failure = [], [], None
    while len(outcomes) < n:
        for conn in wait(list(conns), timeout=POLL):
            r = conns[conn]
            try:
                msg = pickle.loads(conn.recv_bytes())
            except EOFError:
                failures.append((int(workers[r].status.words[st.CLOCK]), r, None))    # the process died
                del conns[conn]
                continue
            if msg[0] == "started":
                started.add(r)
                if len(started) == n:
                    program_start = time.monotonic()
            elif msg[0] == "outcome":
                o = msg[1]
                del conns[conn]
                if o.error is None:
                    outcomes[r] = o
                    continue
                if o.printed:
                    sys.stdout.write(o.printed)
                (echoes if peer_gone(o.error) else failures).append((o.step, r, o))
        now = time.monotonic()
        if (failures or echoes) and first_failure is None:
            first_failure = now
        if first_failure is not None and (now - first_failure > (0.2 if failures else 1.0) or not conns):
            step, r, o = min(failures or echoes, key=lambda f: f[:2])
            if o is None:
                raise RankError(r, step, RuntimeError(f"the process of rank {r} died"),
                                "(no Python traceback: the process ended abruptly)") from None
            trace = _trace_so_far(workers, {**outcomes, r: o})
            raise RankError(r, o.step, o.error, format_traceback(o, program), trace) from None
        if program_start is None:
            if now - t0 > max(60.0, timeout or 0):
                raise RuntimeError(f"ranks {sorted(set(range(n)) - started)} could not join the process group")
            continue
        snaps = [w.status.snapshot() for w in workers]
        if previous is None or not all(np.array_equal(a, b) for a, b in zip(snaps, previous)):
            previous, still_since = snaps, now
        # A deadlock only once nothing has changed for STILL seconds: on a busy
        # machine a rank can sit between two of its status writes for a while.
        waiting = _deadlock(snaps) if now - still_since >= STILL else None
        if waiting is not None:
            raise DeadlockError(waiting, [r for r, s in enumerate(snaps) if s[st.STATE] == st.DONE],
                                _trace_so_far(workers, outcomes))
        if timeout is not None and now - program_start > timeout:
            raise _timeout_error(workers, snaps, timeout, program, outcomes)
    return [outcomes[r] for r in range(n)]


def _trace_so_far(workers, known):
    """The messages sent until now (``unreceived``: those still in flight), from
    the ``known`` outcomes and by asking the other ranks; None if one can't say."""
    reports = dict(known)
    for r, w in enumerate(workers):
        if r in reports:
            continue
        try:
            w.side.send_bytes(b"?")
            if not w.side.poll(2.0):
                return None
            reports[r] = pickle.loads(w.side.recv_bytes())
        except (EOFError, OSError):
            return None
        if reports[r] is None:
            return None
    return merged_trace([reports[r] for r in range(len(workers))])


def _deadlock(snaps):
    """``{rank: what it waits for}`` if no rank can ever move again, else None.

    A rank can move if it runs; if it waits in recv and a message from the rank
    it waits for is on its way (sent, not yet received: maybe of another tag or
    group, so we can't be sure it helps; for ``recv_any``, from anyone); or if it
    waits for a send to complete and the receiver has already received it (gloo
    tells the sender a little later). Counts are per pair of global ranks, over
    all groups, and only of the programs' messages.

    Not covered (the run ends at its timeout instead): a rank waiting in a
    barrier, split, new_group or ``work.wait()`` (state AGREE counts as "may
    move"), and anything the ``comm.start`` works wait for (their threads don't
    report here)."""
    def in_flight(src, dst):
        return snaps[src][st.SENT + dst] > snaps[dst][st.RECEIVED + src]

    waiting = {}
    for r, words in enumerate(snaps):
        state, peer = int(words[st.STATE]), int(words[st.PEER])
        if state == st.DONE:
            continue
        if state == st.RECV and not (in_flight(peer, r) if peer >= 0 else
                                     any(in_flight(s, r) for s in range(len(snaps)))):
            waiting[r] = st.describe(words)
        elif state == st.SEND and in_flight(r, peer):
            waiting[r] = st.describe(words)
        else:
            return None
    return waiting or None


def _timeout_error(workers, snaps, timeout, program, outcomes):
    running = [r for r, s in enumerate(snaps) if s[st.STATE] in (st.RUNNING, st.IDLE)]
    waiting = {r: st.describe(s) for r, s in enumerate(snaps) if s[st.STATE] in (st.RECV, st.SEND, st.AGREE)}
    finished = [r for r, s in enumerate(snaps) if s[st.STATE] == st.DONE]
    if not running and waiting:
        return DeadlockError(waiting, finished, _trace_so_far(workers, outcomes))
    r = running[0] if running else None
    where = ""
    if r is not None:                        # ask it where it is (see worker.py, SIGUSR1)
        try:
            os.kill(workers[r].pid, signal.SIGUSR1)
            deadline = time.monotonic() + 0.5
            while not (where := workers[r].status.read_text()) and time.monotonic() < deadline:
                time.sleep(0.02)
        except OSError:
            pass
        where = f"rank {r} is here:\n{format_frames(json.loads(where), program)}" if where else ""
    others = "".join(f"\n  rank {q}: {st.describe(s)}" for q, s in enumerate(snaps) if q != r)
    return ProgramTimeout(timeout, r, int(snaps[r][st.CLOCK]) if r is not None else None,
                          where + ("\nthe other ranks:" + others if others else ""))


def _wait_idle(pool, workers, seconds=30.0):
    deadline = time.monotonic() + seconds
    for w in workers:
        if not w.conn.poll(max(0.0, deadline - time.monotonic())):
            pool.discard([w])        # stuck leaving the group: replace it
            continue
        try:
            w.conn.recv_bytes()
        except EOFError:
            pool.discard([w])
