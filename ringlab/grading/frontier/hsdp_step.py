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
   (``Labels``): parameter shards or partial sums of gradients in the
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

import operator
import re
from collections import Counter, defaultdict

import numpy as np

from ..kit.driver import callable_learner
from ..kit.widths import measured_widths, mlp_widths, units_of
from ..kit.reductions import chunk_slices as pieces   # what a ring AllReduce over R sends
from ..kit.report import Failure, numbers
from ..kit import sharded as C
from ..kit import units as U
from ..kit.measured import measured_steps
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
SUM_TOL = 1e-8      # relative to the numbers added: sums in another order round differently


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
    return bad or [np.zeros(0), np.concatenate(shards).copy(), memory]


def check(program, case, backend="sim"):
    result, failure = C.trained(_train, program, case, backend,
                                lambda failure: explain_error(failure, case))
    if failure:
        return failure
    # The groups first (a collective over all ranks may still give the right
    # numbers), then the numbers (after a wrong step, every later message
    # differs from the reference's), then what each message holds and the bytes.
    failure = stray(result, case) or params(result, case)
    if failure:
        return failure
    labelled, failure = label_all(result, case)
    return (failure or group_bytes(labelled, case) or every_shard_gathered(labelled, case)
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


# -- 3. the parameters: every replica's shards put together, against data-parallel Adam ----

def _scaled(op, axis):
    """The ranks' weighted gradients summed, then ``op`` with the size of mesh ``axis``."""
    return lambda g, rows, b, n, s, info: op(sum(gr[s] for gr in g), info["mesh"][axis])


def _each_mean_by(axis):
    """Each rank's mean gradient (unweighted) summed, then divided by an axis's size."""
    return lambda g, rows, b, n, s, info: (sum(gr[s] * b / k for gr, k in zip(g, rows))
                                           / info["mesh"][axis])


# Batch scalings of HSDP's own (the replicas' and the node's), before ZeRO's.
MISTAKES = [
    ("averaged over the replicas as well (divided by R after the AllReduce)",
     _scaled(operator.truediv, 0),
     "Weighted by len(x) / batch_size, the sums over the shard group and the replicas are "
     "already the global batch's mean: do not divide by R as well."),
    ("averaged over the shard group as well (divided by S)", _scaled(operator.truediv, 1),
     "Weight by len(x) / batch_size only: the ReduceScatter sums, and that sum is meant."),
    ("weighted by the share of one replica's rows (times R)", _scaled(operator.mul, 0),
     "batch_size is the global batch over all N ranks: weight by len(x) / batch_size."),
] + [
    (f"each rank's mean gradient divided by {letter} ({axis}) instead of weighted by "
     "len(x) / batch_size", _each_mean_by(i),
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


# -- 3. what each message holds, read against data-parallel Adam ---------------------------
#
# Every message of a right program is one of ("AG", u, t): inside a shard group (a
# row), one shard of unit u's parameters before step t's update (an AllGather's);
# ("RS", u, t): inside a shard group, a chunk of unit u's weighted gradients summed
# over some of the row's ranks, the sender among them (a ReduceScatter's partial
# sums, in any ring order); ("AR", u, t): inside a replicate group (a column), a
# piece (np.array_split of the shard into R) of the sender's shard of unit u's
# gradient, summed over whole rows, the sender's among them (an AllReduce's). A sum
# may come times one nonzero number (weights n_r instead of n_r / B, the division
# after): whether the scale is right, the parameters tell. Zeros, other ranks' data,
# or a message between two ranks that share no group are labelled nothing.

def where(r, S):
    return f"rank {r} (replica {r // S}, shard {r % S})"


def group_of(e, S):
    """The group two ranks share: "shard" (a row), "replicate" (a column) or None."""
    (ia, ja), (ib, jb) = divmod(e.src, S), divmod(e.dst, S)
    return "shard" if ia == ib else "replicate" if ja == jb else None


def scaled_sum(p, parts):
    """Whether ``p`` is c times the sum of the rows of ``parts``, for one c != 0."""
    total = parts.sum(axis=0)
    # einsum, not @: a BLAS dot may start threads, slow on a busy machine
    tt = float(np.einsum("i,i", total, total))
    if not tt > 0:
        return False
    c = float(np.einsum("i,i", p, total)) / tt
    # Rounding relative to the numbers added, and to the largest of them (an
    # element near zero carries the rounding of the terms that cancelled in it).
    size = np.abs(parts)
    tol = SUM_TOL * abs(c) * (size.sum(axis=0) + 1e-4 * size.max()) + 1e-300
    return c != 0 and bool(np.all(np.abs(p - c * total) <= tol))


def subset_sum(p, rows, me, probe):
    """The indices of ``rows`` (a subset, row ``me`` among them) whose scaled sum
    is ``p``, or None. A row is a list of 1-D arrays, its value their sum.
    Three elements (``probe``) first: the whole arrays only for the subsets
    those leave."""
    others = [i for i in range(len(rows)) if i != me]
    few = np.array([sum(a[probe] for a in row) for row in rows])
    for mask in range(2 ** len(others)):
        members = [me] + [o for b, o in enumerate(others) if mask >> b & 1]
        if scaled_sum(p[probe], few[members]) and scaled_sum(
                p, np.array([sum(rows[k]) for k in members])):
            return members
    return None


def _close(a, b):
    """Equal up to the rounding of a copy (none) or of a float64 round trip."""
    return bool(np.all(np.abs(a - b) <= 1e-9 * np.abs(a) + 1e-12))


def _near(c, t0, u0):
    """How far candidate (t, u) is from a rank's last message's (t0, u0): its own
    unit, the units beside it, the next step's first units, then the rest."""
    t, u = c
    if t == t0 and abs(u - u0) <= 1:
        return (0, abs(u - u0))
    if t == t0 + 1 and u <= 1:
        return (1, u)
    return (2, t < t0, t, abs(u - u0))


def _probe(p):
    return np.unique([0, p.size // 2, p.size - 1])


class Labels:
    """Labels messages (see above) from the grader's reference (read in place:
    in the measured case it is large)."""

    def __init__(self, ref, R, S):
        self.ref, self.R, self.S = ref, R, S
        self.by_size = defaultdict(list)       # ("shard" | "replicate", size) -> [(t, u)]
        for t, step in enumerate(ref):
            for u, vec in enumerate(step["before"]):
                m = len(vec) // S
                self.by_size["shard", m].append((t, u))
                for size in sorted({s.stop - s.start for s in pieces(m, R)}):
                    self.by_size["replicate", size].append((t, u))
        self.last = defaultdict(lambda: (0, 0))   # rank -> (t, u) of its last message
        self.received = defaultdict(Counter)      # (rank, u, t) -> shards gathered: count

    def chunk(self, t, u, r, k, where=slice(None)):
        """Chunk k (of S) of rank r's weighted gradient of unit u at step t."""
        g = self.ref[t]["grads"][r][u]
        m = len(g) // self.S
        return g[k * m:(k + 1) * m][where]

    def label(self, e, p):
        """The label of message e with payload p, or None."""
        group = group_of(e, self.S)
        if group is None or not (type(p) is np.ndarray and p.dtype == np.float64
                                 and p.ndim == 1 and p.size):
            return None
        t0, u0 = self.last[e.src]
        cands = sorted(self.by_size.get((group, p.size), ()), key=lambda c: _near(c, t0, u0))
        probe = _probe(p)
        for t, u in cands:
            kind, shard = self._kind(group, e, p, t, u, probe)
            if kind:
                self.last[e.src] = (t, u)
                if kind == "AG":
                    self.received[e.dst, u, t][shard] += 1
                return kind, u, t
        return None

    def _kind(self, group, e, p, t, u, probe):
        """(kind, the parameter shard an AllGather's message holds), or (None, None)."""
        (i, j), S = divmod(e.src, self.S), self.S
        if group == "shard":
            params = self.ref[t]["before"][u].reshape(S, -1)
            for k in range(S):
                if _close(params[k, probe], p[probe]) and _close(params[k], p):
                    return "AG", k
            if any(subset_sum(p, [[self.chunk(t, u, i * S + jj, k)] for jj in range(S)],
                              j, probe) is not None for k in range(S)):
                return "RS", None
            return None, None
        for s in pieces(len(self.ref[t]["before"][u]) // S, self.R):
            # each replica's sum, over its shard group, of piece s of shard j
            rows = [[self.chunk(t, u, k * S + jj, j, s) for jj in range(S)] for k in range(self.R)]
            if s.stop - s.start == p.size and subset_sum(p, rows, i, probe) is not None:
                return "AR", None
        return None, None

    def whole_gradient(self, e, p):
        """Whether p, sent between replicas, is a piece of a unit's WHOLE gradient
        (np.array_split into R) summed over ranks of the sender's column."""
        (i, j), probe = divmod(e.src, self.S), _probe(p)
        for step in self.ref:
            for u in range(len(step["before"])):
                column = [step["grads"][k * self.S + j][u] for k in range(self.R)]
                if any(s.stop - s.start == p.size and subset_sum(
                        p, [[c[s]] for c in column], i, probe) is not None
                        for s in pieces(len(column[0]), self.R)):
                    return True
        return False


def _in_order(result):
    """(event, payload or None), in step order."""
    for e in sorted(result.trace, key=lambda e: (e.step, e.stream, e.seq)):
        yield e, result.payload(e) if result.payloads is not None else None


def stray(result, case):
    """A Failure for the first message (in step order) between two ranks that
    share no group, else None: read from the endpoints alone, before anything
    else, so that it is named whatever the message holds."""
    R, S = case.info["mesh"]
    return next((unlabelled(case, Labels([], R, S), e, p) for e, p in _in_order(result)
                 if group_of(e, S) is None), None)


class Labelled(dict):
    """``{rank: [(label, event)] in send order}``; ``received``: Labels.received."""


def label_all(result, case):
    """``(Labelled, None)``, or ``(None, Failure)`` for the first message (in step
    order) that is none of a right program's."""
    labels, out = Labels(case.info["ref"], *case.info["mesh"]), Labelled()
    for e, p in _in_order(result):
        label = labels.label(e, p)
        if label is None:
            return None, unlabelled(case, labels, e, p)
        out.setdefault(e.src, []).append((label, e))
    out.received = labels.received
    return out, None


def unlabelled(case, labels, e, p):
    S, group = labels.S, group_of(e, labels.S)
    what = (f"at step {e.step} {where(e.src, S)} sent {where(e.dst, S)} "
            f"{getattr(p, 'size', '?')} values ({e.nbytes} bytes)")
    got = numbers(p) if isinstance(p, np.ndarray) else repr(p)[:80]
    if group is None:
        return Failure(
            case.label, "every message stays in a shard group or a replicate group",
            what + ": the two share neither a shard group (a row of the mesh) nor a replicate "
                   "group (a column)" + (", on the world comm" if e.group is None else ""),
            expected="messages only between ranks of one row (mesh.group('shard')) or of one "
                     "column (mesh.group('replicate')): no collective over all ranks",
            got=got,
            hint="A collective over all N ranks (an AllReduce of the gradients on comm, "
                 "say) sends across both. HSDP ReduceScatters each unit's gradient in "
                 "mesh.group('shard'), AllReduces that shard in mesh.group('replicate'), "
                 "and AllGathers parameters in mesh.group('shard').")
    if group == "replicate" and isinstance(p, np.ndarray) and p.ndim == 1 and p.size \
            and p.dtype == np.float64 and labels.whole_gradient(e, p):
        return Failure(
            case.label, "only 1/S of the gradient crosses the replicate group",
            what + ": a piece of a unit's WHOLE gradient, summed across replicas: a "
                   "ReduceScatter (or an AllReduce) of the full gradient in the replicate "
                   "group",
            expected=f"between replicas only a piece of the sender's 1/S = 1/{S} shard of "
                     f"the gradient, already summed over its shard group", got=got,
            hint="ReduceScatter the unit's gradient inside mesh.group('shard') first (each "
                 "rank keeps its shard, summed over its row); then AllReduce just that "
                 "shard in mesh.group('replicate'). The groups swapped, or the AllReduce "
                 "first, send S times the bytes across replicas.")
    kind = ("neither one rank's shard of a unit's parameters (an AllGather's) nor a partial "
            "sum of the row's weighted gradients (a ReduceScatter's)" if group == "shard" else
            "not a piece of the sender's gradient shard summed over whole rows (an AllReduce's)")
    return Failure(case.label, "every message carries parameters or gradients",
                   what + f", in its {group} group: {kind}",
                   expected="AllGather: one shard of a unit's current parameters; "
                            "ReduceScatter: a chunk of the weighted gradients; AllReduce: a "
                            "piece of the summed gradient shard; float64, unchanged",
                   got=got,
                   hint="The grader reads every message. Send the real parameters and the "
                        "real gradients (padded at the end to unit.padded, a multiple of S), "
                        "each unit on its own, as Part 1's ring collectives cut them."
                        + (" Each unit's grad_shard is AllReduced on its own, after its "
                           "ReduceScatter: one AllReduce of several units' shards together "
                           "(a bucket, as FSDP can do) is not what this exercise grades."
                           if group == "replicate" else ""))


# -- 4.-6. bytes per group, every shard gathered, the order ---------------------------------

def every_shard_gathered(labelled, case):
    """A Failure unless each rank received, in its two AllGathers of each unit and
    step, every other shard of its row exactly twice (once per AllGather): a
    message may hold any one shard, so the set is what shows that the
    AllGather delivered the others' shards, not its sender's own again and again."""
    R, S = case.info["mesh"]
    names = [seg[0].split(".")[0] for seg in case.info["segments"]]
    for t in range(len(case.info["ref"])):
        for (u, name), r in ((un, r) for un in enumerate(names) for r in range(R * S)):
            got = labelled.received.get((r, u, t), Counter())
            want = Counter({k: 2 for k in range(S) if k != r % S})
            if S > 1 and got != want:
                return Failure(
                    case.label, "each AllGather delivers every other shard once",
                    f"training step {t + 1}: in its AllGathers of unit {name} "
                    f"{where(r, S)} received shards "
                    + ", ".join(f"{k} x{c}" for k, c in sorted(got.items())),
                    expected="shards " + ", ".join(f"{k} x2" for k in sorted(want))
                             + " (every other rank's of its row, once per AllGather, "
                               "two AllGathers per unit and step)",
                    hint="In a ring AllGather each rank passes on the shard it received "
                         "last step: its own first, then its left neighbour's, ...")
    return None


def numels(info):
    shapes = C.shapes_of(info["sizes"])
    return [sum(int(np.prod(shapes[k])) for k in seg) for seg in info["segments"]]


def group_bytes(labelled, case):
    """Per rank and step, bytes of each collective against the closed form."""
    (R, S), pads = case.info["mesh"], case.info["pads"]
    closed = hsdp_bytes(numels(case.info), R, S)
    psi, total = 8 * sum(pads), closed["cross_node_total"]
    # A ring AllReduce of a shard of L numbers over R ranks: each sends 2(R-1)
    # pieces of np.array_split(L, R), floor(L/R) or ceil(L/R) numbers each.
    lo = 8 * 2 * (R - 1) * sum(p // S // R for p in pads)
    hi = 8 * 2 * (R - 1) * sum(-(-(p // S) // R) for p in pads)
    want = {"AG": (2 * (S - 1) * psi // S,) * 2, "RS": ((S - 1) * psi // S,) * 2, "AR": (lo, hi)}
    sent = Counter()                                   # (rank, step, kind) -> bytes sent
    for r, msgs in labelled.items():
        for (kind, _, t), e in msgs:
            sent[r, t, kind] += e.nbytes
    for t in range(C.STEPS):
        for r, kind in ((r, kind) for r in range(R * S) for kind in want):
            (a, b), got = want[kind], sent[r, t, kind]
            if not a <= got <= b:
                return _bytes_failure(case, r, t, kind, got, (a, b), closed)
        got = sum(sent[r, t, "AR"] for r in range(R * S))
        if got != total:
            return _bytes_failure(case, None, t, "AR", got, (total, total), closed)
    return None


FORMULA = {"AG": "2 (S-1)/S Psi x 8 bytes (two AllGathers per unit)",
           "RS": "(S-1)/S Psi x 8 bytes (one ReduceScatter per unit)",
           "AR": "2 (R-1)/R Psi/S x 8 bytes (one AllReduce of each unit's shard)"}
HSDP_HINT = ("HSDP per unit: AllGather in mesh.group('shard') before forward and again before "
             "backward, ReduceScatter of the weighted gradient there, then AllReduce of "
             "unit.grad_shard in mesh.group('replicate').")


def _bytes_failure(case, r, t, kind, got, want, closed):
    (R, S), (a, b) = case.info["mesh"], want
    group, hint = "replicate" if kind == "AR" else "shard", HSDP_HINT
    who = (f"all {R * S} ranks together" if r is None else where(r, S))
    what = (f"training step {t + 1}: {who} sent {got} bytes of {KIND[kind]} messages in "
            f"{'the' if r is None else 'its'} {group} group{'s' if r is None else ''}")
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
