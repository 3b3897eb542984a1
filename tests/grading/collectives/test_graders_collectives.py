"""The collective graders: every correct variant passes, every real mistake fails
with the specific check and a message that says what and where."""

import numpy as np
import pytest

import ringlab
from ringlab import collectives as C
from ringlab.grading import GRADERS
from ringlab.grading.collectives.fix_ring_allgather import BUGGY_SOURCE, buggy_ring_allgather

from programs.reports import assert_fails

IDS = ["ring_allgather", "ring_reduce_scatter", "tree_broadcast", "binomial_broadcast",
       "alltoall", "ring_alltoall", "fix_ring_allgather"]


def ring(comm):
    n, r = comm.world_size, comm.rank
    return n, r, (r + 1) % n, (r - 1) % n


# ============================================================== ring_allgather
def _own_block(comm, x):
    """(n, r, right, left, blocks): a list of N blocks, this rank's own x in block r."""
    n, r, right, left = ring(comm)
    blocks = [None] * n
    blocks[r] = x
    return n, r, right, left, blocks


def _own_slot(comm, x):
    """(n, r, right, left, L, out): the result array, this rank's own x in block r."""
    n, r, right, left = ring(comm)
    out = np.zeros(n * len(x))
    out[r * len(x):(r + 1) * len(x)] = x
    return n, r, right, left, len(x), out


def ag_leftward(comm, x):
    """Passes blocks to the left, plain send/recv, no labels."""
    n, r, right, left, blocks = _own_block(comm, x)
    for k in range(n - 1):
        comm.send(blocks[(r + k) % n], left)
        blocks[(r + k + 1) % n] = comm.recv(right)
    return np.concatenate(blocks)


def ag_alternating(comm, x):
    """Even steps to the right, odd steps to the left: still one message per rank per step."""
    n, r, right, left, blocks = _own_block(comm, x)
    newest_left = newest_right = r      # the block last received from each side (own at first)
    for k in range(n - 1):
        if k % 2 == 0:                  # pass the newest block from the left on to the right
            blocks[(newest_left - 1) % n] = comm.sendrecv(blocks[newest_left], right, left)
            newest_left = (newest_left - 1) % n
        else:                           # and the newest from the right on to the left
            blocks[(newest_right + 1) % n] = comm.sendrecv(blocks[newest_right], left, right)
            newest_right = (newest_right + 1) % n
    return np.concatenate(blocks)


def ag_isend_preallocated(comm, x):
    n, r, right, left, L, out = _own_slot(comm, x)
    for k in range(n - 1):
        s, g = (r - k) % n, (r - k - 1) % n
        rq = comm.irecv(left)
        sq = comm.isend(out[s * L:(s + 1) * L], right, chunk=s, op="copy")
        out[g * L:(g + 1) * L] = rq.wait()
        sq.wait()
    return out


# BUGGY_SOURCE with the one-line fix: forward the block received in the step before.
FIX = ("comm.sendrecv(x, right, left)", "comm.sendrecv(blocks[(rank - k) % n], right, left)")
assert BUGGY_SOURCE.count(FIX[0]) == 1
_fixed = {"np": np, "__name__": __name__}
exec(BUGGY_SOURCE.replace(*FIX), _fixed)                                  # noqa: S102
ag_fixed = _fixed["ring_allgather"]
ag_fixed.__name__ = ag_fixed.__qualname__ = "ag_fixed"


def ag_direct(comm, x):
    n, r, _, _ = ring(comm)
    reqs = [comm.isend(x, d) for d in range(n) if d != r]
    blocks = [x if s == r else comm.recv(s) for s in range(n)]
    for q in reqs:
        q.wait()
    return np.concatenate(blocks)


def ag_sends_everything_so_far(comm, x):
    n, r, right, left = ring(comm)
    L = len(x)
    have = [x]                          # blocks r, r-1, r-2, ...: everything I have so far
    for k in range(n - 1):
        got = comm.sendrecv(np.concatenate(have), right, left)
        have.append(got[k * L:])        # my left neighbour's list ends with the one block I lack
    return np.concatenate([have[(r - s) % n] for s in range(n)])


def ag_one_step_too_many(comm, x):
    out = ag_fixed(comm, x)
    n, r, right, left = ring(comm)
    if n > 1:
        comm.sendrecv(x, right, left)
    return out


def ag_wrong_slot(comm, x):
    """Forwards correctly, but stores what arrives under the wrong index."""
    n, r, right, left, blocks = _own_block(comm, x)
    last = x
    for k in range(n - 1):
        last = comm.sendrecv(last, right, left)
        blocks[(r + k + 1) % n] = last      # it came from the left: rank (r - 1 - k)
    return np.concatenate(blocks)


def ag_returns_list(comm, x):
    n, r, right, left, blocks = _own_block(comm, x)
    for k in range(n - 1):
        blocks[(r - k - 1) % n] = comm.sendrecv(blocks[(r - k) % n], right, left)
    return blocks


def ag_receives_first(comm, x):
    n, r, right, left, blocks = _own_block(comm, x)
    for k in range(n - 1):
        blocks[(r - k - 1) % n] = comm.recv(left)
        comm.send(blocks[(r - k) % n], right)
    return np.concatenate(blocks)


