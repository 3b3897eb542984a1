"""Ring attention programs for tests/grading/frontier: right, wrong and cheating.

Every program is ``program(comm, q, k, v, causal)``: this rank's blocks
(b, h, n, d) of a sequence laid out contiguously; it returns its output block.
"""

import math

import numpy as np

from ringlab.collectives import ring_allgather
from ringlab.frontier.ring_attention import ring_attention as reference

SHARED = {}     # what a cheat shares between ranks without messages


def _block(q, k, v, q_pos, k_pos, causal, scale=None):
    """(out, lse) of q on one block; out 0 and lse -inf where every key is masked."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.swapaxes(-1, -2) * scale
    if causal:
        s = np.where(k_pos[None, :] > q_pos[:, None], -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    return (p @ v) / np.where(total > 0, total, 1.0), lse


def _merge(out, lse, out_b, lse_b):
    if out is None:
        return out_b, lse_b
    new = np.logaddexp(lse, lse_b)
    safe = np.where(np.isfinite(new), new, 0.0)
    return (np.exp(lse - safe)[..., None] * out + np.exp(lse_b - safe)[..., None] * out_b), new


def _attend(out, lse, q, kv, r, origin, causal):
    """(out, lse) with rank ``origin``'s K/V block merged in; unchanged where
    causal and that block lies wholly after rank r's queries."""
    if causal and origin > r:
        return out, lse
    n = q.shape[2]
    q_pos, k_pos = np.arange(r * n, (r + 1) * n), np.arange(origin * n, (origin + 1) * n)
    return _merge(out, lse, *_block(q, kv[0], kv[1], q_pos, k_pos, causal))


def solution(comm, q, k, v, causal):
    """The notebook's: K and V stacked, passed right, merged with the lse rule."""
    c, r = comm.world_size, comm.rank
    kv, out, lse = np.stack([k, v]), None, None
    for t in range(c):
        out, lse = _attend(out, lse, q, kv, r, (r - t) % c, causal)
        if t < c - 1:
            kv = comm.sendrecv(kv, (r + 1) % c, (r - 1) % c)
    return out


def flash_left(comm, q, k, v, causal):
    """Passed left, K and V in two messages (isend/irecv), FlashAttention's
    running max, denominator and accumulator."""
    c, r = comm.world_size, comm.rank
    n, scale = q.shape[2], 1 / math.sqrt(q.shape[-1])
    q_pos = np.arange(r * n, (r + 1) * n)
    m = np.full(q.shape[:3] + (1,), -np.inf)
    den, acc = np.zeros(q.shape[:3] + (1,)), np.zeros_like(q)
    kb, vb = k, v
    for t in range(c):
        origin = (r + t) % c
        s = q @ kb.swapaxes(-1, -2) * scale
        if causal:
            s = np.where(np.arange(origin * n, (origin + 1) * n)[None, :] > q_pos[:, None],
                         -np.inf, s)
        new = np.maximum(m, s.max(axis=-1, keepdims=True))
        safe = np.where(np.isfinite(new), new, 0.0)
        p, fix = np.exp(s - safe), np.exp(np.where(np.isfinite(m), m, safe) - safe)
        den, acc, m = den * fix + p.sum(axis=-1, keepdims=True), acc * fix + p @ vb, new
        if t < c - 1:
            left, right = (r - 1) % c, (r + 1) % c
            sends = [comm.isend(kb, left), comm.isend(vb, left)]
            kb, vb = comm.recv(right), comm.recv(right)
            for s_ in sends:
                s_.wait()
    return acc / den


def overlapped(comm, q, k, v, causal):
    """The next block's hop started on the communication stream before this block's compute."""
    c, r = comm.world_size, comm.rank
    kv, out, lse = np.stack([k, v]), None, None
    for t in range(c):
        hop = (comm.start(lambda cm, blk: cm.sendrecv(blk, (r + 1) % c, (r - 1) % c), kv)
               if t < c - 1 else None)
        out, lse = _attend(out, lse, q, kv, r, (r - t) % c, causal)
        if hop is not None:
            kv = hop.wait()
    return out


RIGHT = [reference, solution, flash_left, overlapped]


