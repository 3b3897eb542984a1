"""Checks shared by the graders of ZeRO-1 and ZeRO-2, whose ranks hold a full replica
and a flat master shard (``FlatBuffer(...).shard(r, n)``) under ``Adam``: the state a
rank was handed, the parameters identical on every rank, and memory measured in flat
copies of the padded model.

    >>> _state("ZeRO-2")
    "the state you were handed stays ZeRO-2's"
"""

import numpy as np

from . import sharded as C
from .driver import callable_learner
from .measured import SLACK, measured_steps, resident_loaded, resident_marks
from .report import Failure
from ...nn import Adam, mlp_model


def _state(stage):
    return f"the state you were handed stays {stage}'s"


def train_on_master(comm, steps, spec, learner, stage, master_of):
    """What every rank of ZeRO-1 and ZeRO-2 runs: a replica, Adam over its flat master
    shard, the learner's steps. ``master_of(model, comm, spec)``: the rank's master
    shard and the keyword arguments the learner gets besides ``(comm, model, opt, x,
    y, batch_size)``."""
    learner = callable_learner(learner)
    r = comm.rank
    model = mlp_model(spec["sizes"], np.random.default_rng(spec["seed"]))
    master, kwargs = master_of(model, comm, spec)
    master = master.copy()
    opt = Adam(master, spec["lr"])
    shapes = {k: v.shape for k, v in model.named_parameters().items()}
    bad, memory_ = measured_steps(
        comm, spec, 8 * sum(v.size for v in model.named_parameters().values()), steps,
        lambda c, x, y, batch: learner(c, model, opt, x, y, batch, **kwargs),
        lambda t: shard_state(opt, master, t, r, stage) or model_state(model, shapes, r, stage))
    if bad:
        return bad
    flat = np.concatenate([np.ravel(p) for p in model.named_parameters().values()])
    return [np.zeros(0), flat, master.copy(), memory_]


def shard_state(opt, master, t, r, stage="ZeRO-1"):
    """The handed optimizer still owns exactly this rank's shard, stepped t + 1 times."""
    params = getattr(opt, "params", None)
    if not (isinstance(params, dict) and params.get("param") is master):
        return C.report_problem(
            _state(stage), f"after step {t + 1}, rank {r}'s optimizer no longer updates the "
                           f"master shard it was given (opt.params['param'] was replaced)",
            "Keep opt as it is: it owns your shard of the master weights. Update it with "
            "opt.step(gradient_shard); a bigger array in its place (a view into a full "
            "copy) keeps the whole master on every rank.")
    state = opt.state.get("param", {}) if isinstance(getattr(opt, "state", None), dict) else {}
    for k in ("m", "v"):
        a = state.get(k)
        if not (isinstance(a, np.ndarray) and a.shape == master.shape):
            return C.report_problem(
                _state(stage), f"after step {t + 1}, rank {r}'s Adam {k} has shape "
                               f"{getattr(a, 'shape', None)}, not the shard's {master.shape}",
                "Adam's moments cover your shard only: call opt.step with the gradient "
                "shard the ReduceScatter gave you.")
    if master.shape != (master.size,) or state.get("step") != t + 1:
        return C.report_problem(
            _state(stage), f"rank {r}'s optimizer was stepped {state.get('step')} time(s) "
                           f"in {t + 1} training step(s)",
            "Call opt.step(gradient_shard) exactly once per step. The optimizer you are "
            "handed holds your shard's master weights and Adam's m and v: Adam on the "
            "whole model on every rank is data parallelism, not ZeRO.")
    return None


def model_state(model, shapes, r, stage="ZeRO-1"):
    """The model's arrays are still float64 arrays of their shapes."""
    params = model.named_parameters()
    for k, shape in shapes.items():
        p = params.get(k)
        if not (type(p) is np.ndarray and p.shape == shape and p.dtype == np.float64):
            return C.report_problem(
                _state(stage), f"rank {r}'s parameter {k!r} is {type(p).__name__} "
                               f"{getattr(p, 'shape', '')}, not a float64 array of shape {shape}",
                "Copy the gathered parameters into the model's arrays in place "
                "(p[...] = ...), in named_parameters() order.")
    return None


def same_on_every_rank(result, case):
    outs = result.outputs
    for r in range(1, case.world_size):
        if not np.array_equal(outs[r][1], outs[0][1]):
            n = case.world_size
            half = len(result.trace) == C.STEPS * n * (n - 1) * len(case.info["pads"])
            return Failure(
                case.label, "parameters are identical on every rank",
                f"after {C.STEPS} steps rank {r}'s parameters differ from rank 0's "
                f"(largest difference {np.abs(outs[r][1] - outs[0][1]).max():.3g})"
                + (f": each rank sent only N-1 = {n - 1} message(s) per step and shard, a "
                   f"ReduceScatter's, and no AllGather" if half else ""),
                expected=f"every rank's model holds all {n} updated shards",
                hint="After opt.step, AllGather the updated shards (ring_allgather(comm, "
                     "master)) and copy the result into the model on every rank.")
    return None


# Bounds, in flat copies of the padded model (8 bytes x Ψ_padded): what a rank may
# hold at its peak above what it held when the step began, and what it may keep.
PEAK_COPIES, KEEP_COPIES = 6.0, 0.25


def memory(result, case, backend, peak_copies=PEAK_COPIES, keep_copies=KEEP_COPIES,
           stage="ZeRO-1", keeps="the model's own parameters and gradients and the "
                                 "optimizer's shard"):
    info, n = case.info, case.world_size
    if not info["measure"] or backend != "sim":
        return None
    full = 8 * sum(info["pads"])
    for r, out in enumerate(result.outputs):
        for t, (peak, kept) in enumerate(out[3]):
            if kept > keep_copies * full + SLACK:
                return Failure(
                    case.label, "memory: what a rank keeps between steps",
                    f"after step {t + 1} rank {r} still holds {int(kept)} bytes more than "
                    f"before it: {kept / full:.2f} flat copies of the model "
                    f"({full} bytes each)",
                    expected=f"at most {keep_copies} copies (+{SLACK // 1024} KiB): a "
                             f"{stage} rank holds {keeps}, all handed to it",
                    got=f"{int(kept)} bytes kept",
                    hint="Keep nothing full-size between steps: no full master copy, no "
                         "full Adam moments, no cached flat buffers. Your 1/N of the "
                         "optimizer state is opt's; everything else is rebuilt each step.")
            if peak > peak_copies * full + SLACK + info.get("activations", 0):
                return Failure(
                    case.label, "memory: peak per rank within the stage's bound",
                    f"during step {t + 1} rank {r} held up to {int(peak)} bytes more than "
                    f"when the step began: {peak / full:.2f} flat copies of the model",
                    expected=f"at most {peak_copies} copies (+ slack)",
                    got=f"{int(peak)} bytes", hint=None)
    if result.resident is None:
        return None
    # What the driver makes for a rank: the model's parameters and gradients
    # (8 bytes each), the master shard and Adam's m and v (3 shards).
    setup = 16 * info["numel"] + 3 * full // n
    return (resident_loaded(result, case)
            or resident_marks(result, case, C.STEPS, setup, keep_copies * full, stage))
