"""Grader for exercise ``hsdp_step``: hybrid sharding (HSDP, FSDP2 on a 2-D mesh).

Signature: ``hsdp_step(comm, mesh, model, opt, x, y, batch_size)``. The grader
lays the N = R x S ranks out as ``mesh = DeviceMesh(comm, (R, S),
("replicate", "shard"))`` (row-major: rank r is replica r // S, shard r % S).
``model`` is ZeRO-3's grader's ``ShardedModel`` (``kit/units.py``: the data
of ``ringlab.zero.ShardedModel``, no communication) built for the shard group:
each unit keeps shard ``r % S`` of its flat parameters, padded at the end to
``unit.padded``, a multiple of S. ``opt`` is ``Adam`` over
``model.shards()``. ``(x, y)``: this rank's rows of a global batch of
``batch_size`` (data parallel over all N ranks). The step: ZeRO-3's inside
the shard group (AllGather, forward, free; AllGather, backward, weight by
len(x) / batch_size, ReduceScatter, free), and after each unit's
ReduceScatter an AllReduce of ``unit.grad_shard`` in the replicate group; then
``opt.step(model.grad_shards())``.

Checks, on meshes (2,3), (2,2), (3,2), (1,4), (4,1), (2,4), (1,1), hidden
models, unequal batch shards, 3 steps, and one (2,2) case of 25 units whose
memory is measured:

1. it runs (a None parameter, a chunk of the wrong size, diagnosed);
2. the state after every step: ZeRO-3's (units resharded, ``unit.shard`` the
   array ``opt`` updates, stepped once per step);
3. every message stays in a shard group (a row) or a replicate group (a
   column): none between ranks that share neither (a collective over all
   ranks); then every replica's shards, put together, equal data-parallel
   Adam on the full batch (1e-10), computed here (wrong batch scalings and a
   missing replica AllReduce named); then every message carries real data
   (``_hsdp.py``): parameter shards or partial sums of gradients in the
   shard group, pieces of the sender's gradient shard summed over whole rows
   in the replicate group (a piece of the whole gradient there is named: the
   groups swapped, or the AllReduce first);
4. bytes per group and step equal the closed form (``hsdp_bytes``): per rank
   2 (S-1)/S Psi of AllGathers and (S-1)/S Psi of ReduceScatter in the shard
   group, 2 (R-1)/R Psi/S of AllReduce in the replicate group (Psi the
   padded parameters, 8 bytes each; per rank up to the rounding of
   np.array_split, all ranks together exactly 2 (R-1) Psi);
5. each AllGather delivers to every rank each other shard of its row once;
6. the order in the shard group: ZeRO-3's (``kit/units.py``'s ``unit_order``);
7. memory, measured as ZeRO-3's grader measures it (``kit/measured.py``):
   a few units in full at a time, nothing kept between steps.

Part 1's collectives are tools (``USES``); ``ringlab.frontier.hsdp`` and
``ringlab.zero`` (the answers) are not.
"""

import re

import numpy as np

from ..kit.driver import callable_learner
from ..kit.widths import measured_widths, mlp_widths, units_of
from ..kit.report import Failure
from ..kit import sharded as C
from ..kit import units as U
from ..kit.measured import measured_steps
from . import _hsdp
from ...frontier.hsdp import hsdp_bytes
from ...mesh import DeviceMesh
from ...nn import Adam, mlp_model

NAME = "hsdp_step"
USES = ("collectives", "sync_sgd_step")
# Every rank's result needs every rank's data (the causality check: see kit/causality.py).
DEPENDS_ON_ALL = True
AXES = ("replicate", "shard")
STAGE = "HSDP"
KIND = {"AG": "AllGather", "RS": "ReduceScatter", "AR": "AllReduce"}
# (R, S), global batch, layers; the first mesh has R, S and N apart, so that the
# batch scalings (1/R, 1/S, 1/N) give different parameters and are named.
MESHES = (((2, 3), 10, 3), ((2, 2), 7, 2), ((3, 2), 9, 3), ((1, 4), 10, 2), ((4, 1), 6, 2),
          ((2, 4), 13, 3), ((1, 1), 4, 2))


