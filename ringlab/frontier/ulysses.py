"""DeepSpeed-Ulysses: trade sequence shards for head shards with an AlltoAll, and back.

Before attention each rank holds all H heads of its n = s/c tokens. An
AlltoAll of q (and one of k, one of v) gives rank r heads r*H/c .. of the
*whole* sequence: it sends head group d of its tokens to rank d and
receives every rank's tokens of its own head group. Attention then runs per
head on whole sequences, with no communication, and a fourth AlltoAll turns
the output back into sequence shards (Jacobs et al. 2023, figure 1: "all-to-all
for the QKV projections with an aggregate message size of 3Nh before the
attention computation, and another all-2-all for output context projection
with a size Nh"). Backward runs the same four AlltoAlls the other way: dout
to head shards; dq, dk, dv back to sequence shards.

The heads must divide by c (and the K/V heads too, under GQA): unlike the
ring, Ulysses cannot use more ranks than there are heads.

    >>> import numpy as np, ringlab
    >>> from ringlab.frontier.blockwise import block_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 4, 8, 2)) for _ in range(3))    # 4 heads
    >>> blocks = [tuple(a[:, :, 4 * r:4 * r + 4] for a in (q, k, v)) for r in range(2)]
    >>> prog = lambda comm, qkv: UlyssesAttention(comm, causal=True).forward(*qkv)
    >>> res = ringlab.run(prog, blocks)
    >>> want, _ = block_attention(q, k, v, np.arange(8), np.arange(8), causal=True)
    >>> bool(np.allclose(np.concatenate(res.outputs, axis=2), want, rtol=0, atol=1e-12))
    True
    >>> [e.chunk for e in res.trace.filter(src=0)]      # q, k, v, out: one message each
    [(0, 1), (0, 1), (0, 1), (0, 1)]
"""

import numpy as np

from ..collectives import alltoall
from .blockwise import block_attention, block_attention_backward
from .layout import gathered_positions

HEADS, SEQ = 1, 2          # axes of (b, heads, tokens, d)


def seq_to_heads(comm, x):
    """(b, H, n, d) for my tokens -> (b, H/c, s, d): my head group, every token
    (rank by rank along the sequence axis). One AlltoAll."""
    c = comm.world_size
    if x.shape[HEADS] % c:
        raise ValueError(f"rank {comm.rank}: Ulysses over {c} ranks needs the heads to divide "
                         f"by {c}, got {x.shape[HEADS]} heads")
    got = alltoall(comm, np.split(x, c, axis=HEADS))      # block d: head group d, to rank d
    return np.concatenate(got, axis=SEQ)


def heads_to_seq(comm, x):
    """``seq_to_heads``' inverse: (b, H/c, s, d) -> (b, H, n, d). One AlltoAll."""
    c = comm.world_size
    got = alltoall(comm, np.split(x, c, axis=SEQ))        # block d: rank d's tokens, to rank d
    return np.concatenate(got, axis=HEADS)


class UlyssesAttention:
    """``forward(q, k, v)`` -> this rank's output block (b, H, n, d);
    ``backward(dout)`` -> ``(dq, dk, dv)``. Spans ``ulysses.forward`` / ``.backward``."""

    def __init__(self, comm, causal=True, layout="contiguous"):
        self.comm, self.causal, self.layout = comm, causal, layout

    def forward(self, q, k, v):
        comm = self.comm
        with comm.span("ulysses.forward"):
            qh, kh, vh = (seq_to_heads(comm, a) for a in (q, k, v))
            pos = gathered_positions(self.layout, comm.world_size, q.shape[SEQ])
            out, lse = block_attention(qh, kh, vh, pos, pos, self.causal)
            self.saved = qh, kh, vh, out, lse, pos
            return heads_to_seq(comm, out)

    def backward(self, dout):
        comm = self.comm
        qh, kh, vh, out, lse, pos = self.saved
        with comm.span("ulysses.backward"):
            douth = seq_to_heads(comm, dout)
            grads = block_attention_backward(qh, kh, vh, pos, pos, self.causal, lse,
                                             (douth * out).sum(axis=-1), douth)
            return tuple(heads_to_seq(comm, g) for g in grads)
