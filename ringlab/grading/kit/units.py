"""FSDP units, as ZeRO-3's and HSDP's graders hand them to a program and check
what it leaves: ``ShardedModel`` (``ringlab.zero.units.UnitShards``: the data of
``ringlab.zero.ShardedModel`` without its communication, which is the exercise),
the state after a step, the order of a rank's AllGathers and ReduceScatters, and
its measured memory.
"""

import numpy as np

from . import sharded as C
from .measured import SLACK, resident_loaded, resident_marks, resident_peak
from .report import Failure
from ...zero.units import UnitShards

# Peak bound: this many full units (parameters, gradient, a collective's buffers),
# plus the activations, plus slack for Python's own objects. Right programs peak
# at 4-7 units in the measured case (12 similar units); one holding every unit at
# once, at 14 or more. What a rank keeps: at most 4 units (the accounting of
# messages and works moves a unit or two between steps), against 12 for a full copy.
PEAK_UNITS, KEEP_UNITS = 8, 4


# The data-only units the exercises get (their communication is the exercise), under
# the name the exercises use: ``ShardedModel(model, rank, world_size)``.
ShardedModel = UnitShards


def state(model, opt, shards, t, r, stage="ZeRO-3", share="1/N"):
    """A problem if the units, their shards or ``opt`` are not as a ZeRO-3 step
    (``stage``, updating its ``share`` of the model) leaves them after step t."""
    check = f"the state you were handed stays {stage}'s"
    for u, shard in zip(model.units, shards):
        held = [k for k in u.shapes
                if u.layer.params.get(k) is not None or u.layer.grads.get(k) is not None]
        if held:
            return C.report_problem(
                "every unit is resharded after the step",
                f"after step {t + 1}, rank {r}'s unit {u.name} still holds its full "
                f"{', '.join(held)} (layer.params / layer.grads are not None)",
                "Free a unit's full parameters and gradient once its backward and "
                f"ReduceScatter are done: set them back to None, as after forward. A {stage} "
                f"rank keeps only its shards between steps.")
        if u.shard is not shard:
            return C.report_problem(
                check, f"after step {t + 1}, rank {r}'s unit {u.name}: unit.shard is no "
                       f"longer the array it was given",
                "Update the shard in place (opt.step does); never rebind unit.shard.")
        if getattr(opt, "params", {}).get(u.name) is not shard:
            return C.report_problem(
                check, f"after step {t + 1}, rank {r}'s optimizer no longer updates unit "
                       f"{u.name}'s shard",
                "Keep opt as it is: Adam over model.shards(), stepped with "
                "model.grad_shards().")
        st = opt.state.get(u.name, {})
        if not all(isinstance(st.get(k), np.ndarray) and st[k].shape == shard.shape
                   for k in ("m", "v")) or st.get("step") != t + 1:
            return C.report_problem(
                check, f"rank {r}'s optimizer was stepped {st.get('step')} time(s) in "
                       f"{t + 1} training step(s) (unit {u.name})",
                "Call opt.step(model.grad_shards()) once per step, after every unit's "
                f"ReduceScatter: Adam on your {share} only.")
        if np.shape(u.grad_shard) != shard.shape:
            return C.report_problem(
                check, f"rank {r}'s unit {u.name}: grad_shard has shape "
                       f"{np.shape(u.grad_shard)}, not {shard.shape}",
                "Write the ReduceScatter's result into unit.grad_shard[...].")
    return None


def explain_freed(failure):
    """A failed run's hint where a unit's parameters were None: freed and not
    gathered again (else ``explain_padding``'s)."""
    text = f"{failure.what}\n{failure.got or ''}"
    # x @ None: numpy reads None as a 0-d array ("does not have enough dimensions (has 0").
    if "NoneType" in text or "does not have enough dimensions (has 0," in text:
        failure.hint = ("A unit's layer has no parameters (None) unless you gathered them. "
                        "Freed after forward, they must be gathered again before the unit's "
                        "backward (AllGather, then layer.params.update(unit.views(full))), "
                        "with fresh gradient views (layer.grads.update(unit.views(zeros))).")
        return failure
    return C.explain_padding(failure)