def causality_case(cases):
    """The smallest mesh with two replicas and two shards or more: both groups."""
    both = [c for c in cases if min(c.info["mesh"]) >= 2 and not c.info["measure"]]
    return min(both, key=lambda c: c.world_size, default=None)


def cases(rng):
    for (R, S), batch, layers in MESHES + (((2, 2), 9, 25),):
        n, measure = R * S, layers == 25
        # The measured case's widths are ZeRO-3's: a full copy is plain.
        sizes = measured_widths(rng, layers) if measure else mlp_widths(rng, n, layers)
        units = units_of(sizes)
        case = C.make_case(rng, n, batch, sizes, units, measure=measure, shards=S,
                           mesh=(R, S), label=f", mesh (replicate, shard) = ({R}, {S}), "
                           f"{len(units)} units" + (", memory measured" if measure else ""))
        case.info["activations"] = 8 * -(-batch // n) * 2 * sum(sizes)
        yield case


def _train(comm, steps, spec, learner):
    learner = callable_learner(learner)
    S = spec["mesh"][1]
    model = U.ShardedModel(mlp_model(spec["sizes"], np.random.default_rng(spec["seed"])),
                            comm.rank % S, S)
    opt = Adam(model.shards(), spec["lr"])
    shards = [u.shard for u in model.units]
    bad, memory = measured_steps(
        comm, spec, 8 * sum(u.padded for u in model.units), steps,
        lambda mesh, x, y, batch: learner(mesh.comm, mesh, model, opt, x, y, batch),
        lambda t: U.state(model, opt, shards, t, comm.rank, STAGE, "1/S"),
        make=lambda c: DeviceMesh(c, spec["mesh"], AXES))
    if bad:
        return bad
    return [np.zeros(0), np.concatenate(shards).copy(), memory]


def check(program, case, backend="sim"):
    result, failure = C.trained(_train, program, case, backend,
                                lambda failure: explain_error(failure, case))
    if failure:
        return failure
    # The groups first (a collective over all ranks may still give the right
    # numbers), then the numbers (after a wrong step, every later message
    # differs from the reference's), then what each message holds and the bytes.
    failure = _hsdp.stray(result, case) or params(result, case)
    if failure:
        return failure
    labelled, failure = _hsdp.label_all(result, case)
    return (failure or group_bytes(labelled, case) or _hsdp.every_shard_gathered(labelled, case)
            or order(labelled, case)
            or U.memory(result, case, backend, STAGE, case.info["mesh"][1], "1/S"))


def explain_error(failure, case):
    """ZeRO-3's diagnoses; a chunk of the wrong size names the group it came from."""
    text = f"{failure.what}\n{failure.got or ''}"
    found = re.search(r"from shape \((\d+),?\) into shape \((\d+),?\)", text)
    if not found or "NoneType" in text:
        return U.explain_freed(failure)
    (R, S), got = case.info["mesh"], int(found.group(1))
    groups = {R: "mesh.group('replicate') (R ranks)", R * S: "comm, all N ranks"}
    over = next((words for k, words in groups.items() if k != S and any(
        got in (p // k, -(-p // k)) for p in case.info["pads"])), None)
    failure.hint = ((f"The chunk has 1/{R if 'R ranks' in over else R * S} of a unit: a "
                     f"ReduceScatter over {over}. " if over else "")
                    + f"A unit's gradient is ReduceScattered in mesh.group('shard') (S = {S} "
                      f"ranks): its chunk is unit.grad_shard's size, unit.padded / S. Only "
                      f"then does that shard cross the replicas (an AllReduce in "
                      f"mesh.group('replicate')).")
    return failure


def _sent(labelled, case):
    """{(rank, step, kind): bytes sent} of the labelled messages."""
    sent = {}
    for r, msgs in labelled.items():
        for (kind, _, t), e in msgs:
            sent[r, t, kind] = sent.get((r, t, kind), 0) + e.nbytes
    return sent


def numels(info):
    shapes = C.shapes_of(info["sizes"])
    return [sum(int(np.prod(shapes[k])) for k in seg) for seg in info["segments"]]


def group_bytes(labelled, case):
    """Per rank and step, bytes of each collective against the closed form."""
    (R, S), pads = case.info["mesh"], case.info["pads"]
    closed = hsdp_bytes(numels(case.info), R, S)
    psi = 8 * sum(pads)
    # A ring AllReduce of a shard of L numbers over R ranks: each sends 2(R-1)
    # pieces of np.array_split(L, R), floor(L/R) or ceil(L/R) numbers each.
    lo = 8 * 2 * (R - 1) * sum(p // S // R for p in pads)
    hi = 8 * 2 * (R - 1) * sum(-(-(p // S) // R) for p in pads)
    want = {"AG": (2 * (S - 1) * psi // S,) * 2, "RS": ((S - 1) * psi // S,) * 2, "AR": (lo, hi)}
    sent = _sent(labelled, case)
    for t in range(C.STEPS):
        for r in range(R * S):
            for kind, (a, b) in want.items():
                got = sent.get((r, t, kind), 0)
                if not a <= got <= b:
                    return _bytes_failure(case, r, t, kind, got, (a, b), closed)
        total = sum(sent.get((r, t, "AR"), 0) for r in range(R * S))
        if total != closed["cross_node_total"]:
            return _bytes_failure(case, None, t, "AR", total,
                                  (closed["cross_node_total"],) * 2, closed)
    return None


FORMULA = {"AG": "2 (S-1)/S Psi x 8 bytes (two AllGathers per unit)",
           "RS": "(S-1)/S Psi x 8 bytes (one ReduceScatter per unit)",
           "AR": "2 (R-1)/R Psi/S x 8 bytes (one AllReduce of each unit's shard)"}


def _bytes_failure(case, r, t, kind, got, want, closed):
    (R, S), (a, b) = case.info["mesh"], want
    group = "replicate" if kind == "AR" else "shard"
    who = (f"all {R * S} ranks together" if r is None else _hsdp.where(r, S))
    what = (f"training step {t + 1}: {who} sent {got} bytes of {KIND[kind]} messages in "
            f"{'the' if r is None else 'its'} {group} group{'s' if r is None else ''}")
    hint = ("HSDP per unit: AllGather in mesh.group('shard') before forward and again before "
            "backward, ReduceScatter of the weighted gradient there, then AllReduce of "
            "unit.grad_shard in mesh.group('replicate').")
    if kind == "AR" and got == 0:
        what += (": no AllReduce across the replicas, so each replica steps with its own "
                 "rows' gradient only (the replica AllReduce is missing)")
        hint = ("After each unit's ReduceScatter, ring_allreduce(mesh.group('replicate'), "
                "unit.grad_shard, out=unit.grad_shard): shard j, summed over the R replicas.")
    elif kind == "AG" and 2 * got == a:
        what += ": gathered once per step, for forward only, and kept for backward"
        hint = ("FULL_SHARD frees each unit after its forward and gathers it again just "
                "before its backward: two AllGathers per unit and step.")
    elif kind == "RS" and got == 2 * a:
        what += (": the gradients went round twice in the shard group, an AllReduce there "
                 "(or a ReduceScatter and an AllGather)")
    elif got == 0:
        what += f": no {KIND[kind]} at all"
    span = f"{a} bytes" if a == b else f"{a} to {b} bytes"
    total = (f"; all ranks together 2 (R-1) Psi x 8 = {closed['cross_node_total']} bytes"
             if kind == "AR" else "")
    return Failure(case.label, "bytes per group: HSDP's closed form", what,
                   expected=f"{FORMULA[kind]} = {span} per rank{total} (R = {R}, S = {S}, "
                            f"Psi = {sum(case.info['pads'])} padded parameters)",
                   got=f"{got} bytes", hint=hint)


def order(labelled, case):
    """Inside the shard group, ZeRO-3's order (the AllReduces come after, in the
    other group: their contents already show they follow the ReduceScatter)."""
    (R, S), info = case.info["mesh"], case.info
    if S == 1:
        return None
    names = [seg[0].split(".")[0] for seg in info["segments"]]
    sizes = ", ".join(f"{p // S * 8}" for p in info["pads"])
    for r in range(R * S):
        calls = C.calls_of(labelled.get(r, []), R * S,
                           per_call=lambda label: 2 * (R - 1) if label[0] == "AR" else S - 1)
        for t in range(C.STEPS):
            mine = [(k, u) for (k, u, tt), _, _ in calls if tt == t and k != "AR"]
            failure = U.unit_order(case, r, t, mine, names, sizes)
            if failure:
                return failure
    return None


# Batch scalings of HSDP's own (the replicas' and the node's), before ZeRO's.
MISTAKES = [
    ("averaged over the replicas as well (divided by R after the AllReduce)",
     lambda g, rows, b, n, s, info: sum(gr[s] for gr in g) / info["mesh"][0],
     "Weighted by len(x) / batch_size, the sums over the shard group and the replicas are "
     "already the global batch's mean: do not divide by R as well."),
    ("averaged over the shard group as well (divided by S)",
     lambda g, rows, b, n, s, info: sum(gr[s] for gr in g) / info["mesh"][1],
     "Weight by len(x) / batch_size only: the ReduceScatter sums, and that sum is meant."),
    ("weighted by the share of one replica's rows (times R)",
     lambda g, rows, b, n, s, info: sum(gr[s] for gr in g) * info["mesh"][0],
     "batch_size is the global batch over all N ranks: weight by len(x) / batch_size."),
] + [
    (f"each rank's mean gradient divided by {letter} ({axis}) instead of weighted by "
     "len(x) / batch_size",
     lambda g, rows, b, n, s, info, i=i: sum(gr[s] * b / k for gr, k in zip(g, rows))
     / info["mesh"][i],
     "The ReduceScatter and the AllReduce sum over all N ranks: weight your mean gradient by "
     f"its share of the global batch, len(x) / batch_size, not by 1 / {letter}.")
    for i, letter, axis in ((1, "S", "the shard group's size"), (0, "R", "the replicas"))
] + C.MISTAKES


def _own_row(i):
    """The mistake of a replica that never AllReduces: its own row's sum only."""
    def combine(g, rows, b, n, s, info):
        S = info["mesh"][1]
        return sum(gr[s] for gr in g[i * S:(i + 1) * S])
    return ("summed over replica " + str(i) + "'s own shard group only: no AllReduce across "
            "the replicas, so each replica steps with its own rows' gradient", combine,
            "After each unit's ReduceScatter in mesh.group('shard'), AllReduce "
            "unit.grad_shard in mesh.group('replicate'): shard j summed over the R replicas.")


def params(result, case):
    (R, S), info = case.info["mesh"], case.info
    pads = info["pads"]
    per_rank = [np.split(out[1], np.cumsum([p // S for p in pads])[:-1])
                for out in result.outputs]
    for i in range(R):
        units = [np.concatenate([per_rank[i * S + j][u] for j in range(S)])
                 for u in range(len(pads))]
        got = C.forward_vector(C.unflat(units, info["segments"], C.shapes_of(info["sizes"])),
                               info["sizes"])
        mistakes = ([_own_row(i)] if R > 1 else []) + MISTAKES
        failure = C.compare_params(case, got, f"replica {i}", mistakes)
        if failure:
            return failure
    return None
