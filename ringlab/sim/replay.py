"""One-port steps for a run that happened elsewhere (on real processes).

In the one-port model a message's step depends on the *receiver's* port too
(it may be busy with another sender's message), which a sending process
cannot know. So real processes only log, in program order, what each rank did,
and the simulator replays those logs with empty messages: same calls, same
order, so the same steps, as if the program had run here.

A rank's log is ``(program_log, work_logs)``: what its program did, and what
each of its ``comm.start`` works did (in start order). Peers are global ranks,
``group`` is the group's label (None: the whole world); the stream is that of
the log (program or work):

* ``("send", dst, tag, group)``;
* ``("recv", src, tag, k, group)``: the k-th receive waited on that channel
  (a ``recv_any`` is logged as a receive from the rank it got a message from);
* ``("enter", name, group)`` / ``("exit",)``: spans;
* ``("new_group", parent, ranks, name)`` (``ranks`` in the parent's numbers);
  ``("agree", group, what, value)``: a barrier or split;
* ``("compute", seconds)``: simulated time orders the ports, so it is replayed;
* ``("memory", label, nbytes)``: a ``comm.alloc`` (``nbytes > 0``) or ``free``,
  replayed to get its simulated time and step;
* ``("start", i, group)``: start work i; ``("wait_work", i)``.

    >>> logs = [([("send", 1, 0, None), ("send", 2, 0, None)], []),
    ...         ([("recv", 0, 0, 0, None)], []), ([("recv", 0, 0, 0, None)], [])]
    >>> [(e.step, e.src, e.dst) for e in replay(logs).events]
    [(1, 0, 1), (2, 0, 2)]
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

_EMPTY = np.empty(0)


def _replayer(comm, logs):
    log, work_logs = logs
    _replay(comm, log, work_logs, {}, defaultdict(list))


def _replay(comm, log, work_logs, works, posted):
    """Redo ``log`` on ``comm``. ``posted``: (group, src, tag) -> irecvs posted so
    far, shared by the works of a rank (they run one after another)."""
    comms = {comm.group.label: comm}       # label -> this actor's Comm of that group
    spans = []
    work_posted = defaultdict(list)
    for op in log:
        kind = op[0]
        if kind == "send":
            _, dst, tag, group = op
            c = comms[group]
            c.isend(_EMPTY, c._index[dst], tag=tag)
        elif kind == "recv":
            _, src, tag, k, group = op
            c, reqs = comms[group], posted[(group, src, tag)]
            while len(reqs) <= k:          # receives on a channel match in order
                reqs.append(c.irecv(c._index[src], tag=tag))
            reqs[k].wait()
        elif kind == "enter":
            spans.append(comms[op[2]].span(op[1]))
            spans[-1].__enter__()
        elif kind == "exit":
            spans.pop().__exit__(None, None, None)
        elif kind == "new_group":
            _, parent, ranks, name = op
            sub = comms[parent].new_group(ranks, name)
            if sub is not None:
                comms[sub.group.label] = sub
        elif kind == "agree":
            _, group, what, value = op
            comms[group]._world.agree(comms[group], value, what)
        elif kind == "compute":
            comm.compute(op[1])
        elif kind == "memory":
            comm._world.memory(comm, op[1], op[2])
        elif kind == "start":
            _, i, group = op
            works[i] = comms[group].start(_replay, work_logs[i], work_logs, works, work_posted)
        elif kind == "wait_work":
            works[op[1]].wait()


def replay(logs, timeout=30.0):
    """The trace of the logged calls (events carry steps, src, dst, tag, seq;
    spans carry steps), or None if the logs do not replay (a failed run)."""
    from . import run
    from ..errors import RinglabError
    try:
        return run(_replayer, logs, check_unreceived=False, timeout=timeout).trace
    except RinglabError:
        return None


def _channel(e):
    return (e.group, e.stream, e.src, e.dst, e.tag, e.seq)


def restamp(events, spans, memory, logs):
    """``events``, ``spans`` and ``memory`` with the one-port steps (and
    simulated times) of the replayed ``logs``; unchanged if the logs do not replay."""
    trace = replay(logs)
    if trace is None:
        return events, spans, memory
    steps = {_channel(e): e.step for e in trace.events}
    if len(steps) != len(events) or any(_channel(e) not in steps for e in events):
        return events, spans, memory
    events = [e._replace(step=steps[_channel(e)]) for e in events]
    return events, trace.spans, trace.memory
