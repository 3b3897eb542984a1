"""Bidirectional ring AllReduce: two rings at once, in opposite directions.

Cut the vector in two halves. The first half goes round the ring to the
right, exactly as in ``ring_allreduce``; the second goes round to the left,
the mirror image. Every step each rank sends two messages (one right, one
left) of n / (2N) bytes each, where the plain ring sends one of n / N.

What that buys depends on the network, and the two models of
``ringlab.cost.alpha_beta`` give two honest answers:

* one port per rank (``AlphaBeta(a, b)``, the default): a rank's two
  messages of a step leave through its one send port one after the other,
  so a step costs ``2 alpha + (n / N) beta``: the same bytes through the same
  port as the plain ring, and twice the messages. The bidirectional ring is
  *slower* by ``2 (N-1) alpha``; it buys nothing.
* one port per link (``AlphaBeta(a, b, ports="link")``: each direction of
  each neighbour link is its own wire, as with point-to-point NVLink or a
  torus): the two messages travel on different wires at once, a step costs
  ``alpha + (n / 2N) beta`` and the beta term halves. (Not for N = 2: there
  both halves cross the same link, towards the same neighbour.)

(See ``ringlab.cost.timing`` for the closed forms and the tests that check
them against the simulator.)
"""

import numpy as np

from ..answers import answer
from ..comm import collective


@answer('ring_allreduce')
@collective
def bidirectional_ring_allreduce(comm, x):
    """Sum ``x`` over all ranks: half of it on a ring to the right, half on a
    ring to the left, the two rings' messages interleaved step by step.

    >>> import numpy as np, ringlab
    >>> res = ringlab.run(bidirectional_ring_allreduce, [np.full(8, float(r)) for r in range(4)])
    >>> res.outputs[3]
    array([6., 6., 6., 6., 6., 6., 6., 6.])
    >>> res.trace.steps, len(res.trace)   # 2 (N-1) rounds of two messages per rank
    (12, 48)
    """
    n, rank = comm.world_size, comm.rank
    out = np.array(x, copy=True)           # never modify the caller's array
    if n == 1:
        return out
    halves = np.array_split(out, 2)        # views into `out`
    # Ring d = 0 runs to the right, ring d = 1 to the left. The left ring is
    # the right ring seen in a mirror: rank r plays position (-r) mod N, so
    # ring_allreduce's chunk arithmetic works unchanged on positions.
    rings = []
    for d, sign in enumerate((1, -1)):
        rings.append(dict(half=d, pos=(sign * rank) % n, to=(rank + sign) % n,
                          frm=(rank - sign) % n, chunks=np.array_split(halves[d], n)))
    for k in range(2 * (n - 1)):
        reducing = k < n - 1               # first reduce-scatter, then all-gather
        sends, recvs = [], []
        for ring in rings:
            p = ring["pos"]
            send_c = (p - k) % n if reducing else (p + 1 - (k - n + 1)) % n
            op = "reduce" if reducing else "copy"
            # tag = the ring: for N = 2 both rings talk to the same neighbour.
            sends.append(comm.isend(ring["chunks"][send_c], ring["to"],
                                    chunk=(ring["half"], send_c), op=op, tag=ring["half"]))
        for ring in rings:
            recvs.append(comm.irecv(ring["frm"], tag=ring["half"]))
        for ring, req in zip(rings, recvs):
            p, got = ring["pos"], req.wait()
            recv_c = (p - k - 1) % n if reducing else (p - (k - n + 1)) % n
            if reducing:
                ring["chunks"][recv_c] += got
            else:
                ring["chunks"][recv_c][...] = got
        for req in sends:
            req.wait()
    return out
