"""Grader for exercise ``zero1_step``: one ZeRO-1 step (optimizer states sharded).

Signature: ``zero1_step(comm, model, opt, x, y, batch_size, loss_fn=mse)``.
``model``: this rank's full replica (``mlp_model``); ``opt``: ``Adam`` over
this rank's shard of the master weights, ``opt.params["param"]``, a copy of
shard r of the flat parameters zero-padded at the end to a multiple of N (as
``ringlab.zero.sharding.master_shard`` makes it); ``(x, y)``: this rank's
part of a global batch of ``batch_size`` rows. The step: backward, a
ReduceScatter of the flat padded gradient weighted by len(x) / batch_size,
``opt.step`` on the shard, an AllGather of the updated shards into the model.

The grader trains hidden models (parameter counts that do not divide by N)
for 3 steps with world sizes 1 to 8 and unequal batch shards, and checks:

1. it runs (no exception, deadlock or hang; a shape error names the padding);
2. the state it was handed: ``opt`` still updates the same shard array, of
   shard size, and was stepped once per step (Adam's m and v stay shard-sized);
3. the parameters are identical on every rank and equal data-parallel Adam
   (float64, |diff| <= 1e-10); a wrong result is diagnosed (no AllGather,
   equal weights, summed, averaged twice, padding at the front);
4. the messages (recorded payloads): each is either a ring partial sum of the
   ranks' weighted gradients or one rank's shard of the UPDATED parameters,
   one padded chunk (Ψ_padded / N values) each;
5. the collectives they add up to, per step and rank: one ReduceScatter
   (N-1 messages) then one AllGather (N-1 messages), nothing else: no
   AllReduce, no AllGather of gradients;
6. real memory, in the cases that say so (see ``kit/measured.py``: measured with
   tracemalloc per rank, never reported by the program): after each step the
   rank keeps no more than it was handed (a full master copy or full Adam
   moments kept between steps fail), and its peak during the step stays
   within a few flat copies of the model.

Why measure and not trust ``comm.alloc``: a program that keeps the whole
optimizer state on every rank would simply not report it. Why also check the
objects: they say *which* object is wrong, and work for every case.
"""

import numpy as np

from ..kit.report import Failure

from ..kit import sharded as C
from ..kit.master_shard import memory, same_on_every_rank, train_on_master
from ...nn import FlatBuffer

NAME = "zero1_step"
# Part 1's collectives are the tools; ringlab.zero holds the answers.
USES = ("collectives", "sync_sgd_step")
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True


def cases(rng):
    # (world size, global batch, hidden width, memory measured)
    for n, batch, measure in ((4, 10, False), (3, 7, False), (1, 5, False), (2, 5, False),
                              (8, 12, False), (5, 9, False), (4, 9, True)):
        if measure:
            # Large enough (11 MB) that a full copy kept is plain in the process's
            # resident memory too, which ringlab grade reads from outside (kit/measured.py).
            sizes = [400, 1000, 1000, int(rng.integers(5, 8))]
        else:
            sizes = [int(rng.integers(3, 6)), int(rng.integers(n + 4, n + 9)),
                     int(rng.integers(2, 4))]
        names = C.names_of(sizes)
        yield C.make_case(rng, n, batch, sizes, [names], measure=measure,
                          label=", memory measured" if measure else "")


def _train(comm, steps, spec, learner):
    """What every rank runs: a replica, Adam over its master shard, the learner's steps."""
    return train_on_master(comm, steps, spec, learner, "ZeRO-1", _master)


def _master(model, comm, spec):
    n = comm.world_size
    return FlatBuffer(model.named_parameters(), pad_to=n).shard(comm.rank, n), {}


def check(program, case, backend="sim"):
    result, failure = C.trained(_train, program, case, backend, C.explain_padding)
    return (failure or same_on_every_rank(result, case)
            or C.compare_params(case, result.outputs[0][1], "rank 0")
            or master_shards(result, case) or collectives(result, case)
            or memory(result, case, backend))


def master_shards(result, case):
    n, want = case.world_size, case.info["ref"][-1]["after"][0]
    size = len(want) // n
    for r, out in enumerate(result.outputs):
        if not np.allclose(out[2], want[r * size:(r + 1) * size], rtol=0, atol=C.TOL):
            return Failure(case.label, "parameters equal data-parallel Adam",
                           f"rank {r}'s master shard (opt.params['param']) is not shard {r} "
                           f"of the updated parameters",
                           hint="opt.step(gradient_shard) updates the master shard in place; "
                                "the AllGather then sends it.")
    return None


def collectives(result, case):
    n = case.world_size
    expected = {(k, 0, t): 1 for t in range(C.STEPS) for k in ("RS", "AG")}
    what = (lambda k, s: "the weighted gradients" if k == "RS"
            else "updated parameter shards")
    labelled, failure = C.counted_messages(result, case, "after", expected, what)
    if labelled is None:
        return failure
    size = case.info["pads"][0] // n
    for r in range(n):
        order = [label for label, _, _ in C.calls_of(labelled.get(r, []), n)]
        want = [(k, 0, t) for t in range(C.STEPS) for k in ("RS", "AG")]
        if order != want:
            return Failure(case.label, "collectives: which, how many, what size",
                           f"rank {r} ran {_names(order)}",
                           expected=f"per step a ReduceScatter then an AllGather, each "
                                    f"N-1 = {n - 1} messages of {size * 8} bytes: "
                                    f"{_names(want)}",
                           hint="Gradients first (ReduceScatter), then Adam on your shard, "
                                "then the parameters (AllGather).")
    return None


def _names(calls):
    return ", ".join(f"{'ReduceScatter' if k == 'RS' else 'AllGather'}(step {t + 1})"
                     for k, _, t in calls)
