"""Grader for exercise ``zero3_step``: ZeRO-3 / FSDP, parameters sharded too.

Signature: ``zero3_step(comm, model, opt, x, y, batch_size, loss_fn=mse)``.
``model`` is a ``ShardedModel`` (below; the data of ``ringlab.zero.ShardedModel``
without its communication, which is the exercise): ``model.units``, one per
``Linear`` (with the GeLU after it). A unit's parameters are one flat vector
of ``unit.padded`` numbers (``unit.numel`` real ones, then zeros to a multiple
of N) of which the rank keeps ``unit.shard``; between uses its layer's
``params`` and ``grads`` are None. ``unit.views(flat)`` gives the layer's
named arrays as views into a full flat vector. ``opt`` is ``Adam`` over
``model.shards()``; ``opt.step(model.grad_shards())`` updates them. The step:
forward unit by unit (AllGather, run, free), the loss, backward last unit
first (AllGather again, backward into a fresh full flat gradient, weight it by
len(x) / batch_size, ReduceScatter it into ``unit.grad_shard``, free), Adam.

Checks, on hidden models, world sizes 1 to 8, unequal shards:

1. it runs (a None parameter in backward is diagnosed: freed before its
   backward and not gathered again);
2. the state after every step: every unit's layer holds no parameters or
   gradients (resharded), ``unit.shard`` is still the array ``opt`` updates,
   of shard size, stepped once per step;
3. the ranks' shards, put together, equal data-parallel Adam (1e-10),
   mistakes diagnosed (equal weights, summed, averaged twice, padding at the
   front);
4. every message is one rank's shard of a unit's current parameters (an
   AllGather's) or a ring partial sum of a unit's weighted gradients (a
   ReduceScatter's); one padded chunk each;
5. per step and rank: two AllGathers per unit, in the order 0..L-1 (forward)
   then L-1..0 (backward), one ReduceScatter per unit, L-1..0, each after the
   unit's second AllGather; no AllReduce. Prefetching (the next unit's
   AllGather started on the communication stream) keeps this order;
6. real memory, measured per rank (``memory.py``): nothing kept between
   steps, and a peak of at most a few units' full parameters and gradients
   (plus activations): a program that gathers every unit up front, or keeps
   them, fails here even with the right collectives in the right order.
"""

import numpy as np

from ..kit.report import Failure
from ..kit.driver import callable_learner
from ..kit.widths import measured_widths, mlp_widths, units_of
from . import _common as C
from ._measured import measured_steps, resident_loaded, resident_marks, resident_peak
from .zero1_step import SLACK
from ...nn import Adam, FlatBuffer, mlp_model

NAME = "zero3_step"
USES = ("collectives", "sync_sgd_step")
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
# Peak bound: this many full units (parameters, gradient, a collective's buffers),
# plus the activations, plus slack for Python's own objects. Right programs peak
# at 4-7 units in the measured case (12 similar units); one holding every unit at
# once, at 14 or more. What a rank keeps: at most 4 units (the accounting of
# messages and works moves a unit or two between steps), against 12 for a full copy.
PEAK_UNITS, KEEP_UNITS = 8, 4


class Unit:
    """One FSDP unit: ``layers`` (a Linear, then the GeLU after it), ``layer``
    (the Linear), ``numel``/``padded`` its parameters without/with padding,
    ``shard`` this rank's 1/N of them, ``grad_shard`` its 1/N of the summed
    gradient (fill it), ``shapes``/``sizes``/``offsets`` the layout of the flat
    vector. ``views(flat)``: ``{name: view}`` into a full flat vector."""

    def __init__(self, name, layers, rank, world_size):
        self.name, self.layers = name, layers
        flat = FlatBuffer(layers[0].params, pad_to=world_size)
        self.shapes, self.offsets, self.sizes = flat.shapes, flat.offsets, flat.sizes
        self.numel, self.padded = flat.numel, len(flat)
        self.shard = flat.shard(rank, world_size).copy()
        self.grad_shard = np.zeros_like(self.shard)
        for k in self.shapes:
            self.layer.params[k] = self.layer.grads[k] = None

    @property
    def layer(self):
        return self.layers[0]

    def views(self, flat):
        return {k: flat[o:o + self.sizes[k]].reshape(self.shapes[k])
                for k, o in self.offsets.items()}


