"""Ring attention: K/V blocks travel around the ring; queries stay home.

Context parallelism splits every sequence over c ranks (``layout``). Each
rank computes q, k and v for its own n = s/c tokens; attention is the only
layer that needs the other ranks' tokens. Ring attention (Liu, Zaharia and
Abbeel 2023) passes the K/V blocks around a ring: in step t rank r holds
the block of rank r - t, attends its queries to it, merges the partial result
with the online-softmax rule (``blockwise.merge``) and passes the block on to
rank r + 1. After c steps every query has seen every key, and no rank ever
held more than one foreign block or the whole score matrix.

* **Overlap.** The block for step t + 1 travels while step t computes: the
  send/receive runs on the communication stream (``comm.start``) and the
  compute takes ``comm.compute(seconds, "attention")``, ``seconds_per_pair``
  for every (query, key) pair the mask leaves. With a network model the
  timeline shows each hop hidden under a block's compute when compute is
  longer; ``overlap=False`` sends after computing, for comparison.
* **Causal load.** With the contiguous layout rank r's queries see only
  blocks 0..r: rank c-1 computes c-1 full blocks and its diagonal, rank 0
  only its diagonal, and everyone waits for rank c-1. The zig-zag layout
  gives every rank the same work in every step.
* **Backward.** The gradients of a block's keys and values are summed where
  its queries are: the dK, dV accumulator of block j follows block j around
  the ring, one hop behind it. Rank r adds its share of block j's dK, dV
  (computed with the final ``lse``) to the accumulator that arrives from the
  left and passes it on to the right; after its c-th hop it is home, at rank
  j, complete. K/V make c - 1 hops, their gradients c.

Messages are labelled ``chunk=j``, the rank whose block (or whose block's
gradients) they carry. Each K/V message is one block, (2, b, G, n, d): K and V
stacked; no message carries the whole sequence.

    >>> import numpy as np, ringlab
    >>> from ringlab.frontier.blockwise import block_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 8, 4)) for _ in range(3))   # s = 8 tokens
    >>> blocks = [tuple(a[:, :, 2 * r:2 * r + 2] for a in (q, k, v)) for r in range(4)]
    >>> res = ringlab.run(lambda comm, qkv: ring_attention(comm, *qkv, causal=True), blocks)
    >>> want, _ = block_attention(q, k, v, np.arange(8), np.arange(8), causal=True)
    >>> bool(np.allclose(np.concatenate(res.outputs, axis=2), want, rtol=0, atol=1e-12))
    True
    >>> [(e.step, e.src, e.dst, e.chunk) for e in res.trace.filter(src=0)]   # 3 hops
    [(1, 0, 1, 0), (2, 0, 1, 3), (3, 0, 1, 2)]
"""

import numpy as np

from ..answers import answer
from .blockwise import block_attention, block_attention_backward, causal_pairs, merge
from .layout import positions


def _pass_right(comm, block, origin):
    """Send ``block`` (rank ``origin``'s) to the right, receive the left's."""
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    return comm.sendrecv(block, right, left, chunk=origin, op="copy")


def _hop(comm, block, origin, overlap):
    """Start the hop of ``block``: a ``Work`` on the communication stream, or (no
    overlap) a function that does it now; ``.wait()`` either way gives the next block.
    Alone on the ring (c = 1) the block is already home."""
    if comm.world_size == 1:
        return _Now(None, block, origin)
    if overlap:
        return comm.start(_pass_right, block, origin)
    return _Now(comm, block, origin)


class _Now:
    """A hop done when waited for: the blocking variant of a started ``Work``."""

    def __init__(self, comm, block, origin):
        self.args = comm, block, origin

    def wait(self):
        comm, block, origin = self.args
        return block if comm is None else _pass_right(comm, block, origin)


