"""Grader for exercise ``sync_sgd_step``: one step of synchronous data-parallel SGD.

Signature: ``sync_sgd_step(comm, model, opt, x, y, batch_size) -> loss``.
``model`` is this rank's replica (a ``ringlab.nn`` ``mlp_model``, equal on
every rank), ``opt`` its optimizer (``SGD``, or ``Adam`` in the last cases:
call ``opt.step(grads)`` with the averaged gradients by name); ``(x, y)`` is
this rank's shard of a global batch of ``batch_size`` samples (shards differ
in size when the batch does not divide by the world size). The loss is
``ringlab.nn.mse``. The step computes the shard's gradient, averages it over
the ranks with one ring AllReduce of all gradients (weighted so that the
result is the whole batch's mean gradient), and calls ``opt.step``. The
return value is not graded.

The grader trains a hidden model for 3 steps on hidden data, world sizes 1 to
8, batches that do and do not divide by the world size, and checks:

1. it runs: no exception, deadlock or unreceived message (a rank that skips
   the sync leaves its neighbours waiting); the messages carry float64 (float32
   rounds the gradients on the way);
2. the parameters are identical on every rank after training (exactly);
3. they equal single-process training on the whole batches to |diff| <= 1e-10
   (the AllReduce only changes the order of the additions). A wrong result is
   diagnosed: no communication, averaged twice, summed and not averaged,
   shards weighted equally instead of by size;
4. the trace: exactly one AllReduce of the gradients per step, i.e.
   2(P-1) steps and 2(P-1) x (gradient bytes) bytes per training step, with
   messages of ring chunks between ring neighbours. Nothing else travels (no
   data, no extra collective, no per-tensor AllReduces);
5. what the messages carry (recorded payloads): every message is a chunk of
   the ranks' weighted gradients summed over the right ranks, so zeros sent
   for show while the gradients travel through shared Python memory fail.
"""

import functools

import numpy as np

from ..kit import checks
from ..kit.report import Case, Failure
from ..kit.running import run_case
from . import _payloads as payloads
from ..kit.driver import callable_learner
from ...data_parallel.sync_sgd import local_gradient
from ...nn import SGD, Adam, flatten, mlp_model

NAME = "sync_sgd_step"
# Part 1's collectives are the tools here: `ringlab grade` lets submissions use them
# (ring_allreduce), but not ringlab.data_parallel, which holds the reference answers.
USES = ("collectives",)
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
STEPS, LR, TOL = 3, 0.1, 1e-10


def cases(rng):
    # (world size, global batch): divisible first, then the uneven shards.
    # Adam in the last cases: with it, averaging the parameters after local
    # steps is no longer the same as averaging the gradients.
    for p, batch, opt in ((4, 8, "sgd"), (2, 6, "sgd"), (3, 7, "sgd"), (4, 10, "sgd"),
                          (8, 12, "sgd"), (2, 5, "sgd"), (5, 8, "sgd"), (1, 6, "sgd"),
                          (4, 9, "adam"), (8, 16, "adam")):
        sizes = [int(rng.integers(3, 6)), int(rng.integers(4, 9)), 2]
        seed = int(rng.integers(2**31))
        batches = [(rng.standard_normal((batch, sizes[0])), rng.standard_normal((batch, 2)))
                   for _ in range(STEPS)]
        shards = [[(np.array_split(x, p)[r], np.array_split(y, p)[r], batch) for x, y in batches]
                  for r in range(p)]
        yield Case(p, shards, f"world_size={p}, global batch={batch}, model {sizes}, {opt}",
                   args=(sizes, seed, opt),
                   info=dict(sizes=sizes, seed=seed, batches=batches, opt=opt))


def _optimizer(kind, model):
    params = model.named_parameters()
    return SGD(params, LR) if kind == "sgd" else Adam(params, lr=LR / 10)


def _train(comm, shards, sizes, seed, opt, learner):
    """What every rank runs: a replica, its optimizer, and the learner's step on each shard."""
    learner = callable_learner(learner)
    model = mlp_model(sizes, np.random.default_rng(seed))
    opt = _optimizer(opt, model)
    for x, y, batch in shards:
        learner(comm, model, opt, x, y, batch)
    return flatten(model.named_parameters()).data


