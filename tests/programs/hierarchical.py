"""Programs for the ``hierarchical_allreduce`` grader: right ones, wrong ones, cheats.

Each takes ``(comm, x, mesh)``, mesh a ``DeviceMesh(comm, (M, G), ("node", "gpu"))``.
"""

import numpy as np

from ringlab import collectives as C
from ringlab.cost.hierarchical import hierarchical_allreduce

SHARED = {}     # what a cheat shares between ranks without messages


# ================================================================ right
def reference(comm, x, mesh):
    """The library's own (banned under `ringlab grade`, fine in-process)."""
    return hierarchical_allreduce(comm, x, mesh)


def part1_collectives(comm, x, mesh):
    """Part 1's ring collectives on the mesh's groups: the notebook's solution."""
    inside, across = mesh.group("gpu"), mesh.group("node")
    part = C.ring_reduce_scatter(inside, x)
    part = C.ring_allreduce(across, part)
    return C.ring_allgather(inside, part)


def _by_hand(comm, x, mesh, encode=lambda a: a, decode=lambda a: a, recv_first=False):
    """Send/recv on the world comm with global ranks. Rings run to the right; GPU j
    ends the ReduceScatter with block (j + 1) % G (every node alike, so same-index
    GPUs hold the same block). ``encode``/``decode``: applied to what crosses nodes."""
    m, g = mesh.shape
    i, j = mesh.coords
    out = x.copy()
    blocks = np.array_split(out, g)                 # views into out
    right, left = i * g + (j + 1) % g, i * g + (j - 1) % g
    for k in range(g - 1):                          # ReduceScatter inside the node
        blocks[(j - k - 1) % g] += comm.sendrecv(blocks[(j - k) % g], right, left)
    pieces = np.array_split(blocks[(j + 1) % g], m)  # views into my complete block
    up, down = ((i + 1) % m) * g + j, ((i - 1) % m) * g + j

    def swap(a):
        if recv_first:
            got = comm.recv(down)
            comm.send(encode(a), up)
            return decode(got)
        return decode(comm.sendrecv(encode(a), up, down))
    for k in range(m - 1):                          # ring AllReduce across nodes
        pieces[(i - k - 1) % m] += swap(pieces[(i - k) % m])
    for k in range(m - 1):
        pieces[(i - k) % m][...] = swap(pieces[(i - k + 1) % m])
    for k in range(g - 1):                          # AllGather inside the node
        blocks[(j - k) % g][...] = comm.sendrecv(blocks[(j - k + 1) % g], right, left)
    return out


def by_hand(comm, x, mesh):
    return _by_hand(comm, x, mesh)


def direct_reduce_scatter(comm, x, mesh):
    """Inside the node each block goes straight to its owner (round k: to GPU j + k),
    not around a ring: the same bytes and time on the stated network."""
    inside, across = mesh.group("gpu"), mesh.group("node")
    g, j = inside.world_size, inside.rank
    blocks = np.array_split(x, g)
    mine = blocks[j].copy()
    for k in range(1, g):
        mine += inside.sendrecv(blocks[(j + k) % g], (j + k) % g, (j - k) % g)
    mine = C.ring_allreduce(across, mine)
    return C.ring_allgather(inside, mine)


RIGHT = [reference, part1_collectives, by_hand, direct_reduce_scatter]


# ================================================================ wrong
def flat_ring(comm, x, mesh):
    """One ring over all M*G ranks: the right sum, N-1 / ... times the bytes across nodes."""
    return C.ring_allreduce(comm, x)


def full_vector_across(comm, x, mesh):
    """AllReduce inside the node, then the whole vector across nodes: no ReduceScatter."""
    node_sum = C.ring_allreduce(mesh.group("gpu"), x)
    return C.ring_allreduce(mesh.group("node"), node_sum)


def no_allgather(comm, x, mesh):
    """Returns its block of the total: the AllGather is missing."""
    part = C.ring_reduce_scatter(mesh.group("gpu"), x)
    return C.ring_allreduce(mesh.group("node"), part)


def rotated_rails(comm, x, mesh):
    """Node i's ReduceScatter ring starts at GPU i, so block c sits on GPU (c + i) % G:
    the right sum, but the rings across nodes link GPUs of different indices."""
    m, g = mesh.shape
    i, j = mesh.coords
    row = col = None
    for k in range(m):
        got = comm.new_group([k * g + (c + k) % g for c in range(g)], name=f"row[{k}]")
        row = got or row
    for c in range(g):
        got = comm.new_group([k * g + (c + k) % g for k in range(m)], name=f"col[{c}]")
        col = got or col
    part = C.ring_reduce_scatter(row, x)
    part = C.ring_allreduce(col, part)
    return C.ring_allgather(row, part)


