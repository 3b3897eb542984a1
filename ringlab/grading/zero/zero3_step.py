"""Grader for exercise ``zero3_step``: ZeRO-3 / FSDP, parameters sharded too.

Signature: ``zero3_step(comm, model, opt, x, y, batch_size, loss_fn=mse)``.
``model`` is a ``ShardedModel`` (``kit/units.py``: the data of ``ringlab.zero.ShardedModel``
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
6. real memory, measured per rank (``kit/measured.py``): nothing kept between
   steps, and a peak of at most a few units' full parameters and gradients
   (plus activations): a program that gathers every unit up front, or keeps
   them, fails here even with the right collectives in the right order.
"""

import numpy as np

from ..kit.driver import callable_learner
from ..kit.widths import measured_widths, mlp_widths, units_of
from ..kit import sharded as C
from ..kit.measured import measured_steps
from ..kit.units import ShardedModel, explain_freed, memory, state, unit_order
from ...nn import Adam, mlp_model

NAME = "zero3_step"
USES = ("collectives", "sync_sgd_step")
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True


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


def check(program, case, backend="sim"):
    result, failure = C.trained(_train, program, case, backend, explain_freed)
    return (failure or params(result, case)
            or collectives(result, case) or memory(result, case, backend))


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


