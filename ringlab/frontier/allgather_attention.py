"""All-gather context parallelism, as Llama 3 trains with it: gather K and V, keep Q local.

Every rank AllGathers the K/V blocks of all ranks (one ``ring_allgather`` of
its K and V stacked), then attends its own queries to the whole sequence's
keys in one block. Backward computes the gradients of every key and value
for its queries and ReduceScatters them (``ring_reduce_scatter``): rank r
keeps the sum, over all ranks' queries, for its own block.

Llama 3 (section 3.3.2) chose this over the ring "for two main reasons: (1)
it is easier and more flexible to support different types of attention masks
in all-gather based CP attention, such as the document mask; and (2) the
exposed all-gather latency is small as the communicated K and V tensors are
much smaller than Q tensor due to the use of GQA". The bytes equal the
ring's forward (each rank sends c-1 K/V blocks), but the gathered K/V of the
whole sequence is held at once, and the gather is not overlapped.

Any layout works, since the gathered keys carry their positions; here the
zig-zag one (``layout.shard`` hands out the blocks, ``unshard`` puts the
outputs back in sequence order):

    >>> import numpy as np, ringlab
    >>> from ringlab.frontier.blockwise import block_attention
    >>> from ringlab.frontier.layout import shard, unshard
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    >>> blocks = [[shard(a, r, 4, "zigzag", axis=2) for a in (q, k, v)] for r in range(4)]
    >>> prog = lambda comm, qkv: AllGatherAttention(comm, True, "zigzag").forward(*qkv)
    >>> res = ringlab.run(prog, blocks)
    >>> want, _ = block_attention(q, k, v, np.arange(8), np.arange(8), causal=True)
    >>> bool(np.allclose(unshard(res.outputs, "zigzag", axis=2), want, rtol=0, atol=1e-12))
    True
    >>> [s.path for s in res.trace.spans if s.rank == 0]
    ['allgather_attention.forward', 'allgather_attention.forward/ring_allgather']
"""

import numpy as np

from ..collectives import ring_allgather, ring_reduce_scatter
from .blockwise import block_attention, block_attention_backward
from .layout import gathered_positions, positions


class AllGatherAttention:
    """``forward(q, k, v)`` -> this rank's output block; ``backward(dout)`` ->
    ``(dq, dk, dv)``. Spans ``allgather_attention.forward`` / ``.backward``."""

    def __init__(self, comm, causal=True, layout="contiguous"):
        self.comm, self.causal, self.layout = comm, causal, layout

    def forward(self, q, k, v):
        comm, c = self.comm, self.comm.world_size
        n = q.shape[2]
        with comm.span("allgather_attention.forward"):
            kv = np.stack([k, v])                                   # (2, b, G, n, d)
            every = ring_allgather(comm, kv.reshape(-1)).reshape(c, *kv.shape)
            # (c, 2, b, G, n, d) -> K and V of the whole sequence, rank by rank.
            k_all, v_all = np.concatenate(list(every), axis=-2)
            out, lse = block_attention(q, k_all, v_all, positions(self.layout, comm.rank, c, n),
                                       gathered_positions(self.layout, c, n), self.causal)
        self.saved = q, k_all, v_all, out, lse
        return out

    def backward(self, dout):
        comm, c = self.comm, self.comm.world_size
        q, k_all, v_all, out, lse = self.saved
        n = q.shape[2]
        with comm.span("allgather_attention.backward"):
            dq, dk_all, dv_all = block_attention_backward(
                q, k_all, v_all, positions(self.layout, comm.rank, c, n),
                gathered_positions(self.layout, c, n), self.causal, lse,
                (dout * out).sum(axis=-1), dout)
            # Rank by rank, each rank's (dK, dV): chunk r of the ReduceScatter is rank r's.
            split = lambda d: np.stack(np.split(d, c, axis=-2))   # noqa: E731  (c, b, G, n, d)
            grads = np.stack([split(dk_all), split(dv_all)], axis=1)   # (c, 2, b, G, n, d)
            mine = ring_reduce_scatter(comm, grads.reshape(-1)).reshape(grads.shape[1:])
        return dq, mine[0], mine[1]