class RingAttention:
    """Ring attention of this rank's q, k, v blocks (b, H, n, d) and (b, G, n, d).

    ``forward(q, k, v)`` returns this rank's output block; ``lse`` keeps the
    log-sum-exp for ``backward(dout)``, which returns ``(dq, dk, dv)`` of this
    rank's blocks. Spans: ``ring_attention.forward``, ``ring_attention.backward``.
    """

    def __init__(self, comm, causal=True, layout="contiguous", seconds_per_pair=0.0,
                 overlap=True):
        self.comm, self.causal, self.layout = comm, causal, layout
        self.seconds_per_pair, self.overlap = seconds_per_pair, overlap

    def _positions(self, rank, n):
        return positions(self.layout, rank, self.comm.world_size, n)

    def _pairs(self, q_pos, k_pos):
        return causal_pairs(q_pos, k_pos) if self.causal else len(q_pos) * len(k_pos)

    @answer("ring_attention")
    def forward(self, q, k, v):
        comm, c, r = self.comm, self.comm.world_size, self.comm.rank
        n = q.shape[2]
        q_pos = self._positions(r, n)
        out = lse = None
        kv = np.stack([k, v])                         # one message per hop: this block's K and V
        with comm.span("ring_attention.forward"):
            for t in range(c):
                origin = (r - t) % c                  # whose block I hold in step t
                hop = _hop(comm, kv, origin, self.overlap) if t < c - 1 else None
                k_pos = self._positions(origin, n)
                pairs = self._pairs(q_pos, k_pos)
                if pairs:                             # a block wholly in the future is skipped
                    if self.seconds_per_pair:
                        comm.compute(self.seconds_per_pair * pairs, "attention", block=origin)
                    out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], q_pos, k_pos,
                                                                self.causal))
                if hop is not None:
                    kv = hop.wait()
        self.saved = q, k, v, out, lse
        return out

    def backward(self, dout):
        comm, c, r = self.comm, self.comm.world_size, self.comm.rank
        q, k, v, out, lse = self.saved
        n = q.shape[2]
        q_pos = self._positions(r, n)
        delta = (dout * out).sum(axis=-1)
        dq = np.zeros_like(q)
        kv, grads = np.stack([k, v]), None
        with comm.span("ring_attention.backward"):
            for t in range(c):
                origin = (r - t) % c
                hop = _hop(comm, kv, origin, self.overlap) if t < c - 1 else None
                k_pos = self._positions(origin, n)
                mine = np.zeros_like(kv)              # my share of block origin's dK, dV
                pairs = self._pairs(q_pos, k_pos)
                if pairs:
                    if self.seconds_per_pair:         # two matmuls per forward one, again twice
                        comm.compute(2 * self.seconds_per_pair * pairs, "attention.backward",
                                     block=origin)
                    dq_b, mine[0], mine[1] = block_attention_backward(
                        q, kv[0], kv[1], q_pos, k_pos, self.causal, lse, delta, dout)
                    dq += dq_b
                if grads is not None:                 # the accumulator from the left: same block
                    mine += grads.wait()
                grads = _hop(comm, mine, origin, self.overlap)   # on to its next visitor, or home
                if hop is not None:
                    kv = hop.wait()
            dkv = grads.wait()                        # my own block's dK, dV, complete
        return dq, dkv[0], dkv[1]


@answer("ring_attention")
def ring_attention(comm, q, k, v, causal):
    """This rank's output block of attention over the whole sequence, from its
    q, k, v blocks (batch, heads, s/c, head_dim), the sequence laid out
    contiguously (rank r holds tokens r*s/c .. (r+1)*s/c - 1); K/V travel
    around the ring, overlapped with compute. The reference answer of the
    exercise ``ring_attention``."""
    return RingAttention(comm, causal, "contiguous").forward(q, k, v)


@answer("ring_attention")
def zigzag_ring_attention(comm, q, k, v):
    """Causal ring attention with the zig-zag layout: rank r's blocks hold chunks
    r and 2c-1-r of the sequence (``layout``), which balances the causal work."""
    return RingAttention(comm, True, "zigzag").forward(q, k, v)