def ag_one_step_short_preallocated(comm, x):
    n, r, right, left, L, out = _own_slot(comm, x)
    for k in range(n - 2):                      # n - 1 steps needed
        s, g = (r - k) % n, (r - k - 1) % n
        out[g * L:(g + 1) * L] = comm.sendrecv(out[s * L:(s + 1) * L], right, left)
    return out


def ag_one_step_short_list(comm, x):
    n, r, right, left, blocks = _own_block(comm, x)
    for k in range(n - 2):                      # n - 1 steps needed: np.concatenate meets a None
        blocks[(r - k - 1) % n] = comm.sendrecv(blocks[(r - k) % n], right, left)
    return np.concatenate(blocks)


AG_RIGHT = [C.ring_allgather, ag_leftward, ag_alternating, ag_isend_preallocated, ag_fixed]
AG_WRONG = [
    (buggy_ring_allgather, "every rank's x, in rank order", ["holds rank", "its own x again (it sent it at step 1)",
                                                            "received in the step before"]),
    (C.naive_allgather, "only between ring neighbours", ["rank 2 sent to rank 0", "a gather to one rank"]),
    (C.recursive_doubling_allgather, "only between ring neighbours", ["rank 0 sent to rank 2",
                                                                      "left and on its right"]),
    (ag_direct, "only between ring neighbours", ["which is not its neighbour"]),
    (ag_sends_everything_so_far, "one block per message", ["at step 2 rank 0 sent rank 1 48 bytes",
                                                           "at most one block: L = 3 elements"]),
    (ag_one_step_too_many, "exactly N-1 steps", ["took 4 steps", "4 - 1 = 3 steps"]),
    (ag_wrong_slot, "every rank's x, in rank order", ["world_size=4", "(rank - 1 - k) % N"]),
    (ag_returns_list, "every rank returns its result", ["rank 0 returned list of 4 arrays", "np.concatenate"]),
    (ag_receives_first, "no deadlock", ["waits in recv(src=3)", "every rank waits to receive, and no rank has sent",
                                        "waits to receive before anyone sends: send first, or use comm.sendrecv"]),
    (ag_one_step_short_preallocated, "every rank's x, in rank order", [
        "What:     the program took only 2 steps; a ring AllGather takes N-1 = 3",
        "holds zeros (never filled?)", "Hint:     Count your loop first: it must run world_size - 1 times"]),
    (ag_one_step_short_list, "runs without error", [
        "ValueError", "Also: the program took 2 steps before failing; a ring AllGather takes N-1 = 3",
        "Hint:     Count your loop first"]),
]


# ============================================================== ring_reduce_scatter
def rs_leftward(comm, x):
    n, r, right, left = ring(comm)
    chunks = [c.copy() for c in np.array_split(x, n)]
    for k in range(n - 1):
        comm.send(chunks[(r + k + 1) % n], left)
        chunks[(r + k + 2) % n] += comm.recv(right)
    return chunks[r]


def rs_isend_in_place(comm, x):
    n, r, right, left = ring(comm)
    chunks = np.array_split(x, n)                  # views: adds into the caller's x
    for k in range(n - 1):
        rq = comm.irecv(left)
        sq = comm.isend(chunks[(r - k - 1) % n], right, chunk=(r - k - 1) % n, op="reduce")
        chunks[(r - k - 2) % n] += rq.wait()
        sq.wait()
    return chunks[r]


def rs_explicit_bounds(comm, x):
    n, r, right, left = ring(comm)
    out = x.copy()
    base, extra = divmod(len(x), n)
    b = [i * base + min(i, extra) for i in range(n + 1)]
    part = lambda c: out[b[c]:b[c + 1]]  # noqa: E731
    for k in range(n - 1):
        part((r - k - 2) % n)[:] += comm.sendrecv(part((r - k - 1) % n), right, left)
    return part(r).copy()


def _rs(comm, x, send, recv, add=True, keep=lambda r, n: r, hop=1):
    n, r = comm.world_size, comm.rank
    out = x.copy()
    chunks = np.array_split(out, n)
    for k in range(n - 1):
        got = comm.sendrecv(chunks[send(r, k, n)], (r + hop) % n, (r - hop) % n)
        chunks[recv(r, k, n)][...] = chunks[recv(r, k, n)] + got if add else got
    return chunks[keep(r, n)]


def rs_allreduce_convention(comm, x):
    """Ring AllReduce's first phase: rank r ends with chunk r+1, and returns it."""
    return _rs(comm, x, lambda r, k, n: (r - k) % n, lambda r, k, n: (r - k - 1) % n,
               keep=lambda r, n: (r + 1) % n)


def rs_replaces(comm, x):
    return _rs(comm, x, lambda r, k, n: (r - k - 1) % n, lambda r, k, n: (r - k - 2) % n, add=False)


def rs_wrong_slot(comm, x):
    return _rs(comm, x, lambda r, k, n: (r - k - 1) % n, lambda r, k, n: (r - k - 1) % n)


def rs_via_allreduce(comm, x):
    return np.array_split(C.ring_allreduce(comm, x), comm.world_size)[comm.rank]


def rs_whole_vectors(comm, x):
    n, r, right, left = ring(comm)
    total, passing = x.copy(), x.copy()
    for _ in range(n - 1):
        passing = comm.sendrecv(passing, right, left)
        total += passing
    return np.array_split(total, n)[r]


