"""Grader for exercise ``zero2_step``: ZeRO-2, gradients sharded bucket by bucket.

Signature: ``zero2_step(comm, model, opt, x, y, batch_size, loss_fn=mse, *,
layout, flops_per_second=None)``. ``layout`` is a ``BucketLayout`` (below: a
``ringlab.zero.BucketShards`` over the grader's buckets): DDP's
buckets in backward order, each zero-padded to a multiple of N and cut into
N equal pieces, rank r owning piece r of every bucket. ``opt`` is ``Adam``
over this rank's pieces, one after another (``layout.master_shard``).
``flops_per_second``: pass it to ``loss_and_backward`` so backward takes
simulated time. The step: backward; as each bucket fills, weight it by
len(x) / batch_size and start its ReduceScatter on the communication stream
(``comm.start``); after backward, wait, ``opt.step`` on the concatenated
pieces, and AllGather each bucket's updated piece into the model.

Checks, on hidden models, caps, world sizes 1 to 8 and unequal shards, on a
network where a message is short next to a layer's backward:

1. it runs; 2. the state it was handed (as in ``zero1_step``); 3. parameters
identical on every rank and equal to data-parallel Adam (1e-10), mistakes
diagnosed; 4. every message is a ring partial sum of a bucket's weighted
gradients or one rank's piece of a bucket's updated parameters; 5. per step
and rank: one ReduceScatter per bucket, in bucket order, then one AllGather
per bucket, nothing else (no AllReduce); 6. the ReduceScatters run on the
communication stream, each bucket without a layer-0 gradient starts before
backward ends, and backward never waits for the network; 7. real memory,
measured per rank (see ``kit/measured.py`` and ``zero1_step``): nothing full-size
kept between steps, a bounded peak.

What memory can and cannot tell apart here: the rank's model keeps its own
full ``.grads`` (they stand in for autograd's short-lived gradients, as in
``ringlab.zero.zero2``), and the buckets live until their ReduceScatters are
waited for, after backward. So the measured peak of a ZeRO-2 step is not
below a ZeRO-1 step's on these small models; what separates the stages is
the trace (one ReduceScatter per bucket, started during backward), checked
in 5 and 6. Memory catches what a rank keeps: a full master or full Adam
moments.

What the overlap check (6) trusts: the backward's ``comm.compute`` events
come from the program (through ``loss_and_backward``). A program that runs
the whole backward at once and then emits made-up "backward" events around
its ReduceScatters fakes an overlap the grader cannot tell from a real one;
the values, messages and memory it checks are still its own measurements.
"""

import numpy as np

from ..kit.checks import first_wait
from ..kit.report import Failure
from ..kit.widths import mlp_widths
from ..kit import sharded as C
from ..kit.master_shard import memory, same_on_every_rank, train_on_master
from ...cost.alpha_beta import AlphaBeta
from ...zero.zero2 import BucketShards

NAME = "zero2_step"
# loss_and_backward (ringlab.data_parallel.buckets) is the tool for a timed backward.
USES = ("collectives", "sync_sgd_step", "bucketed_grad_sync")
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
NETWORK = (1e-6, 1e-9)
FLOPS = 1e6          # a layer's backward: ~0.1-1 ms; a ring message: ~1-2 us


class BucketLayout(BucketShards):
    """``ringlab.zero.BucketShards`` over the grader's own buckets ``names``
    (lists of parameter names, in backward order)."""

    def __init__(self, params, world_size, names):
        self._lay_out(params, world_size, [list(b) for b in names])


def buckets_of(sizes, cap):
    """DDP's rule (``assign_buckets``): reverse order, close a bucket at ``cap`` bytes."""
    names, shapes = C.names_of(sizes), C.shapes_of(sizes)
    buckets, current, size = [], [], 0
    for name in reversed(names):
        current.append(name)
        size += 8 * int(np.prod(shapes[name]))
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def cases(rng):
    # (world size, global batch, layers, cap as a fraction of the model, memory measured)
    for n, batch, layers, frac, measure in ((4, 10, 3, 0.3, False), (2, 5, 2, 0.5, False),
                                            (3, 7, 4, 0.25, False), (1, 4, 2, 0.5, False),
                                            (8, 12, 3, 0.4, False), (5, 9, 3, 1.5, False),
                                            (4, 9, 3, 0.3, True)):
        if measure:
            # Large enough (11 MB) that a full copy kept is plain in the process's
            # resident memory too, which ringlab grade reads from outside (kit/measured.py).
            sizes = [400, 1000, 1000, int(rng.integers(5, 8))]
        else:
            sizes = mlp_widths(rng, n, layers)
        total = 8 * sum(int(np.prod(s)) for s in C.shapes_of(sizes).values())
        cap = max(8, int(total * frac))
        buckets = buckets_of(sizes, cap)
        yield C.make_case(rng, n, batch, sizes, buckets, measure=measure, cap=cap,
                          label=f", cap {cap} bytes: {len(buckets)} bucket(s)"
                                + (", memory measured" if measure else ""))


def _train(comm, steps, spec, learner):
    return train_on_master(comm, steps, spec, learner, "ZeRO-2", _master)


def _master(model, comm, spec):
    layout = BucketLayout(model.named_parameters(), comm.world_size, spec["segments"])
    return (layout.master_shard(model.named_parameters(), comm.rank),
            dict(layout=layout, flops_per_second=FLOPS))


