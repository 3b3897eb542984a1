"""Check a pipeline schedule, and time it.

``validate(schedule)`` returns ``None`` for a schedule that can run, or the first
``Violation``, in plain words:

    >>> from ringlab.pipeline import parse
    >>> print(validate([parse("0F0 0B0"), parse("1B0 1F0")]))
    rank 1, action 0 (1B0): backward of microbatch 0 before its forward

It follows torch.distributed.pipelining's ``_validate_schedule`` (a backward
needs its forward, a weight gradient its backward, each stage runs every
microbatch) and adds: microbatches in order on each stage, inputs that no
action produces, deadlocks (found by running the ranks' lists against each
other) and a limit on the microbatches in flight.

``timeline(schedule, t_f, t_b, t_w)`` runs every action as early as its
rank and its input allow (communication takes no time): the ideal timeline,
from which the bubble follows exactly.

    >>> from ringlab.pipeline.schedules import gpipe
    >>> print(format_timeline(timeline(gpipe(2, 2))))
    rank 0: F0 F1 .  .  B0 B1
    rank 1: .  F0 F1 B0 B1 .
    >>> bubble_ratio(timeline(gpipe(2, 2)))  # idle / compute = (p - 1) / m
    Fraction(1, 2)
"""

from collections import defaultdict, deque, namedtuple
from dataclasses import dataclass
from fractions import Fraction
from math import ceil

from .actions import Action, needs, stage_rank

NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
BEFORE = {"B": "F", "W": "B"}  # what must have run on the stage first


@dataclass(frozen=True)
class Violation:
    """The first thing wrong with a schedule: where (rank, position in its list,
    action; ``index`` None for the end of the list) and what."""

    rank: int
    index: object
    action: object
    problem: str

    def __str__(self):
        where = "end of its list" if self.index is None else f"action {self.index} ({self.action})"
        return f"rank {self.rank}, {where}: {self.problem}"


class ScheduleError(ValueError):
    """Raised by ``check`` and ``timeline`` for a schedule that cannot run."""

    def __init__(self, violation):
        super().__init__(str(violation))
        self.violation = violation


def producer(action, n_stages):
    """The action on the neighbouring stage whose output ``action`` needs, or None."""
    need = needs(action, n_stages)
    if need is None:
        return None
    return Action("F" if need[0] == "activation" else "B", action.mb, need[1])


def _sizes(schedule, n_stages, n_microbatches):
    """Number of stages and microbatches: given, or the least that fit the actions."""
    p = len(schedule)
    acts = [a for actions in schedule for a in actions if isinstance(a, Action)]
    if n_stages is None:  # a multiple of p: every rank holds as many stages
        n_stages = p * max(1, ceil((1 + max((a.stage for a in acts), default=0)) / p))
    if n_microbatches is None:
        n_microbatches = 1 + max((a.mb for a in acts), default=-1)
    return n_stages, n_microbatches


def _freed_by(schedule):
    """Per stage, the action that frees a microbatch's activations: W if the
    stage splits its backward (zero-bubble schedules), else B."""
    split = {a.stage for actions in schedule for a in actions if a.kind == "W"}
    return defaultdict(lambda: "B", {s: "W" for s in split})


def in_flight(actions, freed_by):
    """After each action of one rank: how many microbatches it holds activations
    for (forwards whose B, or W when the stage splits its backward, has not run).
    With interleaving each counts one chunk's activations, 1/v of a stage's."""
    count, out = 0, []
    for a in actions:
        count += (a.kind == "F") - (a.kind == freed_by[a.stage])
        out.append(count)
    return out


def peak_in_flight(schedule):
    """Per rank, the most microbatches in flight at once.

    >>> from ringlab.pipeline.schedules import gpipe, one_f_one_b
    >>> peak_in_flight(gpipe(4, 8)), peak_in_flight(one_f_one_b(4, 8))
    ([8, 8, 8, 8], [4, 3, 2, 1])
    """
    freed_by = _freed_by(schedule)
    return [max(in_flight(actions, freed_by), default=0) for actions in schedule]


def _check_rank(r, actions, p, n_stages, n_microbatches, limit, freed_by):
    """The first violation in rank r's own list (placement, order, memory), or None."""
    ran = defaultdict(int)  # (kind, stage) -> microbatches run so far (0, 1, ... in order)
    for i, (a, held) in enumerate(zip(actions, in_flight(actions, freed_by))):
        def bad(problem):
            return Violation(r, i, a, problem)
        name = NAMES[a.kind]
        if a.stage >= n_stages:
            return bad(f"stage {a.stage} does not exist: stages are 0 to {n_stages - 1}")
        if stage_rank(a.stage, p) != r:
            return bad(f"stage {a.stage} belongs on rank {stage_rank(a.stage, p)}, not rank {r}")
        if a.mb >= n_microbatches:
            return bad(f"microbatch {a.mb} does not exist: microbatches are 0 to "
                       f"{n_microbatches - 1}")
        if a.kind in BEFORE and a.mb >= ran[BEFORE[a.kind], a.stage]:
            return bad(f"{name} of microbatch {a.mb} before its {NAMES[BEFORE[a.kind]]}")
        expected = ran[a.kind, a.stage]
        if a.mb < expected:
            return bad(f"{name} of microbatch {a.mb} runs twice")
        if a.mb > expected:
            return bad(f"{name} of microbatch {a.mb} out of order: "
                       f"microbatch {expected} comes first")
        ran[a.kind, a.stage] += 1
        if limit is not None and held > limit:
            return bad(f"{held} microbatches in flight, more than the limit of {limit}")
    return None