def rs_direct(comm, x):
    n, r, _, _ = ring(comm)
    chunks = np.array_split(x, n)
    reqs = [comm.isend(chunks[d], d) for d in range(n) if d != r]
    mine = chunks[r].copy()
    for s in range(n):
        if s != r:
            mine += comm.recv(s)
    for q in reqs:
        q.wait()
    return mine


def rs_central(comm, x):
    n, r, _, _ = ring(comm)
    if r == 0:
        total = x.copy()
        for s in range(1, n):
            total += comm.recv(s)
        chunks = np.array_split(total, n)
        for d in range(1, n):
            comm.send(chunks[d], d)
        return chunks[0]
    comm.send(x, 0)
    return comm.recv(0)


def rs_returns_whole_vector(comm, x):
    return C.ring_allreduce(comm, x)


def rs_forwards_what_arrived(comm, x):
    """Adds correctly, but passes on the chunk as it arrived, without its own contribution."""
    n, r, right, left = ring(comm)
    chunks = np.array_split(x.copy(), n)
    passing = chunks[(r - 1) % n]
    for k in range(n - 1):
        got = comm.sendrecv(passing, right, left)
        chunks[(r - k - 2) % n] += got
        passing = got                           # should be chunks[(r - k - 2) % n]
    return chunks[r].copy()


def rs_allreduce_indices(comm, x):
    """Ring AllReduce's first phase, returning chunks[rank]: only rank r's own contribution."""
    return _rs(comm, x, lambda r, k, n: (r - k) % n, lambda r, k, n: (r - k - 1) % n)


def rs_assumes_length_divides(comm, x):
    n, r, right, left = ring(comm)
    out, size = x.copy(), len(x) // n
    chunks = [out[i * size:(i + 1) * size] for i in range(n)]
    for k in range(n - 1):
        chunks[(r - k - 2) % n] += comm.sendrecv(chunks[(r - k - 1) % n], right, left)
    return chunks[r].copy()


def rs_takes_turns(comm, x):
    """Blocking send/recv, even ranks first: right sums, but a round takes two steps."""
    n, r, right, left = ring(comm)
    chunks = np.array_split(x.copy(), n)
    for k in range(n - 1):
        if r % 2 == 0:
            comm.send(chunks[(r - k - 1) % n], right)
            got = comm.recv(left)
        else:
            got = comm.recv(left)
            comm.send(chunks[(r - k - 1) % n], right)
        chunks[(r - k - 2) % n] += got
    return chunks[r].copy()


RS_SEND, RS_ADD = (lambda r, k, n: (r - k - 1) % n), (lambda r, k, n: (r - k - 2) % n)


def rs_from_zeros(comm, x):
    """Reduces a zero buffer instead of x."""
    return _rs(comm, np.zeros_like(x), RS_SEND, RS_ADD)


def rs_skips_a_neighbour(comm, x):
    """The right indices, but messages go to rank + 2: wrong sums, and not a ring."""
    return _rs(comm, x, RS_SEND, RS_ADD, hop=2)


RS_RIGHT = [C.ring_reduce_scatter, rs_leftward, rs_isend_in_place, rs_explicit_bounds]
RS_WRONG = [
    (rs_allreduce_convention, "rank r ends with chunk r", ["rank 0 ends with the sum of chunk 1, not of chunk 0",
                                                           "(r + 1) % N on rank r"]),
    (rs_replaces, "rank r ends with chunk r", ["are missing", "own contribution is gone"]),
    (rs_wrong_slot, "rank r ends with chunk r", ["First went wrong: step 2", "holding 1 contribution(s)",
                                                 "must be the one it added into at step k"]),
    (rs_via_allreduce, "exactly N-1 steps", ["took 6 steps", "no all-gather phase"]),
    (rs_whole_vectors, "one chunk per message", ["(the whole vector)", "at most one chunk: ceil(12/4) = 3"]),
    (rs_direct, "only between ring neighbours", ["rank 0 sent to rank 2"]),
    (rs_central, "only between ring neighbours", ["central reduction through one rank", "rank 0"]),
    (rs_returns_whole_vector, "every rank returns its result", ["shape (12,) (the whole vector)",
                                                                "np.array_split(vector, world_size)[rank]"]),
    (rs_forwards_what_arrived, "rank r ends with chunk r", [
        "First went wrong: step 2: rank 0 sent rank 1 a chunk holding 1 contribution(s) (rank 3), exactly what "
        "it had received from rank 3 at step 1", "forward the chunk after adding your contribution"]),
    (rs_allreduce_indices, "rank r ends with chunk r", [
        "the contributions of ranks 1, 2 and 3 are missing", "With ring AllReduce's indices",
        "carried chunk 1 with the contributions of ranks 1, 2 and 3, so rank 0 completes chunk 1, not chunk 0"]),
    (rs_takes_turns, "exactly N-1 steps", ["took 6 steps", "Your loop is right (3 messages "
                                           "from every rank)", "comm.sendrecv"]),
    (rs_from_zeros, "rank r ends with chunk r", ["contributions of no rank (the value is 0)",
                                                 "not from np.zeros"]),
    (rs_skips_a_neighbour, "only between ring neighbours", ["rank 0 sent to rank 2",
                                                            "So rank 0's result is wrong too"]),
    (rs_assumes_length_divides, "every rank returns its result", [
        "world_size=4, length=13", "shape (3,)", "they have 4, 3, 3 and 3 elements, so chunk 0 has 4",
        "len(x) // N = 3", "np.array_split"]),
]


