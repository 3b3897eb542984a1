"""One-port steps for a run that happened elsewhere (on real processes).

In the one-port model a message's step depends on the *receiver's* port too
(it may be busy with another sender's message), which a sending process
cannot know. So real processes only log, in program order, what each rank did
(``("send", dst, tag)``, ``("recv", src, tag, k)`` for the k-th receive waited
on a channel, ``("enter", name)``/``("exit",)`` for spans), and the simulator
replays those logs with empty messages: same calls, same order, so the same
steps, as if the program had run here.

    >>> logs = [[("send", 1, 0), ("send", 2, 0)], [("recv", 0, 0, 0)], [("recv", 0, 0, 0)]]
    >>> [(e.step, e.src, e.dst) for e in replay(logs).events]
    [(1, 0, 1), (2, 0, 2)]
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

_EMPTY = np.empty(0)


def _replayer(comm, log):
    posted = defaultdict(list)             # (src, tag) -> irecv requests posted so far
    spans = []
    for op in log:
        kind = op[0]
        if kind == "send":
            comm.isend(_EMPTY, op[1], tag=op[2])
        elif kind == "recv":
            _, src, tag, k = op
            reqs = posted[(src, tag)]
            while len(reqs) <= k:          # receives on a channel match in order
                reqs.append(comm.irecv(src, tag=tag))
            reqs[k].wait()
        elif kind == "enter":
            spans.append(comm.span(op[1]))
            spans[-1].__enter__()
        elif kind == "exit":
            spans.pop().__exit__(None, None, None)


def replay(logs, timeout=30.0):
    """The trace of the logged calls (events carry steps, src, dst, tag, seq;
    spans carry steps), or None if the logs do not replay (a failed run)."""
    from . import run
    from ..errors import RinglabError
    try:
        return run(_replayer, logs, check_unreceived=False, timeout=timeout).trace
    except RinglabError:
        return None


def restamp(events, spans, logs):
    """``events`` and ``spans`` with the one-port steps of the replayed ``logs``;
    unchanged if the logs do not replay."""
    trace = replay(logs)
    if trace is None:
        return events, spans
    steps = {(e.src, e.dst, e.tag, e.seq): e.step for e in trace.events}
    if len(steps) != len(events) or any((e.src, e.dst, e.tag, e.seq) not in steps for e in events):
        return events, spans
    events = [e._replace(step=steps[(e.src, e.dst, e.tag, e.seq)]) for e in events]
    return events, trace.spans
