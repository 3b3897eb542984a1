"""Programs for the ``moe_dispatch_combine`` grader: right ones, wrong ones, cheats.

Each takes ``(comm, tokens, gates, expert)``: this rank's (n, d) tokens, their
(n, E) gates (0 where a token does not go), and ``expert(i, x)`` for this
rank's experts i.
"""

import numpy as np

from ringlab.collectives import alltoall, ring_alltoall
from ringlab.frontier.expert_parallel import moe_dispatch_combine as _reference

SHARED = {}     # what a cheat shares between ranks without messages


def _exchange(comm, blocks, sizes, empty_too=False):
    """Send blocks[d] to rank d, receive sizes[s] rows from rank s (d, s != me)."""
    n, me = comm.world_size, comm.rank
    width = blocks[me].shape[1]
    recvs = {s: comm.irecv(s, shape=(int(sizes[s]), width)) for s in range(n)
             if s != me and (sizes[s] or empty_too)}
    sends = [comm.isend(blocks[d], d) for d in range(n) if d != me and (len(blocks[d]) or empty_too)]
    for req in sends:
        req.wait()
    return [blocks[s] if s == me else recvs[s].wait() if s in recvs
            else np.zeros((0, width)) for s in range(n)]


def _moe(comm, tokens, gates, expert, *, route=None, counts_of=None, gated=True,
         combine_order=None, skip_own=False, owner=None, empty_too=False, reverse=False,
         recompute=False):
    """The dispatch and combine, with knobs that make each mistake."""
    e, me = comm.world_size, comm.rank
    E = gates.shape[1]
    per = E // e
    owner = owner or (lambda i: i // per)
    rows = route(gates) if route else [np.flatnonzero(gates[:, i]) for i in range(E)]
    if reverse:
        rows = [r[::-1] for r in rows]
    mine = [[i for i in range(E) if owner(i) == d] for d in range(e)]
    counts = [np.array([len(rows[i]) for i in mine[d]], dtype=np.int64) for d in range(e)]
    if skip_own:
        counts[me] = np.zeros(len(mine[me]), dtype=np.int64)
    got = alltoall(comm, counts_of(counts) if counts_of else counts)
    got = [g[me * per:(me + 1) * per] if len(g) == E > per else g for g in got]
    blocks = [np.concatenate([tokens[rows[i]] for i in mine[d]]) if counts[d].sum()
              else np.zeros((0, tokens.shape[1])) for d in range(e)]
    arrived = _exchange(comm, blocks, [g.sum() for g in got], empty_too)
    pieces = [np.split(arrived[s], np.cumsum(got[s])[:-1]) for s in range(e)]
    back = [[] for _ in range(e)]
    for j, i in enumerate(mine[me]):
        inputs = [pieces[s][j] for s in range(e)]
        if recompute:            # every row that arrived, then only those for expert i
            starts = np.cumsum([0] + [len(a) for a in arrived])
            keep = np.concatenate([starts[s] + np.arange(sum(got[s][:j]), sum(got[s][:j + 1]))
                                   for s in range(e)]).astype(int)
            out = expert(i, np.concatenate(arrived))[keep]
        else:
            out = expert(i, np.concatenate(inputs))
        for s, part in enumerate(np.split(out, np.cumsum([len(p) for p in inputs])[:-1])):
            back[s].append(part)
    returned = _exchange(comm, [np.concatenate(b) if b else np.zeros((0, tokens.shape[1]))
                                for b in back], [c.sum() for c in counts], empty_too)
    y = np.zeros_like(tokens)
    for d in range(e):
        for i, part in zip(mine[d], np.split(returned[d], np.cumsum(counts[d])[:-1])):
            r = combine_order(rows[i]) if combine_order else rows[i]
            y[r] += (gates[r, i][:, None] if gated else 1.0) * part
    return y


# ================================================================ right
def reference(comm, tokens, gates, expert):
    """The library's own (banned under `ringlab grade`, fine in-process)."""
    return _reference(comm, tokens, gates, expert)


def solution(comm, tokens, gates, expert):
    """The notebook's: counts by Part 1's alltoall, tokens by isend/irecv."""
    return _moe(comm, tokens, gates, expert)


def empty_blocks_too(comm, tokens, gates, expert):
    """Empty blocks travel as well (0 rows): still one message per pair and phase."""
    return _moe(comm, tokens, gates, expert, empty_too=True)


def tokens_in_reverse(comm, tokens, gates, expert):
    """Each expert's rows in reverse token order: any order is fine."""
    return _moe(comm, tokens, gates, expert, reverse=True)


def all_counts(comm, tokens, gates, expert):
    """Every rank sends every other all E of its counts."""
    e = comm.world_size
    return _moe(comm, tokens, gates, expert,
                counts_of=lambda c: [np.concatenate(c)] * e)


def pairwise_float_counts(comm, tokens, gates, expert):
    """sendrecv with shift partners, counts as floats, empty blocks travel too."""
    e, me = comm.world_size, comm.rank
    E = gates.shape[1]
    per = E // e
    rows = [np.flatnonzero(gates[:, i]) for i in range(E)]

    def own(r):
        return range(r * per, r * per + per)
    counts = {r: np.array([len(rows[i]) for i in own(r)], dtype=float) for r in range(e)}
    got = {me: counts[me].astype(int)}
    for k in range(1, e):
        dst, src = (me + k) % e, (me - k) % e
        got[src] = comm.sendrecv(counts[dst], dst, src).astype(int)
    blocks = {r: np.concatenate([tokens[rows[i]] for i in own(r)]) for r in range(e)}
    arrived = {me: blocks[me]}
    for k in range(1, e):
        dst, src = (me + k) % e, (me - k) % e
        arrived[src] = comm.sendrecv(blocks[dst], dst, src)
    outs = {}
    for j, i in enumerate(own(me)):
        parts = [np.split(arrived[s], np.cumsum(got[s])[:-1])[j] for s in range(e)]
        o = expert(i, np.concatenate(parts))
        for s, part in enumerate(np.split(o, np.cumsum([len(p) for p in parts])[:-1])):
            outs.setdefault(s, []).append(part)
    back = {me: np.concatenate(outs[me])}
    for k in range(1, e):
        dst, src = (me + k) % e, (me - k) % e
        back[src] = comm.sendrecv(np.concatenate(outs[dst]), dst, src)
    y = np.zeros_like(tokens)
    for r in range(e):
        for i, part in zip(own(r), np.split(back[r], np.cumsum(counts[r].astype(int))[:-1])):
            y[rows[i]] += gates[rows[i], i][:, None] * part
    return y


# ================================================================ wrong
def no_gate(comm, tokens, gates, expert):
    """The outputs summed without their gates."""
    return _moe(comm, tokens, gates, expert, gated=False)


def token_order_back(comm, tokens, gates, expert):
    """Reverses the rows going out but combines in token order: wrong rows."""
    return _moe(comm, tokens, gates, expert, reverse=True, combine_order=np.sort)


def skips_counts(comm, tokens, gates, expert):
    """No counts: the blocks by Part 1's alltoall, one per expert of the receiver."""
    e, me = comm.world_size, comm.rank
    E = gates.shape[1]
    per = E // e
    rows = [np.flatnonzero(gates[:, i]) for i in range(E)]
    y = np.zeros_like(tokens)
    for j in range(per):
        got = alltoall(comm, [tokens[rows[d * per + j]] for d in range(e)])
        out = expert(me * per + j, np.concatenate(got))
        back = alltoall(comm, np.split(out, np.cumsum([len(g) for g in got])[:-1]))
        for d in range(e):
            i = d * per + j
            y[rows[i]] += gates[rows[i], i][:, None] * back[d]
    return y


def ring_counts(comm, tokens, gates, expert):
    """The counts by a ring AlltoAll (forwarded by the ranks between), then right."""
    e = comm.world_size
    per = gates.shape[1] // e
    rows = [np.flatnonzero(gates[:, i]) for i in range(gates.shape[1])]
    ring_alltoall(comm, [np.array([len(rows[i]) for i in range(d * per, d * per + per)])
                         for d in range(e)])
    return _moe(comm, tokens, gates, expert)


def argsort_top_k(comm, tokens, gates, expert):
    """Routes by the k largest gates: a dropped assignment (gate 0) travels too."""
    k = int((gates != 0).sum(axis=1).max(initial=1))
    top = np.argsort(-gates, axis=1, kind="stable")[:, :k]
    return _moe(comm, tokens, gates, expert,
                route=lambda g: [np.flatnonzero((top == i).any(axis=1)) for i in range(g.shape[1])])


def residual_for_dropped(comm, tokens, gates, expert):
    """A token every expert dropped gets itself back."""
    y = _moe(comm, tokens, gates, expert)
    gone = ~gates.any(axis=1)
    y[gone] = tokens[gone]
    return y


def renormalised(comm, tokens, gates, expert):
    """Gates divided by their sum over the experts the token reached."""
    total = gates.sum(axis=1, keepdims=True)
    return _moe(comm, tokens, np.divide(gates, total, out=np.zeros_like(gates), where=total > 0),
                expert)


def own_experts_forgotten(comm, tokens, gates, expert):
    """Only the tokens that travel are computed: my own experts' share is lost."""
    e, me = comm.world_size, comm.rank
    per = gates.shape[1] // e
    g = gates.copy()
    g[:, me * per:(me + 1) * per] = 0
    return _moe(comm, tokens, g, expert)


def round_robin_owner(comm, tokens, gates, expert):
    """Expert i on rank i % e: not where the experts are."""
    e = comm.world_size
    return _moe(comm, tokens, gates, expert, owner=lambda i: i % e)


def computes_everything(comm, tokens, gates, expert):
    """Each expert runs on every row that arrived, then keeps its own."""
    return _moe(comm, tokens, gates, expert, recompute=True)


# ================================================================ cheats
def everything_to_everyone(comm, tokens, gates, expert):
    """Counts, then every token (with its gates) to every rank; outputs back."""
    e, me = comm.world_size, comm.rank
    E = gates.shape[1]
    per = E // e
    alltoall(comm, [np.array([len(tokens)] * per) for _ in range(e)])
    got = alltoall(comm, [np.concatenate([tokens, gates], axis=1)] * e)
    d = tokens.shape[1]
    outs = []
    for block in got:
        out = np.zeros((len(block), d))
        for j in range(per):
            i = me * per + j
            on = np.flatnonzero(block[:, d + i])
            out[on] += block[on, d + i][:, None] * expert(i, block[on, :d])
        outs.append(out)
    return sum(alltoall(comm, outs))


def local_from_globals(comm, tokens, gates, expert):
    """Every rank posts its expert; each computes its own tokens with all of them."""
    SHARED[comm.rank] = expert
    comm.barrier()
    per = gates.shape[1] // comm.world_size
    y = np.zeros_like(tokens)
    for i in range(gates.shape[1]):
        rows = np.flatnonzero(gates[:, i])
        y[rows] += gates[rows, i][:, None] * SHARED[i // per](i, tokens[rows])
    return y


def allgather_everything(comm, tokens, gates, expert):
    """No routing at all: every rank gathers every token, applies its experts."""
    return everything_to_everyone(comm, tokens, gates, expert)


def nan_row(comm, tokens, gates, expert):
    """Right, but for a NaN in the first row (NaN compares False with everything)."""
    y = _moe(comm, tokens, gates, expert)
    if len(y):
        y[0, 0] = np.nan
    return y


def zeros_and_shared_memory(comm, tokens, gates, expert):
    """The right messages' shapes (the counts, then zero blocks of the routed sizes),
    the result from the other ranks' experts, reached through a module-level dict."""
    SHARED[comm.rank] = expert
    comm.barrier()
    e = comm.world_size
    per = gates.shape[1] // e
    rows = [np.flatnonzero(gates[:, i]) for i in range(gates.shape[1])]
    counts = [np.array([len(rows[i]) for i in range(d * per, d * per + per)]) for d in range(e)]
    got = alltoall(comm, counts)
    zeros = [np.zeros((int(c.sum()), tokens.shape[1])) for c in counts]
    _exchange(comm, zeros, [int(g.sum()) for g in got])
    _exchange(comm, [np.zeros((int(g.sum()), tokens.shape[1])) for g in got],
              [int(c.sum()) for c in counts])
    y = np.zeros_like(tokens)
    for i, r in enumerate(rows):
        y[r] += gates[r, i][:, None] * SHARED[i // per](i, tokens[r])
    return y
