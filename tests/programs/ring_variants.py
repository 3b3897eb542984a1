"""Ring AllReduce programs, right and wrong, shared by the grader tests.

Each wrong one is a mistake people really make; several appear together in a
widely copied published version of this exercise.
"""

import numpy as np


# ---------------------------------------------------------------- correct ones
def leftward_send_recv(comm, x):
    """Sends to the left with plain send/recv, no labels, chunks numbered from 1."""
    n, r = comm.world_size, comm.rank
    left, right = (r - 1) % n, (r + 1) % n
    chunks = [c.copy() for c in np.array_split(x, n)]
    for k in range(n - 1):
        comm.send(chunks[(r + k) % n], left)
        chunks[(r + k + 1) % n] += comm.recv(right)
    for k in range(n - 1):
        comm.send(chunks[(r + k - 1) % n], left)
        chunks[(r + k) % n] = comm.recv(right)
    return np.concatenate(chunks)


def isend_irecv_in_place(comm, x):
    """Modifies x in place, with isend/irecv and labels."""
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x, n)
    for k in range(2 * (n - 1)):
        send_c, recv_c = (r - k) % n, (r - k - 1) % n
        op = "reduce" if k < n - 1 else "copy"
        rq = comm.irecv((r - 1) % n)
        sq = comm.isend(chunks[send_c], (r + 1) % n, chunk=send_c, op=op)
        got = rq.wait()
        sq.wait()
        if k < n - 1:
            chunks[recv_c] += got
        else:
            chunks[recv_c][:] = got
    return x


def explicit_bounds(comm, x):
    """Computes chunk bounds by hand (correct for any length) instead of array_split."""
    n, r = comm.world_size, comm.rank
    out = x.copy()
    base, extra = divmod(len(x), n)
    bounds = [i * base + min(i, extra) for i in range(n + 1)]
    part = lambda c: out[bounds[c]:bounds[c + 1]]  # noqa: E731
    for k in range(n - 1):
        part((r - k - 1) % n)[:] += comm.sendrecv(part((r - k) % n), (r + 1) % n, (r - 1) % n)
    for k in range(n - 1):
        part((r - k) % n)[:] = comm.sendrecv(part((r - k + 1) % n), (r + 1) % n, (r - 1) % n)
    return out


# ---------------------------------------------------------------- wrong ones
def uses_rank_before_defined(comm, x):
    n = comm.world_size
    chunks = np.array_split(x.copy(), n)
    for k in range(n - 1):
        comm.send(chunks[(rank - k) % n], (rank + 1) % n)     # noqa: F821 - the bug
        rank = comm.rank
        chunks[(rank - k - 1) % n] += comm.recv((rank - 1) % n)
    return np.concatenate(chunks)


def _ring(comm, x, rs, ag, rs_sends=lambda chunk: chunk):
    """Two phases with index rules rs(k) and ag(k) -> (send_c, recv_c, accumulate);
    the reduce-scatter sends ``rs_sends(chunk)``."""
    n, r = comm.world_size, comm.rank
    out = x.copy()
    chunks = np.array_split(out, n)
    for k in range(n - 1):
        s, g, acc = rs(r, k, n)
        got = comm.sendrecv(rs_sends(chunks[s]), (r + 1) % n, (r - 1) % n)
        chunks[g][...] = chunks[g] + got if acc else got
    for k in range(n - 1):
        s, g, acc = ag(r, k, n)
        got = comm.sendrecv(chunks[s], (r + 1) % n, (r - 1) % n)
        chunks[g][...] = chunks[g] + got if acc else got
    return out


RS = lambda r, k, n: ((r - k) % n, (r - k - 1) % n, True)          # noqa: E731
AG = lambda r, k, n: ((r + 1 - k) % n, (r - k) % n, False)         # noqa: E731


def _sendrecv_ring(comm, x, rs_steps=-1, ag_steps=-1, chunks_of=np.array_split, rs_from=-1,
                   last_stops=False, hop=1):
    """The plain ring with sendrecv: N + ``rs_steps`` reduce-scatter steps, receiving
    from rank r + ``rs_from`` * ``hop``, then N + ``ag_steps`` all-gather steps, on the
    chunks ``chunks_of(out, N)``, sending to rank r + ``hop``; with ``last_stops`` rank
    N-1 returns after the reduce-scatter. The defaults are the right ring."""
    n, r = comm.world_size, comm.rank
    out = x.copy()
    chunks = chunks_of(out, n)
    for k in range(n + rs_steps):
        chunks[(r - k - 1) % n] += comm.sendrecv(chunks[(r - k) % n], (r + hop) % n,
                                                 (r + rs_from * hop) % n)
    if last_stops and r == n - 1:
        return out
    for k in range(n + ag_steps):
        chunks[(r - k) % n][...] = comm.sendrecv(chunks[(r + 1 - k) % n], (r + hop) % n,
                                                 (r - hop) % n)
    return out


