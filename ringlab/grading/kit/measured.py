"""Real memory, measured per rank, for the ZeRO and HSDP graders: the step loop that
measures (``measured_steps``) and, under ``ringlab grade``, each rank process's
resident memory read from outside. The per-rank ledger and the probe that
wraps a rank's ``comm`` are ``ringlab.real_memory``'s, shared with the
ring attention grader.
"""

import numpy as np

from ...backends.isolated import mark
from ...real_memory import Ledger, MemoryProbe, tampered
from .report import Failure
from .sharded import report_problem

# Bytes of slack on the tracemalloc bounds of a step (Python's own objects); ZeRO-3's
# and HSDP's bounds, in units, take half of it.
SLACK = 32 * 1024


def ledger_for(comm, spec, model_bytes):
    """The ledger of a measured case (None otherwise). Under ``ringlab grade`` (a
    process per rank, where nothing else frees memory during the rank's code) a
    fall of more than the model's size + 64 KiB below the step's start is
    tampering; in one process the garbage collector may free another rank's
    objects during this rank's code, so there is no floor."""
    if not spec["measure"]:
        return None
    isolated = getattr(comm._world, "isolated", False)
    return Ledger(floor=-(model_bytes + 64 * 1024) if isolated else None)


def measured_steps(comm, spec, model_bytes, steps, take_step, after_step, make=None):
    """The grader's step loop: ``take_step(comm_or_probe, x, y, batch)`` for each
    of ``steps``, with memory measured where the case asks; ``after_step(t)``
    checks the state left after step t. ``make(comm_or_probe)``, if given, is
    what ``take_step`` gets instead, made once before the first step (a
    ``DeviceMesh`` over the probe: its groups are probed too). Returns (a
    problem or None, the per-step (start, peak) pairs as an array of shape
    (steps, 2))."""
    ledger = ledger_for(comm, spec, model_bytes)
    probe = MemoryProbe(comm, ledger) if ledger else comm
    probe = make(probe) if make else probe
    memory = []
    if ledger:
        mark(comm, 0)         # isolated: the resident memory before the first step
    for t, (x, y, batch) in enumerate(steps):
        if ledger:
            ledger.step_begin()
        take_step(probe, x, y, batch)
        if ledger:
            memory.append(ledger.step_end())
            mark(comm, t + 1)
            if tampered(ledger):
                return report_problem("memory is measured", tampered(ledger)), None
        bad = after_step(t)
        if bad:
            return bad, None
    return None, np.array(memory, dtype=np.float64).reshape(-1, 2)


# ---------------------------------------------------------------------------- isolated
# Under ``ringlab grade`` each rank is a process of its own, and everything in
# it, the measurement above included, is the program's to change (it can reset
# the ledger, or fill an array made when it was loaded, before tracing began).
# So there the grader also reads each rank process's resident memory from
# outside (``RunResult.resident``): before the program was loaded, and at every
# call it made. Coarser than tracemalloc (pages, Python's own heap), so the
# checks are on a case large enough that what is at stake, a full copy of the
# model, is many times the noise.
RESIDENT_SLACK = 3 * 2**20        # pages of Python's own heap, wire buffers, the allocator


def resident_loaded(result, case):
    """A Failure if loading the program (unpickling it in the rank's process)
    made more than the slack of data: arrays made then, before the program ran,
    are memory it holds all along."""
    for r, res in enumerate(result.resident or ()):
        if res and None not in (res.get("before"), res.get("loaded")):
            made = res["loaded"] - res["before"]
            if made > RESIDENT_SLACK:
                return Failure(case.label, "memory: the rank's process, read from outside",
                               f"loading the program in rank {r}'s process made "
                               f"{made / 2**20:.1f} MiB of data, before it ran",
                               expected=f"nothing to speak of (at most "
                                        f"{RESIDENT_SLACK // 2**20} MiB)",
                               got=f"{made / 2**20:.1f} MiB",
                               hint="Make arrays inside your function, not at the top of the "
                                    "notebook: a global array your function uses is loaded "
                                    "with it, and it counts.")
    return None


def resident_peak(result, case, bound, words):
    """A Failure if a rank process's resident memory grew, at any of its calls,
    by more than ``bound`` bytes above what it held before the program was
    loaded (loading counts: arrays made then are the program's), else None."""
    for r, res in enumerate(result.resident or ()):
        if not res or res.get("before") is None or res.get("peak") is None:
            continue
        grown = res["peak"] - res["before"]
        if grown > bound + RESIDENT_SLACK:
            full = 8 * sum(case.info["pads"])
            return Failure(case.label, "memory: the rank's process, read from outside",
                           f"rank {r}'s process grew by {grown / 2**20:.1f} MiB above what it "
                           f"held before the program was loaded: "
                           f"{grown / full:.2f} copies of the whole model "
                           f"({full / 2**20:.1f} MiB)",
                           expected=f"at most {bound / 2**20:.1f} MiB (+ "
                                    f"{RESIDENT_SLACK // 2**20} MiB): {words}",
                           got=f"{grown / 2**20:.1f} MiB",
                           hint="The grader reads each rank's memory from outside its process "
                                "under `ringlab grade`; arrays made when the program is loaded "
                                "count too. Hold only what the stage allows.")
    return None


def resident_marks(result, case, steps, setup, keep, stage):
    """Failures of what a rank process held at the driver's marks (``mark``):
    before the first step, at most the ``setup`` bytes the driver made for it
    (the model, the shards, Adam's moments) above what it held once loaded; after
    each step, at most ``keep`` bytes more than before the first. Marks missing
    or out of order mean the driver was changed. None if all is well."""
    full = 8 * sum(case.info["pads"])
    for r, res in enumerate(result.resident or ()):
        marks = (res or {}).get("marks")
        if marks is None:
            continue
        if [t for t, _ in marks] != list(range(steps + 1)) or None in [m for _, m in marks]:
            return Failure(case.label, "memory: the rank's process, read from outside",
                           f"rank {r} did not reach the grader's {steps + 1} measuring points "
                           f"(one before each step, one after the last) in order",
                           hint="The grader's driver marks where it reads the memory; a "
                                "program may not change the driver.")
        base = marks[0][1] - res["loaded"]
        if base > setup + RESIDENT_SLACK:
            return Failure(case.label, "memory: the rank's process, read from outside",
                           f"before its first step rank {r}'s process held "
                           f"{base / 2**20:.1f} MiB above what it held once the program was "
                           f"loaded, more than the {setup / 2**20:.1f} MiB the grader made "
                           f"for it (the model and the {stage} state it hands over)",
                           expected=f"at most {setup / 2**20:.1f} MiB (+ "
                                    f"{RESIDENT_SLACK // 2**20} MiB)",
                           got=f"{base / 2**20:.1f} MiB")
        for t, (_, mark_t) in enumerate(marks[1:], start=1):
            grown = mark_t - marks[0][1]
            if grown > keep + RESIDENT_SLACK:
                return Failure(case.label, "memory: the rank's process, read from outside",
                               f"after step {t} rank {r}'s process held {grown / 2**20:.1f} MiB "
                               f"more than before the first step: {grown / full:.2f} copies of "
                               f"the whole model kept between steps",
                               expected=f"at most {keep / 2**20:.1f} MiB (+ "
                                        f"{RESIDENT_SLACK // 2**20} MiB): a {stage} rank keeps "
                                        f"between steps only what it was handed",
                               got=f"{grown / 2**20:.1f} MiB",
                               hint="Keep nothing full-size between steps (no full master copy, "
                                    "no full Adam moments, no cached buffers); the grader reads "
                                    "each rank's memory from outside its process.")
    return None