# -- wrong ------------------------------------------------------------------------------

def _ring(comm, q, k, v, causal, merge, *, way=1, counted=1, q_rule="global", scale=None,
          hops=None):
    """A ring with one thing changed: how blocks merge, which way they travel
    (``way``) and which way their origin is counted (``counted``), the mask's
    positions ("local": inside the block, every block attended; "local skipped":
    inside the block, later ranks' blocks skipped), the scale, the number of hops."""
    c, r = comm.world_size, comm.rank
    n = q.shape[2]
    kv, state = np.stack([k, v]), None
    hops = c - 1 if hops is None else hops
    for t in range(hops + 1):
        origin = (r - counted * t) % c
        q_pos, k_pos = ((np.arange(n), np.arange(n)) if q_rule.startswith("local") else
                        (np.arange(r * n, (r + 1) * n), np.arange(origin * n, (origin + 1) * n)))
        if not causal or q_rule == "local" or origin <= r:
            state = merge(state, _block(q, kv[0], kv[1], q_pos, k_pos, causal, scale))
        if t < hops:
            kv = comm.sendrecv(kv, (r + way) % c, (r - way) % c)
    return state[0]


def _lse_merge(state, block):
    return _merge(*(state or (None, None)), *block)


def _sum_merge(state, block):
    return block if state is None else (state[0] + block[0], None)


def no_rescale(comm, q, k, v, causal):
    """The blocks' outputs added: no log-sum-exp weights."""
    return _ring(comm, q, k, v, causal, _sum_merge)


def local_mask(comm, q, k, v, causal):
    """The causal mask from positions inside each block."""
    return _ring(comm, q, k, v, causal, _lse_merge, q_rule="local")


def local_mask_skipping(comm, q, k, v, causal):
    """Later ranks' blocks skipped, as the notebook says, but every block masked with
    positions inside it (a red team's program: the grader named no mistake)."""
    return _ring(comm, q, k, v, causal, _lse_merge, q_rule="local skipped")


def two_ranks_on(comm, q, k, v, causal):
    """The solution's ring, but each hop to rank + 2 and from rank - 2: the blocks
    held are not the ones counted (a red team's program: the output failed first,
    with no word of the messages)."""
    return _ring(comm, q, k, v, causal, _lse_merge, way=2)


def wrong_direction(comm, q, k, v, causal):
    """Blocks passed left, their origin counted as if they came from the left."""
    return _ring(comm, q, k, v, causal, _lse_merge, way=-1, counted=1)


def last_only(comm, q, k, v, causal):
    """Each block's result replaces the one before."""
    return _ring(comm, q, k, v, causal, lambda state, block: block)


def no_scale(comm, q, k, v, causal):
    return _ring(comm, q, k, v, causal, _lse_merge, scale=1.0)


def one_hop_short(comm, q, k, v, causal):
    """c - 2 hops: the last block never arrives."""
    return _ring(comm, q, k, v, causal, _lse_merge, hops=max(comm.world_size - 2, 0))


def no_correction(comm, q, k, v, causal):
    """FlashAttention's running max raised without rescaling what was summed."""
    c, r = comm.world_size, comm.rank
    n, scale = q.shape[2], 1 / math.sqrt(q.shape[-1])
    q_pos = np.arange(r * n, (r + 1) * n)
    m, den, acc, kv = -np.inf, 0.0, 0.0, np.stack([k, v])
    for t in range(c):
        origin = (r - t) % c
        if not causal or origin <= r:
            s = q @ kv[0].swapaxes(-1, -2) * scale
            if causal:
                s = np.where(np.arange(origin * n, (origin + 1) * n)[None, :] > q_pos[:, None],
                             -np.inf, s)
            m = np.maximum(m, s.max(axis=-1, keepdims=True))
            p = np.exp(s - m)
            den, acc = den + p.sum(axis=-1, keepdims=True), acc + p @ kv[1]
        if t < c - 1:
            kv = comm.sendrecv(kv, (r + 1) % c, (r - 1) % c)
    return acc / den


