"""Which ranks' contributions ended up where: exact diagnosis of wrong sums.

A reduction program only adds and copies, so its output is a linear
combination of the inputs with whole-number coefficients. Feed rank r the
vector ``x_r[i] = 16**r + i * 16**N`` and every output element reads back,
digit by digit in base 16, how often each rank was counted, and (from the
high part) which element position it came from. Exact in float64 for N <= 8
and short vectors.
"""

import numpy as np

from .running import active_runner

ZEROS_HINT = ("Start from a copy of your own x (np.array(x, copy=True)), not from np.zeros: "
              "a buffer of zeros holds no rank's contribution.")
BASE = 16
MAX_WORLD = 8


def probe_inputs(world_size, length):
    """The inputs that make contributions readable; one float64 vector per rank."""
    i = np.arange(length, dtype=np.float64)
    return [BASE ** r + i * float(BASE ** world_size) for r in range(world_size)]


def probe_run(program, world_size, length):
    """Run ``program`` on the probe inputs, recording payloads. Returns the
    ``RunResult``, or None when the world is too big for the probe or the run fails."""
    from .checks import module_state, patched_modules
    if world_size > MAX_WORLD:
        return None
    state = module_state()
    try:
        # Recording payloads: a receiver that adds into what it received gets its
        # own copy, and cannot change the record of the message.
        result = active_runner()(program, probe_inputs(world_size, length),
                                 record_payloads=True, timeout=10.0)
    except Exception:   # noqa: BLE001 - it ran on random data, so a probe failure just means no detail
        result = None
    # numpy or ringlab changed by the program: put back, and no detail from this run
    return None if patched_modules(state, None) is not None else result


def decode(values, world_size):
    """For each value: (coefficients per rank, source position), or None where the
    value is not a whole-number combination of the probe inputs."""
    out = []
    scale = BASE ** world_size
    for v in np.asarray(values, dtype=np.float64).ravel():
        if not np.isfinite(v) or v < 0 or v != np.floor(v) or v >= 2.0 ** 53:
            out.append(None)
            continue
        v = int(v)
        low, high = v % scale, v // scale
        coeffs = tuple((low // BASE ** r) % BASE for r in range(world_size))
        total = sum(coeffs)
        pos = high // total if total and high % total == 0 else None
        out.append((coeffs, pos))
    return out


def describe(coeffs, expected):
    """'rank 2 missing; rank 0 counted twice' for coefficients vs expected."""
    parts = []
    missing = [r for r, (c, e) in enumerate(zip(coeffs, expected)) if c < e]
    extra = [(r, c) for r, (c, e) in enumerate(zip(coeffs, expected)) if c > e]
    if len(missing) == 1:
        parts.append(f"rank {missing[0]}'s contribution is missing")
    elif missing:
        parts.append(f"the contributions of {_ranks(missing, possessive=False)} are missing")
    for r, c in extra:
        parts.append(f"rank {r}'s contribution is counted {_times(c)}" if expected[r]
                     else f"rank {r}'s contribution is included {_times(c)} but should not be")
    return "; ".join(parts)


def holders(coeffs):
    """'ranks 0, 1 and 3' for the ranks with a non-zero coefficient; 'no rank' for
    none (a zero: an array that was never filled)."""
    ranks = [r for r, c in enumerate(coeffs) if c]
    return _ranks(ranks, possessive=False) if ranks else "no rank (the value is 0)"


def _ranks(rs, possessive=True):
    s = "'s" if possessive else ""
    if len(rs) == 1:
        return f"rank {rs[0]}{s}"
    return "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}" + ("'" if possessive else "")


def _times(c):
    return {1: "once", 2: "twice"}.get(c, f"{c} times")


def garbled(event, decoded, wrong_slot_hint):
    """(note, hint) if a message's decoded payload is not a sum of inputs, or mixes
    elements from different places of the vector (a chunk added into the wrong
    slot); else None. Shared by the reduction graders."""
    e = event
    if any(d is None for d in decoded):
        return f"step {e.step}: rank {e.src} sent rank {e.dst} values that are not sums of inputs", None
    if any(not any(d[0]) for d in decoded):     # no probe input is zero, nor any sum of them
        return (f"step {e.step}: rank {e.src} sent rank {e.dst} zeros, which hold no rank's "
                f"contribution (an array that was never filled?)"), ZEROS_HINT
    positions = [d[1] for d in decoded]
    if None in positions or positions != list(range(positions[0], positions[0] + len(positions))):
        return (f"step {e.step}: rank {e.src} sent rank {e.dst} a chunk that mixes elements from "
                f"different places of the vector: a received chunk was added into the wrong slot",
                wrong_slot_hint)
    return None