class ShardedModel:
    """``units``, and ``shards()`` / ``grad_shards()``: ``{unit name: array}``."""

    def __init__(self, model, rank, world_size):
        groups = []
        for i, layer in enumerate(model.layers):
            if layer.params:
                groups.append((str(i), [layer]))
            else:
                groups[-1][1].append(layer)
        self.units = [Unit(name, layers, rank, world_size) for name, layers in groups]

    def shards(self):
        return {u.name: u.shard for u in self.units}

    def grad_shards(self):
        return {u.name: u.grad_shard for u in self.units}


def cases(rng):
    # (world size, global batch, layers, memory measured)
    for n, batch, layers, measure in ((4, 10, 3, False), (2, 5, 2, False), (3, 7, 4, False),
                                      (1, 4, 2, False), (8, 12, 2, False), (5, 9, 3, False),
                                      (4, 9, 25, True)):
        sizes = measured_widths(rng, layers) if measure else mlp_widths(rng, n, layers)
        units = units_of(sizes)
        case = C.make_case(rng, n, batch, sizes, units, measure=measure,
                           label=f", {len(units)} units" + (", memory measured" if measure
                                                            else ""))
        # What forward keeps for backward: each Linear's and GeLU's input.
        rows = -(-batch // n)
        case.info["activations"] = 8 * rows * 2 * sum(sizes)
        yield case


def _train(comm, steps, spec, learner):
    learner = callable_learner(learner)
    n, r = comm.world_size, comm.rank
    model = ShardedModel(mlp_model(spec["sizes"], np.random.default_rng(spec["seed"])), r, n)
    opt = Adam(model.shards(), spec["lr"])
    shards = [u.shard for u in model.units]
    bad, memory = measured_steps(
        comm, spec, 8 * sum(u.padded for u in model.units), steps,
        lambda c, x, y, batch: learner(c, model, opt, x, y, batch),
        lambda t: state(model, opt, shards, t, r))
    if bad:
        return bad
    return [np.zeros(0), np.concatenate(shards).copy(), memory]


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


def check(program, case, backend="sim"):
    result, failure = C.trained(_train, program, case, backend, explain_error)
    return (failure or params(result, case)
            or collectives(result, case) or memory(result, case, backend))


def explain_error(failure):
    from .zero1_step import explain_error as shapes
    text = f"{failure.what}\n{failure.got or ''}"
    # x @ None: numpy reads None as a 0-d array ("does not have enough dimensions (has 0").
    if "NoneType" in text or "does not have enough dimensions (has 0," in text:
        failure.hint = ("A unit's layer has no parameters (None) unless you gathered them. "
                        "Freed after forward, they must be gathered again before the unit's "
                        "backward (AllGather, then layer.params.update(unit.views(full))), "
                        "with fresh gradient views (layer.grads.update(unit.views(zeros))).")
        return failure
    return shapes(failure)


def params(result, case):
    n, info = case.world_size, case.info
    pads = info["pads"]
    per_rank = [np.split(out[1], np.cumsum([p // n for p in pads])[:-1])
                for out in result.outputs]
    units = [np.concatenate([per_rank[r][u] for r in range(n)]) for u in range(len(pads))]
    got = C.forward_vector(C.unflat(units, info["segments"], C.shapes_of(info["sizes"])),
                           info["sizes"])
    return C.compare_params(case, got, "the ranks' shards put together")


def collectives(result, case):
    n, info = case.world_size, case.info
    units = len(info["segments"])
    names = [s[0].split(".")[0] for s in info["segments"]]
    expected = {}
    for t in range(C.STEPS):
        for u in range(units):
            expected["AG", u, t], expected["RS", u, t] = 2, 1

    def what(k, u):
        return (f"unit {names[u]}'s weighted gradients" if k == "RS"
                else f"unit {names[u]}'s parameter shards")
    labelled, failure = C.counted_messages(result, case, "before", expected, what)
    # A unit's parameters sent N-1 times, not 2(N-1): gathered once. Only
    # count_failure's reports say "message(s) of unit", not the one-rank or label ones.
    if failure and "1 ring AllGather" not in failure.what and \
            f"{n - 1} message(s) of unit" in failure.what and "parameter" in failure.what:
        failure.what += (": gathered once per step, for forward only, and kept for "
                         "backward")
        failure.hint = ("ZeRO-3 (FSDP's FULL_SHARD) frees each unit's parameters after "
                        "its forward and gathers them again just before its backward: "
                        "two AllGathers and one ReduceScatter per unit per step, 3Ψ.")
    if labelled is None:
        return failure
    sizes = C.message_sizes(info, n)
    for r, t, mine in C.calls_by_step(labelled, n):
        failure = unit_order(case, r, t, mine, names, sizes)
        if failure:
            return failure
    return None


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
