"""Small programs that test files in several folders run on a simulated world."""

from ringlab.collectives import ring_allreduce


def central_allreduce(comm, x):
    """Everyone sends to rank 0, which adds and sends the sum back."""
    if comm.rank:
        comm.send(x, 0)
        return comm.recv(0)
    total = x + sum(comm.recv(src) for src in range(1, comm.world_size))
    for dst in range(1, comm.world_size):
        comm.send(total, dst)
    return total


def computes_and_groups(comm, x):
    """Every rank computes "forward" (1 ms); pairs (0, 1), (2, 3), ... all-reduce in
    groups dp[0], dp[1], ...; then every rank computes "optimizer" (2 ms)."""
    comm.compute(1e-3, "forward")
    pair = comm.split(comm.rank // 2, name="dp")
    y = ring_allreduce(pair, x)
    comm.compute(2e-3, "optimizer")
    return y