def wrong_slot(comm, x):
    """Adds the received chunk into the slot of the chunk it sent (index from its own rank)."""
    return _ring(comm, x, lambda r, k, n: ((r - k) % n, (r - k) % n, True), AG)


def all_gather_reuses_rs_indices(comm, x):
    """Starts the all-gather from the chunk reduce-scatter started from: not fully reduced."""
    return _ring(comm, x, RS, lambda r, k, n: ((r - k) % n, (r - k - 1) % n, False))


def accumulates_in_all_gather(comm, x):
    return _ring(comm, x, RS, lambda r, k, n: ((r + 1 - k) % n, (r - k) % n, True))


def replaces_in_reduce_scatter(comm, x):
    return _ring(comm, x, lambda r, k, n: ((r - k) % n, (r - k - 1) % n, False), AG)


def one_step_too_few(comm, x):
    return _sendrecv_ring(comm, x, rs_steps=-2)


def one_step_too_many(comm, x):
    return _sendrecv_ring(comm, x, ag_steps=0)


def assumes_length_divides(comm, x):
    def equal_chunks(out, n):
        size = len(x) // n
        return [out[c * size:(c + 1) * size] for c in range(n)]
    return _sendrecv_ring(comm, x, chunks_of=equal_chunks)


def whole_vectors_around_ring(comm, x):
    n, r = comm.world_size, comm.rank
    total, passing = x.copy(), x.copy()
    for _ in range(n - 1):
        passing = comm.sendrecv(passing, (r + 1) % n, (r - 1) % n)
        total += passing
    return total


def central_reduction(comm, x):
    """Correct result, but everyone sends the whole vector to rank 0, which sums and sends back."""
    n, r = comm.world_size, comm.rank
    if r == 0:
        total = x.copy()
        for src in range(1, n):
            total += comm.recv(src)
        for dst in range(1, n):
            comm.send(total, dst)
        return total
    comm.send(x, 0)
    return comm.recv(0)


def receives_first_deadlock(comm, x):
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.copy(), n)
    for k in range(n - 1):
        chunks[(r - k - 1) % n] += comm.recv((r - 1) % n)
        comm.send(chunks[(r - k) % n], (r + 1) % n)
    return np.concatenate(chunks)


def not_implemented(comm, x):
    raise NotImplementedError


def all_gather_one_step_too_few(comm, x):
    return _sendrecv_ring(comm, x, ag_steps=-2)


def bad_neighbour(comm, x):
    """Forgets the wrap-around: rank N-1 sends to rank N."""
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.copy(), n)
    for k in range(n - 1):
        chunks[(r - k - 1) % n] += comm.sendrecv(chunks[(r - k) % n], r + 1, (r - 1) % n)
    return np.concatenate(chunks)


def last_rank_skips_all_gather(comm, x):
    """Rank N-1 returns after the reduce-scatter: its right neighbour waits for it forever."""
    return _sendrecv_ring(comm, x, last_stops=True)


def receives_from_the_wrong_side(comm, x):
    """Sends to the right and receives from the right too: each rank waits for its right neighbour."""
    return _sendrecv_ring(comm, x, rs_from=1)


def gathers_into_a_list_one_step_short(comm, x):
    """The all-gather loop runs N-2 times; np.concatenate then meets a chunk that never arrived."""
    n, r = comm.world_size, comm.rank
    chunks = [c.copy() for c in np.array_split(x, n)]
    for k in range(n - 1):
        chunks[(r - k - 1) % n] += comm.sendrecv(chunks[(r - k) % n], (r + 1) % n, (r - 1) % n)
    done = [None] * n
    done[(r + 1) % n] = chunks[(r + 1) % n]
    for k in range(n - 2):
        c = (r - k) % n
        done[c] = comm.sendrecv(done[(r + 1 - k) % n], (r + 1) % n, (r - 1) % n)
    return np.concatenate(done)


def ceil_chunks(comm, x):
    """Right: chunks of ceil(L/N) elements, the last ones shorter or empty (not array_split's)."""
    def ceil_split(out, n):
        size = -(-len(out) // n)
        return [out[c * size:(c + 1) * size] for c in range(n)]
    return _sendrecv_ring(comm, x, chunks_of=ceil_split)


def ring_on_zeros(comm, x):
    """Runs the ring on a zero buffer (x never copied in): every result is 0."""
    return _sendrecv_ring(comm, np.zeros_like(x))


def skips_a_neighbour(comm, x):
    """The right ring's indices, but it sends to rank + 2 and receives from rank - 2."""
    return _sendrecv_ring(comm, x, hop=2)
