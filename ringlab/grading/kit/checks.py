"""Trace checks shared by the graders.

Each takes the trace of a run and the ``Case``, and returns ``None`` when the
trace passes or a ``Failure`` naming the check, the step and ranks where it
broke, what was expected, what happened and what to try. The wording is the
graders' (the book shows it), so callers pass the parts that depend on the
exercise: the algorithm's name, the expected step count, the hint.
"""

import sys
import traceback
import types

import numpy as np

from .report import Failure, numbers
from ...errors import CommError, RankError


def first_wait(computes):
    """The first two of a rank's backward ``computes`` (in order) where the second
    starts later than the first ended, as ``(before, after)``; None when each
    starts as the one before it ends. A wait inside the backward loop (for an
    AllReduce, say) leaves such a gap: "backward never waits for the network"."""
    return next(((before, after) for before, after in zip(computes, computes[1:])
                 if after.start > before.end + 1e-12), None)


def ring_neighbours(trace, case, algorithm, hub_text, hint=None):
    """Every message goes to (rank + 1) % N or (rank - 1) % N (any message is
    fine when N <= 2). ``hub_text`` names the central scheme, shown when one rank
    is an end of every message: "a central reduction through one rank (...)"."""
    n = case.world_size
    for e in trace:
        if n > 2 and e.dst not in ((e.src + 1) % n, (e.src - 1) % n):
            # A hub that is an end of every message: a central (parameter-server) scheme.
            centre = hub(trace, n)
            if centre is not None:
                hint = f"Every message goes to or from rank {centre}: that is {hub_text}, not a {algorithm}."
            return Failure(
                case.label, "messages go only between ring neighbours",
                f"at step {e.step} rank {e.src} sent to rank {e.dst}, which is not its neighbour "
                f"(the neighbours of rank {e.src} are ranks {(e.src - 1) % n} and {(e.src + 1) % n})",
                expected="every message to (rank + 1) % N or (rank - 1) % N",
                got=f"rank {e.src} -> rank {e.dst}",
                hint=hint or "In a ring each rank only talks to the rank on its left and on its right.")
    return None


def off_ring(trace, case, algorithm, hub_text, rank):
    """A wrong result of a program whose messages also leave the ring: the
    messages are the cause, so their failure comes first (None if none leaves)."""
    failure = ring_neighbours(trace, case, algorithm, hub_text)
    if failure is not None:
        failure.what += f"\nSo rank {rank}'s result is wrong too."
    return failure


def hub(trace, n):
    """The lowest rank that is an end (sender or receiver) of every message, or
    None. A program with such a rank routes everything through it."""
    return next((r for r in range(n) if all(r in (e.src, e.dst) for e in trace)), None)


def message_bytes(trace, case, limit, *, check, expected, hint, whole=None):
    """No message is bigger than ``limit`` bytes; a message of at least ``whole``
    bytes is called "the whole vector". Elements are float64, 8 bytes each."""
    for e in trace:
        if e.nbytes > limit:
            return Failure(
                case.label, check,
                f"at step {e.step} rank {e.src} sent rank {e.dst} {e.nbytes} bytes"
                + (" (the whole vector)" if whole is not None and e.nbytes >= whole else ""),
                expected=expected, got=f"{e.nbytes // 8} elements", hint=hint)
    return None