def leader_per_node(comm, x, mesh):
    """GPU 0 of each node sums its node, AllReduces the whole vector with the other
    leaders and sends it back: the right sum, G times the bytes on one link."""
    m, g = mesh.shape
    i, j = mesh.coords
    head = i * g
    if j == 0:
        total = x.copy()
        for q in range(1, g):
            total += comm.recv(head + q)
        total = C.ring_allreduce(mesh.group("node"), total)
        for q in range(1, g):
            comm.send(total, head + q)
        return total
    comm.send(x, head)
    return comm.recv(head)


def serialised_rails(comm, x, mesh):
    """The right messages, but the G rings across nodes take turns (a barrier
    after each): G times the time between nodes."""
    inside, across = mesh.group("gpu"), mesh.group("node")
    part = C.ring_reduce_scatter(inside, x)
    for turn in range(inside.world_size):
        if inside.rank == turn:
            part = C.ring_allreduce(across, part)
        comm.barrier()
    return C.ring_allgather(inside, part)


def averaged(comm, x, mesh):
    return part1_collectives(comm, x, mesh) / comm.world_size


def recv_first(comm, x, mesh):
    """Every GPU waits for its neighbour across nodes before sending: a deadlock."""
    return _by_hand(comm, x, mesh, recv_first=True)


def allreduce_inside(comm, x, mesh):
    """AllReduce (not ReduceScatter) inside the node, then the block across, then
    AllGather: the right sum and cross-node bytes, 3/2 the bytes inside nodes."""
    inside, across = mesh.group("gpu"), mesh.group("node")
    node_sum = C.ring_allreduce(inside, x)
    mine = np.array_split(node_sum, inside.world_size)[inside.rank].copy()
    return C.ring_allgather(inside, C.ring_allreduce(across, mine))


def no_node_sum(comm, x, mesh):
    """Its own block of x across nodes, without the ReduceScatter inside the node."""
    inside, across = mesh.group("gpu"), mesh.group("node")
    mine = np.array_split(x, inside.world_size)[inside.rank].copy()
    return C.ring_allgather(inside, C.ring_allreduce(across, mine))


def no_step_across(comm, x, mesh):
    """ReduceScatter and AllGather inside the node, nothing across: each node's own sum."""
    inside = mesh.group("gpu")
    return C.ring_allgather(inside, C.ring_reduce_scatter(inside, x))


def recursive_halving_across(comm, x, mesh):
    """Across nodes, recursive halving then doubling (M a power of two), each
    exchange sent as the ring's pieces: the ring's bytes, to log2(M) partners."""
    inside, across = mesh.group("gpu"), mesh.group("node")
    block = C.ring_reduce_scatter(inside, x)
    m, me = across.world_size, across.rank
    if m & (m - 1):
        return C.ring_allgather(inside, C.ring_allreduce(across, block))
    pieces = [p.copy() for p in np.array_split(block, m)]
    lo, hi, d = 0, m, m // 2
    while d >= 1:                                  # halving: keep my half, summed
        partner, mid = me ^ d, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if me < partner else ((mid, hi), (lo, mid))
        reqs = [across.isend(pieces[j], partner) for j in range(*give)]
        for j in range(*keep):
            pieces[j] = pieces[j] + across.recv(partner)
        for q in reqs:
            q.wait()
        lo, hi, d = keep[0], keep[1], d // 2
    d = 1
    while d < m:                                   # doubling: gather the halves back
        partner, size = me ^ d, hi - lo
        other = lo - size if me & d else lo + size
        reqs = [across.isend(pieces[j], partner) for j in range(lo, hi)]
        for j in range(other, other + size):
            pieces[j] = across.recv(partner)
        for q in reqs:
            q.wait()
        lo, hi, d = min(lo, other), max(hi, other + size), d * 2
    return C.ring_allgather(inside, np.concatenate(pieces))


# ================================================================ cheats
def zeros_and_shared_memory(comm, x, mesh):
    """The right collectives on zeros; the real sum from a dict all ranks share."""
    SHARED[comm.rank] = x.copy()
    part1_collectives(comm, np.zeros_like(x), mesh)
    return np.sum([SHARED[q] for q in range(comm.world_size)], axis=0)


def negated_across(comm, x, mesh):
    """Every message between nodes negated on the way and negated back on arrival."""
    return _by_hand(comm, x, mesh, encode=np.negative, decode=np.negative)


def shared_through_files(folder):
    """Every rank writes its x to a file, reads everyone's, sends nothing."""
    def program(comm, x, mesh):
        np.save(f"{folder}/{comm.rank}.npy", x)
        comm.barrier()
        return np.sum([np.load(f"{folder}/{q}.npy") for q in range(comm.world_size)], axis=0)
    return program
