"""What a rank reports when its program ends, and what the parent makes of
all the reports: which messages nobody received. No torch here: the parent
(which never imports torch) unpickles these."""

import functools
import linecache
import types
from collections import defaultdict
from dataclasses import dataclass, field

from ...sim.replay import restamp
from ...trace import Trace


@dataclass
class Outcome:
    """What one rank reports when its program ends: a result, or an error."""

    rank: int
    result: object = None
    events: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    payloads: dict | None = None                     # payload_key -> array, if recorded
    log: list = field(default_factory=list)          # what the program did (sim.replay)
    work_logs: list = field(default_factory=list)    # what each comm.start work did, in start order
    computes: list = field(default_factory=list)     # Compute events (real seconds)
    memory: list = field(default_factory=list)       # MemoryEvents (comm.alloc/free)
    received: dict = field(default_factory=dict)     # (group, stream, src, tag) -> count, incl. unwaited irecvs
    unwaited: dict = field(default_factory=dict)
    error: BaseException | None = None
    step: int = 0
    frames: list = field(default_factory=list)       # where the error happened (protocol._frames)
    traceback: str = ""                              # the exception's last line
    printed: str = ""                                # what the program printed


def leftovers(outcomes):
    """Events sent but never received, given every rank's Outcome."""
    got = {}
    for o in outcomes:
        for (group, stream, src, tag), n in o.received.items():
            got[(group, stream, src, o.rank, tag)] = n
    return [e for o in outcomes for e in o.events
            if e.seq >= got.get((e.group, e.stream, e.src, e.dst, e.tag), 0)]


def merged_trace(outcomes):
    """The run's trace, from every rank's Outcome (in rank order): all events
    and spans, and as ``unreceived`` the messages nobody received. Steps (and
    the memory events' simulated times) come from replaying the ranks' logs in
    the simulator (see ``sim.replay``)."""
    events = [e for o in outcomes for e in o.events]
    spans = [s for o in outcomes for s in o.spans]
    memory = [m for o in outcomes for m in o.memory]
    left = leftovers(outcomes)
    if not left:
        events, spans, memory = restamp(events, spans, memory,
                                        [(o.log, o.work_logs) for o in outcomes])
    return Trace(events, len(outcomes), spans, left, [c for o in outcomes for c in o.computes],
                 memory=memory)


def drain_plan(outcomes):
    """For each rank, the unwaited irecvs whose messages were really sent."""
    sent = defaultdict(int)
    for o in outcomes:
        for e in o.events:
            sent[(e.group, e.stream, e.src, e.dst, e.tag)] += 1
    plan = {}
    for o in outcomes:
        drain = {}
        for (group, stream, src, tag), unwaited in o.unwaited.items():
            key = (group, stream, src, tag)
            waited = o.received[key] - unwaited                     # received counts the unwaited too
            due = sent[(group, stream, src, o.rank, tag)] - waited  # sent, not received by a wait()
            if due > 0:
                drain[key] = min(unwaited, due)
        plan[o.rank] = drain
    return plan


def format_frames(frames, program=None):
    """Frames as traceback text, with source lines read here. Functions that
    cloudpickle sent by value report the file ``<dynamic-code>``; ``program``
    (the function we sent) tells which file they really came from."""
    files = _code_files(program) if program is not None else {}
    out = []
    for filename, lineno, name, first in frames:
        filename = files.get((name, first), filename) if filename == "<dynamic-code>" else filename
        out.append(f'  File "{filename}", line {lineno}, in {name}\n')
        line = linecache.getline(filename, lineno).strip()
        if line:
            out.append(f"    {line}\n")
    return "".join(out)


def format_traceback(outcome, program=None):
    return ("Traceback (most recent call last):\n" + format_frames(outcome.frames, program)
            + outcome.traceback)


def _code_files(program):
    """``{(name, first line): file}`` for the code reachable from ``program``:
    its own, nested functions, closures, decorators' wrapped functions and the
    functions of its module that it names."""
    files, seen, todo = {}, set(), [program]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
        todo += [getattr(obj, "__wrapped__", None)] if hasattr(obj, "__wrapped__") else []
        code = getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType):
            continue
        todo += [c.cell_contents for c in (obj.__closure__ or ()) if _filled(c)]
        glb = getattr(obj, "__globals__", {})
        codes = [code]
        while codes:
            c = codes.pop()
            files[(c.co_name, c.co_firstlineno)] = c.co_filename
            codes += [k for k in c.co_consts if isinstance(k, types.CodeType)]
            todo += [glb[n] for n in c.co_names if callable(glb.get(n))]
    return files


def _filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def peer_gone(exc):
    """gloo's error in a rank whose peer process ended: an echo, not the cause."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("Connection closed by peer" in text or "Connection reset" in text)