def check(program, case, backend="sim"):
    kw = {"network": AlphaBeta(*NETWORK)} if backend == "sim" else {}
    result, failure = C.trained(_train, program, case, backend, C.explain_padding, **kw)
    return (failure or same_on_every_rank(result, case)
            or C.compare_params(case, result.outputs[0][1], "rank 0")
            or master_pieces(result, case) or collectives(result, case)
            or (overlap(result, case) if backend == "sim" else None)
            or memory(result, case, backend, stage="ZeRO-2"))


def master_pieces(result, case):
    n, want = case.world_size, case.info["ref"][-1]["after"]
    for r, out in enumerate(result.outputs):
        mine = np.concatenate([v[r * (len(v) // n):(r + 1) * (len(v) // n)] for v in want])
        if not np.allclose(out[2], mine, rtol=0, atol=C.TOL):
            return Failure(case.label, "parameters equal data-parallel Adam",
                           f"rank {r}'s master shard (opt.params['param']) is not its pieces "
                           f"of the updated buckets",
                           hint="opt.step(np.concatenate(my pieces)) updates the master in "
                                "place; the AllGathers then send its pieces.")
    return None


def collectives(result, case):
    n, info = case.world_size, case.info
    nb = len(info["segments"])
    expected = {(k, b, t): 1 for t in range(C.STEPS) for b in range(nb) for k in ("RS", "AG")}

    def what(k, b):
        return (f"bucket {b}'s weighted gradients" if k == "RS"
                else f"bucket {b}'s updated parameter pieces")
    labelled, failure = C.counted_messages(result, case, "after", expected, what)
    if labelled is None:
        return failure
    sizes = C.message_sizes(info, n)
    for r, t, mine in C.calls_by_step(labelled, n):
        rs = [b for k, b in mine if k == "RS"]
        first_ag = next((i for i, (k, _) in enumerate(mine) if k == "AG"), len(mine))
        if rs != list(range(nb)) or any(k == "RS" for k, _ in mine[first_ag:]):
            return Failure(
                case.label, "one ReduceScatter per bucket, in order, then the AllGathers",
                C.ran(t, r, mine, lambda b: f"bucket {b}"),
                expected=f"ReduceScatters of buckets 0..{nb - 1} in that order (messages "
                         f"of {sizes} bytes), all before the first AllGather",
                hint="Start each bucket's ReduceScatter as soon as its last gradient is "
                     "in it, in bucket order (layout.names: the order backward fills "
                     "them), the same on every rank; AllGather after opt.step.")
    for r in range(n):
        for label, e in labelled.get(r, []):
            if label[0] == "RS" and e.stream == 0:
                return Failure(
                    case.label, "ReduceScatters run on the communication stream",
                    f"rank {r} sent a ReduceScatter message of bucket {label[1]} (step "
                    f"{e.step}) from the program itself, not from a work (comm.start)",
                    expected="every ReduceScatter message on stream 1",
                    hint="work = comm.start(ring_reduce_scatter, bucket_data) returns at "
                         "once; backward goes on while it runs. work.wait() after backward.")
    return None


def overlap(result, case):
    n, info = case.world_size, case.info
    if n == 1:
        return None
    first_layer = {b for b, names in enumerate(info["segments"])
                   if any(k.startswith("0.") for k in names)}
    linear = len(info["sizes"]) - 1
    labelled, _ = C.label_messages(result, case, "after")
    back = {}
    for r in range(n):
        back[r] = [c for c in result.trace.computes
                   if c.rank == r and c.label == "backward" and not c.stream]
        if len(back[r]) != C.STEPS * linear:
            return Failure(
                case.label, "ReduceScatters overlap backward",
                f"rank {r} recorded {len(back[r])} backward compute event(s) in {C.STEPS} "
                f"steps",
                expected=f"{linear} per step, one per Linear layer",
                hint="Run backward with ringlab.data_parallel.buckets.loss_and_backward(comm, "
                     "model, x, y, flops_per_second, loss_fn): it takes simulated time.")
    for t in range(C.STEPS):
        # Shards differ in size, so ranks finish backward at different times, and a
        # bucket's ring waits for the slowest rank: compare with the last one's end.
        end = max(c.end for r in range(n) for c in back[r][t * linear:(t + 1) * linear])
        for r in range(n):
            mine = back[r][t * linear:(t + 1) * linear]
            if gap := first_wait(mine):
                before, after = gap
                return Failure(
                    case.label, "backward never waits for the network",
                    f"training step {t + 1}, rank {r}: layer {after.get('layer')}'s "
                    f"backward started {(after.start - before.end) * 1e6:.2f} us after "
                    f"layer {before.get('layer')}'s ended",
                    expected="each layer's backward starts when the one before ends",
                    hint="Do not wait for a ReduceScatter inside the backward loop: "
                         "collect the works and wait after it.")
            starts = {}
            for label, e in labelled.get(r, []):
                if label[0] == "RS" and label[2] == t:
                    starts.setdefault(label[1], e.start)
            for b, start in sorted(starts.items()):
                if b not in first_layer and start is not None and start >= end - 1e-12:
                    return Failure(
                        case.label, "ReduceScatters overlap backward",
                        f"training step {t + 1}, rank {r}: bucket {b}'s ReduceScatter "
                        f"started at {start * 1e6:.2f} us, when backward had ended on "
                        f"every rank ({end * 1e6:.2f} us)",
                        expected="every bucket without a layer-0 gradient starts its "
                                 "ReduceScatter while backward still runs",
                        hint="Start each bucket's ReduceScatter inside the backward loop, "
                             "as soon as its last gradient has arrived.")
    return None