def reference(case, combine=None, operands=None):
    """Single-process SGD on the whole batches; or, with ``combine``, SGD whose
    gradient is ``combine(local mean gradients, shard sizes)`` (the mistakes).
    ``operands``: a list to append, per step, what each rank AllReduces on the
    right trajectory: its mean gradient times n_r / B."""
    info, p = case.info, case.world_size
    model = mlp_model(info["sizes"], np.random.default_rng(info["seed"]))
    opt = _optimizer(info["opt"], model)

    def gradient(x, y):                     # the mean gradient over these samples, flat
        local_gradient(model, x, y)
        return flatten(model.named_grads()).data

    for x, y in info["batches"]:
        shards = list(zip(np.array_split(x, p), np.array_split(y, p)))
        if operands is not None:
            operands.append([[gradient(xs, ys) * (len(xs) / len(x)) for xs, ys in shards]])
        g = (gradient(x, y) if combine is None else
             combine([(gradient(xs, ys), len(xs)) for xs, ys in shards], len(x), p))
        grads = flatten(model.named_grads())         # the parameters' names and shapes
        grads.data[...] = g
        opt.step(grads.views)
    return flatten(model.named_parameters()).data


# The usual mistakes, as gradients built from the local mean gradients g_r (n_r samples).
MISTAKES = {
    "averaged twice": (lambda gs, b, p: sum(n / b * g for g, n in gs) / p,
                       "The gradient is divided by P one time too many: weight by n_r / B "
                       "(or divide by P) once, before or after the AllReduce, not both."),
    "summed, not averaged": (lambda gs, b, p: sum(g for g, _ in gs),
                             "The AllReduce sums the ranks' gradients; divide by the number of "
                             "ranks (weight by n_r / B) so that the update is the batch's mean."),
    "equal weights for unequal shards": (
        lambda gs, b, p: sum(g for g, _ in gs) / p,
        "With shards of different sizes the mean of the ranks' means is not the batch's mean: "
        "weight your mean gradient by its share of the samples, len(x) / batch_size, "
        "then sum with the AllReduce."),
}


def check(program, case, backend="sim"):
    result, failure = run_case(functools.partial(_train, learner=program), case, backend)
    if failure:
        if "deadlock" in failure.check or "received" in failure.check:
            failure.hint = ("Every rank must join every AllReduce, every step: a rank that skips "
                            "the sync (an `if` on the rank, an early return) leaves its ring "
                            "neighbours waiting. " + (failure.hint or ""))
        return failure
    # float32 on the way leaves the parameters off by about 1e-9: name that, not the values.
    failure = checks.narrow_floats(
        result, case, check="the gradients travel as float64", carried="the gradients",
        hint="AllReduce the float64 gradients as they are: no astype on the way (the "
             "grader compares the parameters with single-process SGD to 1e-10).")
    if failure:
        return failure
    first = result.outputs[0]
    for r, out in enumerate(result.outputs[1:], 1):
        if not np.array_equal(out, first):
            return Failure(
                case.label, "parameters are identical on every rank",
                f"after {STEPS} steps rank {r}'s parameters differ from rank 0's "
                f"(largest difference {np.abs(out - first).max():.3g})"
                + (": the ranks sent no message at all, so each trained on its own shard"
                   if len(result.trace) == 0 else ""),
                expected="every replica the same after every step",
                hint="Average the gradients with an AllReduce before opt.step, on every rank, "
                     "every step: then every rank applies the same update.")
    want = reference(case)
    if not np.allclose(first, want, rtol=0, atol=TOL):
        failure = Failure(case.label, "parameters equal single-process SGD on the whole batch",
                          f"after {STEPS} steps the parameters differ from single-process SGD "
                          f"by up to {np.abs(first - want).max():.3g} (tolerance {TOL:g})",
                          expected="the same parameters as SGD on the whole batch on one process",
                          hint="The update must use the mean gradient over all batch_size samples.")
        for name, (combine, hint) in MISTAKES.items():
            if np.allclose(first, reference(case, combine), rtol=0, atol=TOL):
                failure.got, failure.hint = f"exactly what you get if the gradient is {name}", hint
                break
        return failure
    return check_trace(result.trace, case) or check_payloads(result, case)