def _run(schedule, n_stages, cost):
    """Run each rank's list in order, every action as soon as the previous one on
    its rank has finished and its input has arrived (at once: communication is free).
    ``cost``: seconds by action kind, ``{"F": .., "B": .., "W": ..}``, or a function
    of the action (stages of different sizes). Returns the (start, end) of each
    action that ran, per rank; a rank's list is cut short where it got stuck.

    Each action is placed once: a rank runs ahead until its next input is missing,
    then waits in ``blocked`` until the action that produces it has run."""
    if not callable(cost):
        cost = (lambda table: lambda a: table[a.kind])(cost)
    ended = {}  # action -> end time
    times = [[] for _ in schedule]
    blocked = {}  # missing input -> ranks waiting for it
    ready = deque(range(len(schedule)))
    while ready:
        r = ready.popleft()
        actions = schedule[r]
        while len(times[r]) < len(actions):
            a = actions[len(times[r])]
            src = producer(a, n_stages)
            if src is not None and src not in ended:
                blocked.setdefault(src, []).append(r)
                break
            start = max(times[r][-1][1] if times[r] else 0, ended.get(src, 0))
            ended[a] = start + cost(a)
            times[r].append((start, ended[a]))
            ready.extend(blocked.pop(a, ()))
    return times


def _stuck(schedule, n_stages, times):
    """Why the run stopped: an input that nothing left to run produces, or a
    cycle of ranks each waiting for the next."""
    p = len(schedule)
    waiting = {r: len(times[r]) for r in range(p) if len(times[r]) < len(schedule[r])}
    waits_for = {}  # rank -> (rank it waits for, index there of the action it waits for)
    for r, i in waiting.items():
        a = schedule[r][i]
        src = producer(a, n_stages)
        what = f"the {needs(a, n_stages)[0]} of microbatch {a.mb}"
        q = stage_rank(src.stage, p)
        rest = schedule[q][waiting.get(q, len(schedule[q])):]
        if src not in rest:
            return Violation(r, i, a, f"needs {what} from stage {src.stage}, "
                                      f"which no action on rank {q} produces")
        waits_for[r] = (q, waiting[q] + rest.index(src), what)
    r, seen = min(waiting), []
    while r not in seen:  # every waiting rank waits for a waiting rank: follow to a cycle
        seen.append(r)
        r = waits_for[r][0]
    cycle = seen[seen.index(r):]
    steps = []
    for k, r in enumerate(cycle):
        q, j, what = waits_for[r]
        who = "it" if k == 0 else f"rank {r}, action {waiting[r]} ({schedule[r][waiting[r]]}),"
        steps.append(f"{who} waits for {what} from {schedule[q][j]} (rank {q}, action {j})")
    first = cycle[0]
    return Violation(first, waiting[first], schedule[first][waiting[first]],
                     "deadlock: " + "; ".join(steps))


