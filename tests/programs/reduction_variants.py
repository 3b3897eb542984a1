"""The reference reductions with their arithmetic timed: after adding a received
chunk of b bytes, a rank spends ``gamma * b`` seconds (``comm.compute``). The
references themselves take no time to add; these copies exist only to check
the gamma terms of ``ringlab.cost.timing`` against the simulator. They do what
the references do, message for message."""

import numpy as np

from ringlab.collectives import binomial_broadcast, ring_allgather
from ringlab.mesh import DeviceMesh


def add(comm, into, got, gamma):
    into += got
    comm.compute(gamma * got.nbytes, "reduce")


def ring_reduce_scatter(comm, x, gamma):
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = np.array_split(np.array(x, copy=True), n)
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        add(comm, chunks[recv_c], comm.sendrecv(chunks[send_c], right, left, op="reduce"), gamma)
    return chunks[rank].copy()


def ring_allreduce(comm, x, gamma):
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    out = np.array(x, copy=True)
    chunks = np.array_split(out, n)
    for k in range(n - 1):
        send_c, recv_c = (rank - k) % n, (rank - k - 1) % n
        add(comm, chunks[recv_c], comm.sendrecv(chunks[send_c], right, left, op="reduce"), gamma)
    for k in range(n - 1):
        send_c, recv_c = (rank + 1 - k) % n, (rank - k) % n
        chunks[recv_c][...] = comm.sendrecv(chunks[send_c], right, left, op="copy")
    return out


def binomial_reduce(comm, x, gamma, root=0):
    n, rank = comm.world_size, comm.rank
    i = (rank - root) % n
    partial = np.array(x, copy=True)
    dist = 1
    while dist * 2 < n:
        dist *= 2
    while dist >= 1:
        if dist <= i < 2 * dist:
            comm.send(partial, (i - dist + root) % n, op="reduce")
            return None
        if i < dist and i + dist < n:
            add(comm, partial, comm.recv((i + dist + root) % n), gamma)
        dist //= 2
    return partial


def tree_allreduce(comm, x, gamma):
    return binomial_broadcast(comm, binomial_reduce(comm, x, gamma), 0)


def hierarchical_allreduce(comm, x, shape, gamma):
    mesh = DeviceMesh(comm, shape, ("node", "gpu"))
    part = ring_reduce_scatter(mesh.group("gpu"), x, gamma)
    part = ring_allreduce(mesh.group("node"), part, gamma)
    return ring_allgather(mesh.group("gpu"), part)