def one_chunk_per_message(trace, case, length):
    """No message is bigger than one chunk of np.array_split(x, N) for a float64
    vector of ``length`` elements: the check of ring AllReduce and ReduceScatter."""
    n = case.world_size
    max_chunk = -(-length // n) * 8
    return message_bytes(
        trace, case, max_chunk, check="one chunk per message", whole=length * 8,
        expected=f"at most one chunk: ceil({length}/{n}) = {max_chunk // 8} elements, {max_chunk} bytes",
        hint="Split the vector into world_size chunks (np.array_split) and send one chunk "
             "per step; sending whole vectors costs N times the bandwidth.")


def steps(count):
    """"1 step", "3 steps": a step count for a report."""
    return f"{count} step{'' if count == 1 else 's'}"


def exact_steps(trace, case, want, *, check, expected, hint):
    """The trace takes exactly ``want`` steps. ``hint`` is not shown for a trace
    without messages (nothing to loop over)."""
    if trace.steps != want:
        sent = [sum(e.src == r for e in trace) for r in range(case.world_size)]
        if trace.steps > want and sent == [want] * case.world_size:
            # The loop count is right; the steps are not: sends wait for receives.
            hint = (f"Your loop is right ({want} messages from every rank), but in some steps a "
                    f"rank receives before it sends (ranks taking turns, a recv before the "
                    f"send), so each round takes two steps. In a ring step every rank sends "
                    f"and receives at once: comm.sendrecv, or isend, then recv, then wait.")
        return Failure(case.label, check, f"the program took {steps(trace.steps)}",
                       expected=expected, got=steps(trace.steps),
                       hint=hint if trace.steps != 0 else None)
    return None


def steps_before_failure(failure, want, takes, hint):
    """Say that a run which raised was short of steps: "Also: the program took 2
    steps before failing; a ring AllGather takes N-1 = 3." Only when the error
    came after the rank's communication (it had reached the last step of the run
    and received every message sent to it), since then the loop count is the
    likely cause. ``takes`` says what the algorithm takes ("a ring AllGather takes
    N-1 = 3"); ``hint`` goes before the failure's own. Returns ``failure``."""
    err = failure.error
    trace = getattr(err, "trace", None)
    if (isinstance(err, RankError) and not isinstance(err.exc, CommError) and trace is not None
            and 0 < trace.steps < want and err.step == trace.steps
            and not any(e.dst == err.rank for e in trace.unreceived)):
        failure.what += f"\nAlso: the program took {steps(trace.steps)} before failing; {takes}."
        failure.hint = f"{hint} {failure.hint}" if failure.hint else hint
    return failure


def one_send_one_recv_per_step(trace, case, steps, hint=("In every step all ranks pass one chunk to the "
                                                         "same side at once; no rank may sit out or send twice.")):
    """In each of steps 1..``steps`` every rank sends exactly one message and receives exactly one."""
    n = case.world_size
    for step in range(1, steps + 1):
        evs = trace.at_step(step)
        senders = [e.src for e in evs]
        receivers = [e.dst for e in evs]
        for r in range(n):
            s, g = senders.count(r), receivers.count(r)
            if s != 1 or g != 1:
                return Failure(case.label, "every rank sends one and receives one message per step",
                               f"at step {step} rank {r} sent {s} and received {g} message(s)",
                               expected="1 sent and 1 received, at every step, on every rank",
                               got=f"step {step}: " + ", ".join(f"{e.src}->{e.dst}" for e in evs),
                               hint=hint)
    return None


def ratio(got, want):
    """got / want for a report, with as many digits as it takes not to read as a whole
    number when it is not one: "1.03", "1.0004", never "1" for 1.02.

    >>> ratio(5040, 4896), ratio(9792, 4896)
    ('1.03', '2')
    """
    r = got / max(want, 1)
    for digits in range(2, 8):
        text = f"{r:.{digits}g}"
        if got == want or float(text) != round(r):
            return text
    return f"{r:.8g}"


def total_bytes(trace, case, want, *, expected, hint):
    """The trace moves exactly ``want`` bytes in total."""
    if trace.total_bytes != want:
        return Failure(case.label, "bandwidth-optimal bytes",
                       f"the program moved {trace.total_bytes} bytes in total",
                       expected=expected, got=f"{trace.total_bytes} bytes", hint=hint)
    return None


# -- what messages carry ------------------------------------------------------------

def _ranks(rs):
    rs = list(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


# -- what a program run in the grader's process must leave alone ---------------------

# In the self-check every rank runs in the grader's own process, so a program that
# assigns to numpy's names (np.array_split = ...) changes what the grader computes
# with; so does one that replaces a builtin or one of ringlab's functions. These are
# watched, with every ringlab module and the attributes of ringlab's classes.
WATCHED = ("numpy", "numpy.linalg", "numpy.random", "builtins", "math", "copy", "functools")


def module_state():
    """The functions, classes and modules bound in the watched modules (and in
    ringlab's classes) now: {(owner, its name, attribute): value}."""
    state = {}
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType) or not (
                name in WATCHED or name == "ringlab" or name.startswith("ringlab.")):
            continue
        for attr, value in list(vars(mod).items()):
            if _code(value):
                state[mod, name, attr] = value
            if (isinstance(value, type) and name.startswith("ringlab")
                    and value.__module__ == name):
                for a, v in list(vars(value).items()):
                    if _code(v):
                        state[value, f"{name}.{value.__qualname__}", a] = v
    return state


def _code(value):
    return callable(value) or isinstance(value, (types.ModuleType, property, staticmethod,
                                                 classmethod))


def patched_modules(state, case):
    """A Failure naming what the program replaced (or deleted) among ``state``'s
    names since it was taken, or None. Puts every one of them back first, so
    that the grader, and the next case, run with the real ones."""
    missing, changed = object(), []
    for (owner, name, attr), value in state.items():
        now = vars(owner).get(attr, missing)
        if now is not value:
            changed.append((f"{name}.{attr}", now is missing))
            setattr(owner, attr, value)
    if not changed:
        return None
    names = ", ".join(n for n, _ in changed[:3]) + (f" and {len(changed) - 3} more"
                                                    if len(changed) > 3 else "")
    return Failure(case.label if case is not None else "",
                   "the program leaves numpy, Python and ringlab as they are",
                   f"the program replaced {names} while it ran (put back now): the grader runs "
                   f"in the same process, and would read the program's results with the "
                   f"replaced function",
                   expected="numpy, the builtins and ringlab as the program found them",
                   got="; ".join(f"{n} {'deleted' if gone else 'assigned to'}"
                                 for n, gone in changed[:3]),
                   hint="Write a helper of your own (def split(x, n): ...) and call it; do not "
                        "assign to numpy's, Python's or ringlab's names.")


def check_crashed(case, exc):
    """The Failure for a check that raised on what a program's run produced: a grade,
    never a traceback of the grader."""
    where = traceback.extract_tb(exc.__traceback__)[-1:]
    line = f" (in {where[0].name}, {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno})" \
        if where else ""
    return Failure(case.label, "the grader can read the program's run",
                   f"checking this case raised {type(exc).__name__}: {exc}{line}: the program "
                   f"returned or sent something of a kind no check expects",
                   expected="results and messages the checks can read: plain float64 numpy "
                            "arrays, numpy and ringlab unchanged",
                   got=f"{type(exc).__name__}: {exc}",
                   hint="Return plain numpy arrays and send arrays unchanged. If your program "
                        "does only that, the grader is wrong: report it with the Reproduce "
                        "line below.")