def validate(schedule, n_stages=None, max_in_flight=None, n_microbatches=None):
    """The first violation in ``schedule`` (one list of Actions per rank), or None.

    ``n_stages`` and ``n_microbatches`` default to the least that fit the
    actions; ``max_in_flight`` (an int, or one per rank) limits the
    microbatches a rank holds activations for (see ``in_flight``).

    >>> from ringlab.pipeline import parse
    >>> print(validate([parse("0F0 0F1 0B1 0B0"), parse("1F0 1B0 1F1 1B1")]))
    rank 0, action 2 (0B1): backward of microbatch 1 out of order: microbatch 0 comes first
    >>> print(validate([parse("0F0 0B0 0F1 0B1"), parse("1F0 1F1 1B0 1B1")]))
    rank 0, action 1 (0B0): deadlock: it waits for the gradient of microbatch 0 from 1B0 \
(rank 1, action 2); rank 1, action 1 (1F1), waits for the activation of microbatch 1 from \
0F1 (rank 0, action 2)
    >>> print(validate([parse("0F0 0F1 0B0 0B1")], max_in_flight=1))
    rank 0, action 1 (0F1): 2 microbatches in flight, more than the limit of 1
    """
    p = len(schedule)
    for r, actions in enumerate(schedule):
        for i, a in enumerate(actions):
            if not isinstance(a, Action):
                return Violation(r, i, repr(a), f"{a!r} is not an Action (parse('0F0') makes one)")
    n_stages, n_microbatches = _sizes(schedule, n_stages, n_microbatches)
    limits = max_in_flight if isinstance(max_in_flight, (list, tuple)) else [max_in_flight] * p
    if len(limits) != p:
        raise ValueError(f"max_in_flight has {len(limits)} limits for {p} ranks")
    freed_by = _freed_by(schedule)
    for r, actions in enumerate(schedule):
        found = _check_rank(r, actions, p, n_stages, n_microbatches, limits[r], freed_by)
        if found:
            return found
    times = _run(schedule, n_stages, defaultdict(int))
    if any(len(t) < len(actions) for t, actions in zip(times, schedule)):
        return _stuck(schedule, n_stages, times)
    for s in range(n_stages):  # every stage runs every microbatch (W: all or none)
        r = stage_rank(s, p)
        for kind in "FBW":
            done = sum(a.kind == kind and a.stage == s for a in schedule[r])
            if done < n_microbatches and (kind != "W" or freed_by[s] == "W"):
                return Violation(r, None, None, f"stage {s} never runs the "
                                                f"{NAMES[kind]} of microbatch {done}")
    return None


def check(schedule, **kwargs):
    """Like ``validate``, but raise ``ScheduleError`` at the first violation."""
    found = validate(schedule, **kwargs)
    if found:
        raise ScheduleError(found)


Slot = namedtuple("Slot", "action start end")


def timeline(schedule, t_f=1, t_b=1, t_w=1):
    """The ideal timeline: per rank, a ``Slot(action, start, end)`` per action,
    each starting as soon as its rank is free and its input exists (sends take
    no time). ``t_b`` is the whole backward when the schedule has no W.

    >>> from ringlab.pipeline import parse
    >>> timeline([parse("0F0 0B0"), parse("1F0 1B0")], t_b=2)[0]
    [Slot(action=Action(kind='F', mb=0, stage=0), start=0, end=1), \
Slot(action=Action(kind='B', mb=0, stage=0), start=4, end=6)]
    """
    check(schedule)
    n_stages, _ = _sizes(schedule, None, None)
    times = _run(schedule, n_stages, {"F": t_f, "B": t_b, "W": t_w})
    return [[Slot(a, *t) for a, t in zip(acts, ts)] for acts, ts in zip(schedule, times)]


def makespan_of(schedule, cost):
    """When the last action ends if each takes ``cost(action)`` seconds (stages of
    unequal sizes) and communication is free.

    >>> from ringlab.pipeline import one_f_one_b
    >>> makespan_of(one_f_one_b(2, 2), lambda a: {"F": 1, "B": 2}[a.kind] * (1 + a.stage))
    15
    """
    n_stages, _ = _sizes(schedule, None, None)
    return max(end for ts in _run(schedule, n_stages, cost) for _, end in ts)


def _ratio(a, b):
    return Fraction(a, b) if isinstance(a, int) and isinstance(b, int) else a / b


def makespan(tl):
    """When the last action ends."""
    return max(s.end for slots in tl for s in slots)


def idle_time(tl):
    """Total time the ranks wait, from 0 to the makespan (the bubble)."""
    return len(tl) * makespan(tl) - sum(s.end - s.start for slots in tl for s in slots)


def bubble_ratio(tl):
    """Idle time over compute time: (p - 1) / m for GPipe and 1F1B."""
    return _ratio(idle_time(tl), len(tl) * makespan(tl) - idle_time(tl))


def bubble_fraction(tl):
    """Idle time over total time, p x makespan: (p - 1) / (m + p - 1) for GPipe and 1F1B."""
    return _ratio(idle_time(tl), len(tl) * makespan(tl))


def picture(schedule, **times):
    """``format_timeline(timeline(schedule, **times))``."""
    return format_timeline(timeline(schedule, **times))


def format_timeline(tl):
    """A text picture of a timeline with whole-number times: one column per
    time unit, ``.`` where the rank waits. Actions show as ``F3`` when each
    rank holds one stage, as ``2F3`` otherwise."""
    p, n_stages = len(tl), _sizes([[s.action for s in slots] for slots in tl], None, None)[0]
    label = (lambda a: f"{a.kind}{a.mb}") if n_stages == p else str
    width = max(len(label(s.action)) for slots in tl for s in slots)
    rows = []
    for r, slots in enumerate(tl):
        cells = ["."] * makespan(tl)
        for s in slots:
            cells[s.start:s.end] = [label(s.action)] + [""] * (s.end - s.start - 1)
        rows.append(f"rank {r}: " + " ".join(c.ljust(width) for c in cells).rstrip())
    return "\n".join(rows)