# ============================================================== tree_broadcast
def _heap(comm, x, root, parent=lambda i: (i - 1) // 2, children=lambda i: (2 * i + 1, 2 * i + 2),
          bound=True):
    """Position i = (rank - root) % N receives from parent(i), then sends to children(i)
    (only those below N if ``bound``)."""
    n = comm.world_size
    i = (comm.rank - root) % n
    if i:
        x = comm.recv((parent(i) + root) % n)
    for c in children(i):
        if c < n or not bound:
            comm.send(x, (c + root) % n)
    return x


def tb_right_first(comm, x, root):
    return _heap(comm, x, root, children=lambda i: (2 * i + 2, 2 * i + 1))


def tb_isend(comm, x, root):
    n = comm.world_size
    i = (comm.rank - root) % n
    if i:
        x = comm.irecv(((i - 1) // 2 + root) % n).wait()
    reqs = [comm.isend(x, (c + root) % n, chunk=0, op="copy") for c in (2 * i + 1, 2 * i + 2) if c < n]
    for q in reqs:
        q.wait()
    return x


def tb_children_list(comm, x, root):
    """Builds the whole tree as a dict first; ranks, not positions, as keys."""
    n = comm.world_size
    rank_at = lambda p: (p + root) % n  # noqa: E731
    children = {rank_at(p): [rank_at(c) for c in (2 * p + 1, 2 * p + 2) if c < n] for p in range(n)}
    parent = {c: p for p, cs in children.items() for c in cs}
    data = x if comm.rank == root else comm.recv(parent[comm.rank])
    for c in children[comm.rank]:
        comm.send(data, c)
    return data


def tb_chain(comm, x, root):
    return C.chain_broadcast(comm, x, root)


def tb_around_rank_zero(comm, x, root):
    """Forgets the root: the heap starts at rank 0."""
    n, r = comm.world_size, comm.rank
    if r:
        x = comm.recv((r - 1) // 2)
    for c in (2 * r + 1, 2 * r + 2):
        if c < n:
            comm.send(x, c)
    return x


def tb_two_segments(comm, x, root):
    n = comm.world_size
    i = (comm.rank - root) % n
    parts = np.array_split(x, 2) if not i else [comm.recv(((i - 1) // 2 + root) % n) for _ in range(2)]
    for c in (2 * i + 1, 2 * i + 2):
        if c < n:
            for p in parts:
                comm.send(p, (c + root) % n)
    return np.concatenate(parts)


def tb_acks(comm, x, root):
    n = comm.world_size
    i = (comm.rank - root) % n
    out = C.tree_broadcast(comm, x, root)
    kids = [(c + root) % n for c in (2 * i + 1, 2 * i + 2) if c < n]
    if i:
        comm.send(np.zeros(1), ((i - 1) // 2 + root) % n, tag=1)
    for k in kids:
        comm.recv(k, tag=1)
    return out


def tb_root_returns_nothing(comm, x, root):
    out = C.tree_broadcast(comm, x, root)
    return None if comm.rank == root else out


def tb_parent_from_one(comm, x, root):
    """The parent i // 2 of a heap numbered from 1: position 2 waits for position 1."""
    return _heap(comm, x, root, parent=lambda i: i // 2)


def tb_no_bound(comm, x, root):
    """No `child < n`: child positions past the end wrap around to real ranks."""
    return _heap(comm, x, root, bound=False)


TB_RIGHT = [C.tree_broadcast, tb_right_first, tb_isend, tb_children_list]
TB_WRONG = [
    (C.flat_broadcast, "parent to child", ["rank 0 (position 0) sent to rank 3", "flat broadcast"]),
    (C.binomial_broadcast, "parent to child", ["world_size=5", "binomial tree", "2i+1 and 2i+2"]),
    (tb_chain, "parent to child", ["rank 1 (position 1) sent to rank 2 (position 2)", "a chain"]),
    (tb_around_rank_zero, "runs without error", ["needs a numpy array", "count positions from the root"]),
    (tb_two_segments, "receives exactly once", ["rank 1 received 2 messages", "in one message"]),
    (tb_acks, "parent to child", ["rank 1 (position 1) sent to rank 0 (position 0)",
                                  "send nothing back to the parent"]),
    (tb_root_returns_nothing, "every rank returns its result", ["rank 0 returned NoneType"]),
    (tb_parent_from_one, "no deadlock", [
        "rank 2 waits for a message from rank 1, which has finished without sending it",
        "rank 0 sent rank 2 a message at step 2 that was never received",
        "the parent of position 2 is position (2 - 1) // 2 = 0, rank 0", "2i+1 and 2i+2"]),
    (tb_no_bound, "runs without error", [
        "send(dst=2): a rank cannot send to or from itself",
        "child positions 2i+1 = 5 and 2i+2 = 6 exist only below N = 4", "5 -> rank 1, 6 -> rank 2",
        "Skip a child position c >= N"]),
]


# ============================================================== binomial_broadcast
def _from_lowest_bit_parent(comm, x, root):
    """MPICH's labelling: receive from the parent, position i with its lowest set bit
    cleared. -> (N, i, that bit (or the first power of two >= N at the root), x)."""
    n = comm.world_size
    i = (comm.rank - root) % n
    mask = 1
    while mask < n:
        if i & mask:
            return n, i, mask, comm.recv((i - mask + root) % n)
        mask <<= 1
    return n, i, mask, x


def bb_lowest_bit(comm, x, root):
    """MPICH's labelling: the parent clears the lowest set bit; farthest child first."""
    n, i, mask, x = _from_lowest_bit_parent(comm, x, root)
    mask >>= 1
    while mask:
        if i + mask < n:
            comm.send(x, (i + mask + root) % n, chunk=0, op="copy")
        mask >>= 1
    return x


def bb_isend_doubling(comm, x, root):
    n = comm.world_size
    i = (comm.rank - root) % n
    if i:
        top = 1 << (i.bit_length() - 1)
        x = comm.irecv((i - top + root) % n).wait()
    d = 1 << i.bit_length() if i else 1
    while i + d < n:
        comm.isend(x, (i + d + root) % n).wait()
        d <<= 1
    return x


def bb_nearest_first(comm, x, root):
    n, i, mask, x = _from_lowest_bit_parent(comm, x, root)
    m = 1
    while m < mask:
        if i + m < n:
            comm.send(x, (i + m + root) % n)
        m <<= 1
    return x


def bb_extra_copy(comm, x, root):
    out = C.binomial_broadcast(comm, x, root)
    n = comm.world_size
    if n > 1 and comm.rank == root:
        comm.send(out, (root + 1) % n)
    if n > 1 and comm.rank == (root + 1) % n:
        comm.recv(root)
    return out


def bb_leaves_ack_root(comm, x, root):
    out = C.binomial_broadcast(comm, x, root)
    n = comm.world_size
    if comm.rank == (root + n - 1) % n and n > 1:
        comm.send(np.zeros(1), root, tag=1)
    if comm.rank == root and n > 1:
        comm.recv((root + n - 1) % n, tag=1)
    return out


def bb_ignores_root(comm, x, root):
    return C.binomial_broadcast(comm, x, 0)


BB_RIGHT = [C.binomial_broadcast, bb_lowest_bit, bb_isend_doubling]
BB_WRONG = [
    (bb_nearest_first, "at most ceil(log2 N) steps", ["took 3 steps", "wrong order", "farthest child first"]),
    (C.tree_broadcast, "at most ceil(log2 N) steps", ["world_size=7", "took 4 steps", "That is a binary tree"]),
    (C.flat_broadcast, "at most ceil(log2 N) steps", ["ceil(log2 4) = 2 steps", "sends to every rank itself"]),
    (tb_chain, "at most ceil(log2 N) steps", ["passes the data to the next one"]),
    (bb_extra_copy, "receives exactly once", ["rank 1 received 2 messages", "step 1: rank 0 -> rank 1",
                                              "step 3: rank 0 -> rank 1"]),
    (bb_leaves_ack_root, "the root receives nothing", ["sent a message to the root, rank 0"]),
    (bb_ignores_root, "runs without error", ["This case's root is rank"]),
]


# ============================================================== alltoall
def _own_out(comm, blocks):
    """(n, r, right, left, out): the list of received blocks, this rank's own in out[r]."""
    n, r, right, left = ring(comm)
    out = [None] * n
    out[r] = blocks[r]
    return n, r, right, left, out


def a2a_sequential(comm, blocks):
    n, r, _, _ = ring(comm)
    for d in range(n):
        if d != r:
            comm.send(blocks[d], d)
    return [blocks[r] if s == r else comm.recv(s) for s in range(n)]


def a2a_shift_sendrecv(comm, blocks):
    n, r, _, _, out = _own_out(comm, blocks)
    for k in range(1, n):
        out[(r - k) % n] = comm.sendrecv(blocks[(r + k) % n], (r + k) % n, (r - k) % n, chunk=(r, (r + k) % n))
    return out


def a2a_through_root(comm, blocks):
    n, r, _, _ = ring(comm)
    if r:
        comm.send(np.stack(blocks), 0)
        return list(comm.recv(0))
    rows = [np.stack(blocks)] + [comm.recv(s) for s in range(1, n)]
    for d in range(1, n):
        comm.send(np.stack([rows[s][d] for s in range(n)]), d)
    return [rows[s][0] for s in range(n)]


def a2a_everything_to_everyone(comm, blocks):
    n, r, _, _ = ring(comm)
    reqs = [comm.isend(np.stack(blocks), d) for d in range(n) if d != r]
    out = [blocks[r] if s == r else comm.recv(s)[r] for s in range(n)]
    for q in reqs:
        q.wait()
    return out


def a2a_twice(comm, blocks):
    n, r, _, _ = ring(comm)
    out = C.alltoall(comm, blocks)
    if n > 1:
        comm.sendrecv(blocks[(r + 1) % n], (r + 1) % n, (r - 1) % n)
    return out


def a2a_halves(comm, blocks):
    n, r, _, _ = ring(comm)
    for d in range(n):
        if d != r:
            for half in np.array_split(blocks[d], 2):
                comm.send(half, d)
    return [blocks[r] if s == r else np.concatenate([comm.recv(s), comm.recv(s)]) for s in range(n)]


def a2a_keeps_own(comm, blocks):
    C.alltoall(comm, blocks)
    return list(blocks)


def a2a_sends_own_block_along(comm, blocks):
    n, r, _, _ = ring(comm)
    for d in range(n):
        if d != r:
            comm.send(np.stack([blocks[d], blocks[r]]), d)
    return [blocks[r] if s == r else comm.recv(s)[0] for s in range(n)]


def a2a_wrong_slot(comm, blocks):
    n, r, _, _, out = _own_out(comm, blocks)
    for k in range(1, n):
        out[(r + k) % n] = comm.sendrecv(blocks[(r + k) % n], (r + k) % n, (r - k) % n)
    return out


def a2a_acks(comm, blocks):
    n, r, _, _ = ring(comm)
    out = a2a_sequential(comm, blocks)
    for d in range(n):
        if d != r:
            comm.send(np.zeros(0), d, tag=1)
    for s in range(n):
        if s != r:
            comm.recv(s, tag=1)
    return out


def a2a_forgets_own_block(comm, blocks):
    n, r, _, _ = ring(comm)
    out = [None] * n                            # out[r] = blocks[r] missing
    for k in range(1, n):
        out[(r - k) % n] = comm.sendrecv(blocks[(r + k) % n], (r + k) % n, (r - k) % n)
    return out


def a2a_xor_for_any_n(comm, blocks):
    n, r, _, _, out = _own_out(comm, blocks)
    for k in range(1, n):
        partner = r ^ k                         # a pairing only when n is a power of two
        out[partner] = comm.sendrecv(blocks[partner], partner, partner)
    return out


A2A_RIGHT = [C.alltoall, C.pairwise_alltoall, a2a_sequential, a2a_shift_sendrecv]
A2A_WRONG = [
    (C.ring_alltoall, "straight to its destination", ["rank 0 sent rank 1 block 0->2", "ring AlltoAll"]),
    (a2a_through_root, "straight to its destination", ["rank 1 sent rank 0 block 1->2",
                                                       "goes to or from rank 0", "two hops"]),
    (a2a_everything_to_everyone, "straight to its destination", ["rank 0 sent rank 2 block 0->1",
                                                                 "carries only blocks[2]"]),
    (a2a_sends_own_block_along, "own block never travels", ["rank 0 sent rank 1 block 0->0",
                                                            "Keep blocks[rank] for yourself"]),
    (a2a_twice, "sent exactly once", ["was sent 2 times, at steps"]),
    (a2a_halves, "blocks travel whole", ["1 of the 2 elements of block 0->1"]),
    (a2a_keeps_own, "the block each rank sent it", ["rank 0's out[1] holds block 0->1",
                                                   "you kept what you send"]),
    (a2a_wrong_slot, "the block each rank sent it", ["rank 0's out[1] holds block 3->0", "came from rank 3"]),
    (a2a_acks, "every message carries blocks", ["a message with no block in it"]),
    (a2a_forgets_own_block, "the block each rank sent it", ["rank 0's out[0] holds None",
                                                            "out[rank] = blocks[rank]"]),
    (a2a_xor_for_any_n, "runs without error", ["world_size=3", "IndexError", "XOR pairing",
                                               "rank 1's partner in round 2 would be 1 ^ 2 = 3",
                                               "send to (rank + k) % N and receive from (rank - k) % N"]),
]


# ============================================================== ring_alltoall
def _nearest_right(r, n):
    return [(r + d) % n for d in range(1, n)]


def _nearest_left(r, n):
    return [(r - d) % n for d in range(1, n)]


def _r2a(comm, blocks, queue=_nearest_right, keep=0, forward=lambda rest, kept: rest, leftward=False):
    """A ring AlltoAll, or a mistake in one: the blocks queued in ``queue(r, n)`` order
    travel right (left if ``leftward``), stacked; the receiver keeps ``got.pop(keep)`` and
    passes on ``forward(the rest, the kept one)``."""
    n, r, right, left = ring(comm)
    to, frm, side = (left, right, 1) if leftward else (right, left, -1)
    out = [None] * n
    out[r] = blocks[r]
    travelling = [blocks[c] for c in queue(r, n)]
    for k in range(n - 1):
        got = list(comm.sendrecv(np.stack(travelling), to, frm))
        kept = got.pop(keep)
        out[(r + side * (k + 1)) % n] = kept
        travelling = forward(got, kept)
    return out


def r2a_leftward(comm, blocks):
    return _r2a(comm, blocks, _nearest_left, leftward=True)


def r2a_shortest_way(comm, blocks):
    """Each block goes the shorter way round: right for distances up to N/2, left for the rest."""
    n, r, right, left, out = _own_out(comm, blocks)
    far_right = n // 2
    go_right = [blocks[(r + d) % n] for d in range(1, far_right + 1)]
    go_left = [blocks[(r - d) % n] for d in range(1, n - far_right)]
    k = 0
    while go_right or go_left:
        if go_right:
            got = comm.sendrecv(np.concatenate(go_right), right, left)
            parts = np.split(got, len(go_right))
            out[(r - k - 1) % n] = parts[0]
            go_right = parts[1:]
        if go_left:
            got = comm.sendrecv(np.concatenate(go_left), left, right)
            parts = np.split(got, len(go_left))
            out[(r + k + 1) % n] = parts[0]
            go_left = parts[1:]
        k += 1
    return out


def r2a_isend_concat(comm, blocks):
    n, r, right, left, out = _own_out(comm, blocks)
    travelling = [blocks[c] for c in _nearest_right(r, n)]
    for k in range(n - 1):
        rq = comm.irecv(left)
        sq = comm.isend(np.concatenate(travelling), right)
        parts = np.split(rq.wait(), n - 1 - k)
        sq.wait()
        out[(r - k - 1) % n] = parts[0]
        travelling = parts[1:]
    return out


def r2a_no_forwarding(comm, blocks):
    """The published version: sends its blocks to the right, keeps one, forwards nothing."""
    n, r, right, left, out = _own_out(comm, blocks)
    for k in range(n - 1):
        got = comm.sendrecv(np.stack([blocks[(r + d) % n] for d in range(1, n)]), right, left)
        out[left] = got[0]
    return out


def r2a_forwards_everything(comm, blocks):
    return _r2a(comm, blocks, lambda r, n: _nearest_right(r, n) + [r],
                forward=lambda rest, kept: rest + [kept])


def r2a_one_message_per_block(comm, blocks):
    n, r, right, left, out = _own_out(comm, blocks)
    travelling = [blocks[c] for c in _nearest_right(r, n)]
    for k in range(n - 1):
        got = [comm.sendrecv(b, right, left) for b in travelling]
        out[(r - k - 1) % n] = got[0]
        travelling = got[1:]
    return out


def r2a_sends_twice(comm, blocks):
    n, r, right, left = ring(comm)
    out = C.ring_alltoall(comm, blocks)
    if n > 1:
        comm.sendrecv(np.stack([blocks[right]]), right, left)
    return out


def r2a_forwards_the_kept_block(comm, blocks):
    return _r2a(comm, blocks, forward=lambda rest, kept: [kept] + rest)      # should be rest


def r2a_keeps_the_last(comm, blocks):
    return _r2a(comm, blocks, keep=-1)


def r2a_farthest_first(comm, blocks):
    return _r2a(comm, blocks, _nearest_left)


def r2a_pairwise_indices(comm, blocks):
    n, r, right, left, out = _own_out(comm, blocks)
    for k in range(1, n):
        out[(r - k) % n] = comm.sendrecv(blocks[(r + k) % n], right, left)
    return out


R2A_RIGHT = [C.ring_alltoall, r2a_leftward, r2a_shortest_way, r2a_isend_concat]
R2A_WRONG = [
    (r2a_no_forwarding, "the block each rank sent it", ["rank 0's out[1] holds None",
                                                        "the ranks in between forward them"]),
    (C.alltoall, "only between ring neighbours", ["rank 0 sent to rank 2", "direct AlltoAll"]),
    (C.pairwise_alltoall, "only between ring neighbours", ["rank 0 sent to rank 2"]),
    (r2a_forwards_everything, "further than it must", ["block 0->1 reached rank 1 at step 1, and rank 1 passed it on at step 2",
                                                       "Keep the block that is meant for you"]),
    (r2a_one_message_per_block, "at most N-1 steps", ["took 6 steps", "np.stack"]),
    (r2a_sends_twice, "one path, once", ["rank 0 sent block 0->1, which had already moved on to rank 1"]),
    (r2a_forwards_the_kept_block, "the block each rank sent it", [
        "First went wrong: at step 1 rank 1 received block 0->1, block 0->2, block 0->3 from rank 0, and passed "
        "on block 0->1, its own, at step 2", "Keep the block meant for you", "received 3 block(s) and passed on 3"]),
    (r2a_keeps_the_last, "the block each rank sent it", [
        "kept block 0->3, which is for rank 3, passing on block 0->1, its own", "kept the last block of the message",
        "the one for the receiver is the first"]),
    (r2a_farthest_first, "the block each rank sent it", [
        "rank 1 received block 0->3, block 0->2, block 0->1 from rank 0, and kept block 0->3",
        "lists its blocks farthest destination first", "Queue the blocks nearest destination first"]),
    (r2a_pairwise_indices, "the block each rank sent it", [
        "at step 2 rank 1 received block 0->2 from rank 0 and kept it, though it is for rank 2",
        "No rank ever passes a block on", "the pairwise exchange's choice"]),
]


# ============================================================== the tests
RIGHT = ([("ring_allgather", p) for p in AG_RIGHT] + [("fix_ring_allgather", p) for p in AG_RIGHT]
         + [("ring_reduce_scatter", p) for p in RS_RIGHT] + [("tree_broadcast", p) for p in TB_RIGHT]
         + [("binomial_broadcast", p) for p in BB_RIGHT] + [("alltoall", p) for p in A2A_RIGHT]
         + [("ring_alltoall", p) for p in R2A_RIGHT])
WRONG = ([("ring_allgather", *w) for w in AG_WRONG] + [("fix_ring_allgather", *w) for w in AG_WRONG]
         + [("ring_reduce_scatter", *w) for w in RS_WRONG] + [("tree_broadcast", *w) for w in TB_WRONG]
         + [("binomial_broadcast", *w) for w in BB_WRONG] + [("alltoall", *w) for w in A2A_WRONG]
         + [("ring_alltoall", *w) for w in R2A_WRONG])


@pytest.mark.parametrize("exercise, program", RIGHT, ids=[f"{e}-{p.__name__}" for e, p in RIGHT])
def test_correct_variants_pass(exercise, program):
    for seed in (0, 1):
        report = ringlab.grade(exercise, program, seed=seed)
        assert report.passed, str(report)
        assert report.cases_passed == report.cases_total >= 15


@pytest.mark.parametrize("exercise, program, check, phrases", WRONG,
                         ids=[f"{w[0]}-{w[1].__name__}" for w in WRONG])
def test_each_mistake_fails_with_a_specific_message(exercise, program, check, phrases):
    assert_fails(ringlab.grade(exercise, program, seed=0), check,
                 [*phrases, f'Reproduce: ringlab.grade("{exercise}", program, seed=0)'], exact=False)


def test_enough_variants_for_every_exercise():
    for ex in IDS:
        assert sum(e == ex for e, _ in RIGHT) >= 3 and sum(w[0] == ex for w in WRONG) >= 5, ex
    assert set(IDS) <= set(GRADERS)


@pytest.mark.parametrize("exercise", IDS)
def test_stub_is_not_implemented_and_docstring_states_the_signature(exercise):
    def stub(comm, *args):
        raise NotImplementedError
    report = ringlab.grade(exercise, stub, seed=0)
    assert report.not_implemented and "not implemented yet" in str(report)
    import importlib
    doc = importlib.import_module(f"ringlab.grading.collectives.{exercise}").__doc__
    assert f"exercise ``{exercise}``" in doc and ("Signature" in doc or "signature" in doc.lower())


def test_the_buggy_program_is_its_source_and_fails_only_from_three_ranks():
    namespace = {"np": np}
    exec(BUGGY_SOURCE, namespace)                                         # noqa: S102
    assert namespace["ring_allgather"].__code__.co_code == buggy_ring_allgather.__code__.co_code
    for n, ok in ((1, True), (2, True), (3, False), (5, False)):
        xs = [np.array([float(r), r + 0.5]) for r in range(n)]
        res = ringlab.run(buggy_ring_allgather, xs)
        assert all(np.array_equal(o, np.concatenate(xs)) for o in res.outputs) == ok
    # The fix is one index: forward blocks[(rank - k) % n] instead of x.
    assert ringlab.grade("fix_ring_allgather", ag_fixed, seed=3).passed


@pytest.mark.parametrize("exercise", IDS)
def test_reports_are_reproducible_from_their_seed(exercise):
    wrong = {w[0]: w[1] for w in WRONG}[exercise]
    a = ringlab.grade(exercise, wrong)
    assert str(ringlab.grade(exercise, wrong, seed=a.seed)) == str(a)


def test_ring_alltoall_path_check_catches_a_block_that_turns_back():
    from ringlab.grading.collectives import ring_alltoall as grader
    from ringlab.grading.kit.report import Case
    from ringlab.trace import Event
    case = Case(5, [], "world_size=5")
    # block 0->2 goes right to rank 1, then back: one direction only
    back = grader._check_path(case, (0, 2), [Event(1, 0, 1), Event(2, 1, 0), Event(3, 0, 4)])
    assert back.check == "no block travels further than it must" and "changed direction at rank 1" in back.what
    turn = grader._check_path(case, (0, 3), [Event(1, 0, 1), Event(2, 1, 2), Event(3, 2, 1)])
    assert turn.check == "no block travels further than it must" and "changed direction at rank 2" in turn.what
    assert grader._check_path(case, (0, 3), [Event(1, 0, 4), Event(2, 4, 3)]) is None       # the short way
    assert grader._check_path(case, (0, 3), [Event(s, s - 1, s) for s in (1, 2, 3)]) is None  # the long way


def test_reduce_scatter_tells_a_lost_addition_from_a_lost_forward():
    # Both pass on a chunk exactly as it arrived; only the overwrite loses the rank's own part.
    overwrite = str(ringlab.grade("ring_reduce_scatter", rs_replaces, seed=0))
    forward = str(ringlab.grade("ring_reduce_scatter", rs_forwards_what_arrived, seed=0))
    assert "own contribution is gone" in overwrite and "after adding your contribution" not in overwrite
    assert "after adding your contribution" in forward and "own contribution is gone" not in forward


def test_the_four_ring_alltoall_mistakes_get_four_hints():
    hints = [ringlab.grade("ring_alltoall", p, seed=0).failure.hint
             for p in (r2a_forwards_the_kept_block, r2a_keeps_the_last, r2a_farthest_first, r2a_pairwise_indices)]
    assert len(set(hints)) == 4 and not any("out[c] must be what rank c sent to you" in h for h in hints)


def test_xor_hint_only_on_world_sizes_that_are_not_powers_of_two():
    from ringlab.grading.collectives.alltoall import _xor_hint
    from ringlab.grading.kit.report import Failure
    for n, expected in ((4, False), (8, False), (3, True), (6, True)):
        f = Failure("case", "check", "what", hint="h", error=RuntimeError())
        _xor_hint(f, n)
        assert ("power of two" in f.hint) == expected, n


@pytest.mark.parametrize("exercise", ["alltoall", "ring_alltoall"])
def test_blocks_of_strings_or_objects_get_a_diagnosis_not_a_crash(exercise):
    def returns_objects(comm, blocks):
        return [np.array([None, "x"], dtype=object) for _ in blocks]
    report = ringlab.grade(exercise, returns_objects, seed=0, log=False)
    assert not report.passed
    assert "holds something that is not a block" in str(report)