def check_trace(trace, case):
    """One ring AllReduce of the flat gradient per training step, and nothing else."""
    p = case.world_size
    n_params = _count(case)
    grad_bytes = n_params * 8
    want_steps, want_bytes = STEPS * 2 * (p - 1), STEPS * 2 * (p - 1) * grad_bytes
    if trace.steps == want_steps and trace.total_bytes == want_bytes:
        return _ring_messages(trace, case, n_params)
    return _wrong_shape(trace, case, want_steps, want_bytes, grad_bytes)


def check_payloads(result, case):
    """Every message is a partial sum of the ranks' weighted gradients (scaled
    by 1, P or B: weights n_r / B, or divided by P or B after the AllReduce)."""
    operands = []
    reference(case, operands=operands)
    p, batch = case.world_size, len(case.info["batches"][0][0])
    return payloads.check_allreduces(
        result, case, payloads.messages_by_rank(result.trace, p, stream=0), operands,
        scales=(1.0, float(p), float(batch)), what="the ranks' gradients",
        hint="AllReduce the real gradients: each rank's own gradient of its shard, weighted, "
             "as float64. The grader reads every message; zeros, stand-ins or data shared "
             "outside the messages do not pass.")


def _wrong_shape(trace, case, want_steps, want_bytes, grad_bytes):
    p = case.world_size
    got = f"{trace.steps} steps and {trace.total_bytes} bytes for {STEPS} training steps"
    expected = (f"{want_steps} steps and {want_bytes} bytes: per training step one ring AllReduce "
                f"of the {grad_bytes}-byte gradient, 2(P-1) = {2 * (p - 1)} steps and "
                f"2(P-1) x {grad_bytes} bytes")
    calls = [s.name for s in trace.spans if s.rank == 0 and "/" not in s.path]
    named = f" (rank 0 called: {', '.join(dict.fromkeys(calls))})" if calls else ""
    if trace.total_bytes == want_bytes and trace.steps > want_steps:
        what = (f"the gradients took {trace.steps // max(want_steps, 1)}x the steps of one "
                f"AllReduce per step, with the right bytes: one AllReduce per tensor?")
        hint = ("Flatten the gradients into one buffer (ringlab.nn.flatten(model.named_grads())) "
                "and AllReduce it once: every AllReduce pays 2(P-1) latencies.")
    elif (trace.total_bytes % want_bytes == 0 and trace.total_bytes > want_bytes
          and calls.count("ring_allreduce") == trace.total_bytes // want_bytes * STEPS):
        k = trace.total_bytes // want_bytes
        what = f"{k}x the bytes and {k} AllReduces of the whole gradient per step"
        hint = ("Sync once per step. With micro-batches, skip the sync (DDP's no_sync) on all "
                "but the last micro-step: backward adds the micro-batches' gradients up "
                "locally, and one AllReduce at the end syncs the sum.")
    else:
        extra = trace.total_bytes - want_bytes
        more = "more" if extra > 0 else "fewer"
        what = (f"{checks.ratio(trace.total_bytes, want_bytes)}x the bytes of one AllReduce of the "
                f"gradients per step ({abs(extra)} bytes {more}, {abs(extra) // STEPS} per "
                f"training step){named}: something besides the gradients travels, or not all "
                f"of them")
        if trace.steps != want_steps:
            what += (f"; and {trace.steps} steps where one AllReduce per training step "
                     f"takes {want_steps}")
        hint = ("Send the gradients, all of them, once per step, and nothing else: no samples, "
                "no losses, no second collective.")
    return Failure(case.label, "one AllReduce of the gradients per step", what,
                   expected=expected, got=got, hint=hint)


def _count(case):
    sizes = case.info["sizes"]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


RING_HINT = "Use ringlab.collectives.ring_allreduce (or your own ring)."


def _ring_messages(trace, case, n_params):
    p = case.world_size
    chunk = -(-n_params // p) * 8
    for e in trace:
        if p > 2 and e.dst not in ((e.src + 1) % p, (e.src - 1) % p):
            return Failure(case.label, "the AllReduce is a ring",
                           f"at step {e.step} rank {e.src} sent to rank {e.dst}, not a neighbour",
                           hint=RING_HINT)
        if e.nbytes > chunk:
            return Failure(case.label, "the AllReduce is a ring",
                           f"at step {e.step} rank {e.src} sent {e.nbytes} bytes, more than one "
                           f"chunk ({chunk} bytes) of the gradient", hint=RING_HINT)
    return None
