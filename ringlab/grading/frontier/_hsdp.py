"""What ``hsdp_step``'s messages hold, read against data-parallel Adam.

On a ``(replicate, shard)`` mesh of R x S ranks, rank r sits at replica
``r // S``, shard ``r % S``. Every message of a right program is one of:

* ``("AG", u, t)``: inside a shard group (a row), one shard of unit u's
  parameters before step t's update (an AllGather's);
* ``("RS", u, t)``: inside a shard group, a chunk of unit u's weighted
  gradients summed over some of the row's ranks, the sender among them (a
  ReduceScatter's partial sums, in any ring order);
* ``("AR", u, t)``: inside a replicate group (a column), a piece
  (``np.array_split`` of the shard into R) of the sender's shard of unit u's
  gradient, summed over whole rows, the sender's among them (an AllReduce's).

A sum may come times one nonzero number (weights n_r instead of n_r / B, the
division after): whether the scale is right, the parameters tell. Zeros,
other ranks' data, or a message between two ranks that share no group are
labelled nothing.
"""

from collections import Counter, defaultdict

import numpy as np

from ..kit.reductions import chunk_slices as pieces   # what a ring AllReduce over R sends
from ..kit.report import Failure, numbers

TOL = 1e-8          # relative to the numbers added: sums in another order round differently


def where(r, S):
    return f"rank {r} (replica {r // S}, shard {r % S})"


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
    tol = TOL * abs(c) * (size.sum(axis=0) + 1e-4 * size.max()) + 1e-300
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


class Labels:
    """Labels messages (see the module's docstring) from the grader's reference
    (read in place: in the measured case it is large)."""

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

    def group_of(self, e):
        (ia, ja), (ib, jb) = divmod(e.src, self.S), divmod(e.dst, self.S)
        return "shard" if ia == ib else "replicate" if ja == jb else None

    def chunk(self, t, u, r, k, where=slice(None)):
        """Chunk k (of S) of rank r's weighted gradient of unit u at step t."""
        g = self.ref[t]["grads"][r][u]
        m = len(g) // self.S
        return g[k * m:(k + 1) * m][where]

    def label(self, e, p):
        """The label of message e with payload p, or None."""
        group = self.group_of(e)
        if group is None or not (type(p) is np.ndarray and p.dtype == np.float64
                                 and p.ndim == 1 and p.size):
            return None
        t0, u0 = self.last[e.src]
        cands = sorted(self.by_size.get((group, p.size), ()), key=lambda c: _near(c, t0, u0))
        probe = np.unique([0, p.size // 2, p.size - 1])
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
        (i, j), probe = divmod(e.src, self.S), np.unique([0, p.size // 2, p.size - 1])
        for t, step in enumerate(self.ref):
            for u in range(len(step["before"])):
                column = [step["grads"][k * self.S + j][u] for k in range(self.R)]
                if any(s.stop - s.start == p.size and subset_sum(
                        p, [[c[s]] for c in column], i, probe) is not None
                        for s in pieces(len(column[0]), self.R)):
                    return True
        return False


def stray(result, case):
    """A Failure for the first message (in step order) between two ranks that
    share no group, else None: read from the endpoints alone, before anything
    else, so that it is named whatever the message holds."""
    R, S = case.info["mesh"]
    labels = Labels([], R, S)
    for e in sorted(result.trace, key=lambda e: (e.step, e.stream, e.seq)):
        if labels.group_of(e) is None:
            p = result.payload(e) if result.payloads is not None else None
            return unlabelled(case, labels, e, p)
    return None


class Labelled(dict):
    """``{rank: [(label, event)] in send order}``; ``received``: Labels.received."""


def label_all(result, case):
    """``(Labelled, None)``, or ``(None, Failure)`` for the first message (in step
    order) that is none of a right program's."""
    R, S = case.info["mesh"]
    labels = Labels(case.info["ref"], R, S)
    out = Labelled()
    for e in sorted(result.trace, key=lambda e: (e.step, e.stream, e.seq)):
        p = result.payload(e) if result.payloads is not None else None
        label = labels.label(e, p)
        if label is None:
            return None, unlabelled(case, labels, e, p)
        out.setdefault(e.src, []).append((label, e))
    out.received = labels.received
    return out, None


def every_shard_gathered(labelled, case):
    """A Failure unless each rank received, in its two AllGathers of each unit and
    step, every other shard of its row exactly twice (once per AllGather): a
    message may hold any one shard, so the set is what shows that the
    AllGather delivered the others' shards, not its sender's own again and again."""
    R, S = case.info["mesh"]
    names = [seg[0].split(".")[0] for seg in case.info["segments"]]
    for t in range(len(case.info["ref"])):
        for u, name in enumerate(names):
            for r in range(R * S):
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


def unlabelled(case, labels, e, p):
    S = labels.S
    what = (f"at step {e.step} {where(e.src, S)} sent {where(e.dst, S)} "
            f"{getattr(p, 'size', '?')} values ({e.nbytes} bytes)")
    group = labels.group_of(e)
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
    kind = ("one rank's shard of a unit's parameters (an AllGather's) nor a partial sum of "
            "the row's weighted gradients (a ReduceScatter's)" if group == "shard" else
            "a piece of the sender's gradient shard summed over whole rows (an AllReduce's)")
    return Failure(case.label, "every message carries parameters or gradients",
                   what + f", in its {group} group: " + ("neither " if group == "shard"
                                                         else "not ") + kind,
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