def naive_exp(comm, q, k, v, causal):
    """No max subtracted: exp of raw scores, summed straight across blocks."""
    c, r = comm.world_size, comm.rank
    n, scale = q.shape[2], 1 / math.sqrt(q.shape[-1])
    q_pos = np.arange(r * n, (r + 1) * n)
    den, acc, kv = 0.0, 0.0, np.stack([k, v])
    for t in range(c):
        origin = (r - t) % c
        s = q @ kv[0].swapaxes(-1, -2) * scale
        if causal:
            s = np.where(np.arange(origin * n, (origin + 1) * n)[None, :] > q_pos[:, None],
                         -np.inf, s)
        with np.errstate(over="ignore", invalid="ignore"):
            p = np.exp(s)
            den, acc = den + p.sum(axis=-1, keepdims=True), acc + p @ kv[1]
        if t < c - 1:
            kv = comm.sendrecv(kv, (r + 1) % c, (r - 1) % c)
    with np.errstate(invalid="ignore"):
        return acc / den


# -- cheats -----------------------------------------------------------------------------

def _whole_attention(q, k, v, r, causal):
    """Rank r's output from the whole sequence's k, v, in one softmax."""
    n = q.shape[2]
    return _block(q, k, v, np.arange(r * n, (r + 1) * n), np.arange(k.shape[2]), causal)[0]


def allgather_library(comm, q, k, v, causal):
    """K and V all-gathered (Part 1's ring AllGather), then attention in one go."""
    c = comm.world_size
    flat = ring_allgather(comm, np.stack([k, v]).ravel())
    kv = flat.reshape(c, 2, *k.shape)
    return _whole_attention(q, np.concatenate(kv[:, 0], axis=2), np.concatenate(kv[:, 1], axis=2),
                            comm.rank, causal)


def allgather_by_hand(comm, q, k, v, causal):
    """The ring's messages exactly, but every block kept, attention at the end."""
    c, r = comm.world_size, comm.rank
    held = {r: np.stack([k, v])}
    for t in range(c - 1):
        held[(r - t - 1) % c] = comm.sendrecv(held[(r - t) % c], (r + 1) % c, (r - 1) % c)
    kv = np.stack([held[j] for j in range(c)])
    return _whole_attention(q, np.concatenate(kv[:, 0], axis=2), np.concatenate(kv[:, 1], axis=2),
                            r, causal)


def allgather_lean(comm, q, k, v, causal):
    """The ring's messages, received straight into one array of the whole sequence's
    K and V (no copies), then attention block by block: as little memory as a
    gather can take."""
    c, r = comm.world_size, comm.rank
    n = q.shape[2]
    kv = np.empty((c, 2) + k.shape)
    kv[r, 0], kv[r, 1] = k, v
    for t in range(c - 1):
        req = comm.isend(kv[(r - t) % c], (r + 1) % c)
        comm.recv((r - 1) % c, out=kv[(r - t - 1) % c])
        req.wait()
    out = lse = None
    q_pos = np.arange(r * n, (r + 1) * n)
    for j in range(c if not causal else r + 1):
        block = _block(q, kv[j, 0], kv[j, 1], q_pos, np.arange(j * n, (j + 1) * n), causal)
        out, lse = _merge(out, lse, *block)
    return out


def _scores(q, k_block, r, origin, causal):
    """My queries' scores against one block (rank ``origin``'s keys), masked."""
    n = q.shape[2]
    s = q @ k_block.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        keys, queries = np.arange(origin * n, (origin + 1) * n), np.arange(r * n, (r + 1) * n)
        future = keys[None, :] > queries[:, None]
        s = np.where(future, -np.inf, s)
    return s


def _softmax(scores):
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return scores / scores.sum(axis=-1, keepdims=True)


def values_and_scores_kept(comm, q, k, v, causal):
    """The ring's messages (K and V as two), but no merge: every V block that
    arrives is kept, with the queries' whole row of scores, and one softmax at the
    end (a red team's program: on 8 ranks it held 11-12 blocks, under the bound of
    14; the whole sequence's V is c - 1 blocks of it)."""
    c, r = comm.world_size, comm.rank
    n = q.shape[2]
    scores, values = np.empty(q.shape[:3] + (c * n,)), [None] * c
    kb, vb = k, v
    for t in range(c):
        o = (r - t) % c
        scores[..., o * n:(o + 1) * n], values[o] = _scores(q, kb, r, o, causal), vb
        if t < c - 1:
            kb = comm.sendrecv(kb, (r + 1) % c, (r - 1) % c)
            vb = comm.sendrecv(vb, (r + 1) % c, (r - 1) % c)
    scores = _softmax(scores)
    return sum(scores[..., o * n:(o + 1) * n] @ values[o] for o in range(c))