def unit_order(case, r, t, mine, names, sizes):
    """A Failure unless rank r's calls ``mine`` of step t, ``[("AG" or "RS", unit
    index)]`` in order, are FSDP's: AllGathers of units 0..L-1 then L-1..0,
    ReduceScatters of L-1..0, each after its unit's second AllGather."""
    units = len(names)
    want_ag = list(range(units)) + list(reversed(range(units)))
    want_rs = list(reversed(range(units)))
    ag = [u for k, u in mine if k == "AG"]
    rs = [u for k, u in mine if k == "RS"]
    if ag == want_ag and rs == want_rs and not [
            u for u in range(units)
            if [i for i, c in enumerate(mine) if c == ("AG", u)][-1] > mine.index(("RS", u))]:
        return None
    return Failure(
        case.label, "an AllGather before each unit's forward and backward",
        C.ran(t, r, mine, lambda u: f"unit {names[u]}"),
        expected=f"AllGathers of units {_order(names, want_ag)}, ReduceScatters "
                 f"of units {_order(names, want_rs)}, each unit's after its "
                 f"second AllGather (messages of {sizes} bytes)",
        hint="Forward: gather unit 0, run it, free it, then unit 1, ...; "
             "backward, last unit first: gather, backward, ReduceScatter its "
             "gradient, free.")


def _order(names, idx):
    return ", ".join(names[i] for i in idx)


def memory(result, case, backend, stage="ZeRO-3", shards=None, share="1/N"):
    """Measured memory within the bounds of a rank holding ``share`` (1/``shards``,
    default 1/N) of the model and a few units in full (``stage``: the words)."""
    info, n = case.info, shards or case.world_size
    if not info["measure"] or backend != "sim":
        return None
    unit = 8 * max(info["pads"])
    full = 8 * sum(info["pads"])
    peak_bound = PEAK_UNITS * unit + info["activations"] + SLACK // 2
    for r, out in enumerate(result.outputs):
        for t, (peak, kept) in enumerate(out[2]):
            if kept > KEEP_UNITS * unit + SLACK // 2:
                return Failure(
                    case.label, "memory: what a rank keeps between steps",
                    f"after step {t + 1} rank {r} still holds {int(kept)} bytes more than "
                    f"before it: {kept / full:.2f} copies of the whole model",
                    expected=f"nothing: a {stage} rank keeps only its shards and its "
                             f"{share} of Adam's moments, all handed to it",
                    got=f"{int(kept)} bytes kept",
                    hint="Drop every full parameter vector and gradient when its unit is "
                         "done; keep no caches between steps.")
            if peak > peak_bound:
                return Failure(
                    case.label, f"memory: peak per rank within {stage}'s bound",
                    f"during step {t + 1} rank {r} held up to {int(peak)} bytes more than "
                    f"when the step began: {peak / full:.2f} copies of the whole model "
                    f"({full} bytes), {peak / unit:.1f} times its largest unit",
                    expected=f"at most {peak_bound} bytes: {PEAK_UNITS} full units of "
                             f"{unit} bytes (parameters, gradient, the collectives' "
                             f"buffers) + {info['activations']} bytes of activations + "
                             f"slack",
                    got=f"{int(peak)} bytes",
                    hint="Hold at most one or two units in full at a time: gather a unit "
                         "just before it runs and free it (drop every reference) right "
                         "after, in forward and in backward.")
    if result.resident is None:
        return None
    # A ZeRO-3 rank holds its 1/N of the parameters, of the gradients and of
    # Adam's m and v (4 Psi / N), and a few units in full: never the whole model.
    state = 4 * full // n
    return (resident_loaded(result, case)
            or resident_marks(result, case, C.STEPS, state, KEEP_UNITS * unit, stage)
            or resident_peak(result, case, state + peak_bound,
                             f"{stage}'s shards and Adam's moments ({state / 2**20:.1f} MiB), "
                             f"{PEAK_UNITS} units in full and the activations"))