def scores_row_kept(comm, q, k, v, causal):
    """Two passes round the ring, K then V (the same messages and bytes), with the
    queries' whole row of scores kept for one softmax in between: no merge (a red
    team's program: K/V-sized memory alone did not show it)."""
    c, r = comm.world_size, comm.rank
    n = q.shape[2]
    scores, kb = np.empty(q.shape[:3] + (c * n,)), k
    for t in range(c):
        o = (r - t) % c
        scores[..., o * n:(o + 1) * n] = _scores(q, kb, r, o, causal)
        if t < c - 1:
            kb = comm.sendrecv(kb, (r + 1) % c, (r - 1) % c)
    scores = _softmax(scores)
    out, vb = np.zeros_like(q), v
    for t in range(c):
        o = (r - t) % c
        out += scores[..., o * n:(o + 1) * n] @ vb
        if t < c - 1:
            vb = comm.sendrecv(vb, (r + 1) % c, (r - 1) % c)
    return out


def whole_sequence(comm, q, k, v, causal):
    """Each hop sends everything the rank holds so far: a gather in c - 1 hops."""
    c, r = comm.world_size, comm.rank
    held = np.stack([k, v])[None]              # blocks r, r-1, ..., r-t
    for _ in range(c - 1):
        held = np.concatenate([held[:1], comm.sendrecv(held, (r + 1) % c, (r - 1) % c)])
    kv = np.stack([held[(r - j) % c] for j in range(c)])
    return _whole_attention(q, np.concatenate(kv[:, 0], axis=2), np.concatenate(kv[:, 1], axis=2),
                            r, causal)


def globals_numpy(comm, q, k, v, causal):
    """Every rank posts its blocks in a module-level dict; numpy does the rest."""
    SHARED[comm.rank] = (k, v)
    comm.barrier()
    c = comm.world_size
    return _whole_attention(q, np.concatenate([SHARED[j][0] for j in range(c)], axis=2),
                            np.concatenate([SHARED[j][1] for j in range(c)], axis=2),
                            comm.rank, causal)


def globals_and_ring(comm, q, k, v, causal):
    """The ring's messages for show, the output from the module-level dict."""
    c = comm.world_size
    SHARED[comm.rank] = (k, v)
    kv = np.stack([k, v])
    for _ in range(c - 1):
        kv = comm.sendrecv(kv, (comm.rank + 1) % c, (comm.rank - 1) % c)
    return _whole_attention(q, np.concatenate([SHARED[j][0] for j in range(c)], axis=2),
                            np.concatenate([SHARED[j][1] for j in range(c)], axis=2),
                            comm.rank, causal)


def calls_reference(comm, q, k, v, causal):
    return reference(comm, q, k, v, causal)


def skips_in_both(comm, q, k, v, causal):
    """Later ranks' blocks skipped even with causal=False."""
    return solution(comm, q, k, v, causal) if causal else _ring_skip_unmasked(comm, q, k, v)


def _ring_skip_unmasked(comm, q, k, v):
    c, r = comm.world_size, comm.rank
    n = q.shape[2]
    kv, state = np.stack([k, v]), None
    for t in range(c):
        origin = (r - t) % c
        if origin <= r:
            state = _lse_merge(state, _block(q, kv[0], kv[1], np.arange(n), np.arange(n), False))
        if t < c - 1:
            kv = comm.sendrecv(kv, (r + 1) % c, (r - 1) % c)
    return state[0]


def diagonal_unmasked(comm, q, k, v, causal):
    """Causal: earlier blocks whole, the own block without its triangle."""
    return _ring_skip_unmasked(comm, q, k, v) if causal else solution(comm, q, k, v, causal)
