"""Self-attention with its heads split over ranks (Megatron-LM).

Heads never interact until the output projection, so rank r takes a subset of
whole heads: its q, k and v column blocks of the fused ``qkv`` (column
parallel) and the matching rows of ``proj`` (row parallel). Scores, the causal
softmax and ``probs @ v`` are per head, hence local. As in the MLP, the block
is ``f -> qkv -> attention -> proj -> g``: one AllReduce forward, one backward.

The heads must divide evenly: a head cannot be split (its softmax needs all of
its q.k dot product), and Megatron gives every rank the same number.

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import CausalSelfAttention
    >>> attn = CausalSelfAttention(dim=8, n_heads=4, rng=np.random.default_rng(0))
    >>> x = np.random.default_rng(1).standard_normal((2, 3, 8))
    >>> def program(comm, x):
    ...     layer = ParallelAttention.from_attention(attn, comm)
    ...     return layer.heads, layer.forward(x)
    >>> res = ringlab.run(program, [x] * 2)
    >>> res.outputs[1][0]                          # rank 1 holds heads 2 and 3
    range(2, 4)
    >>> bool(np.allclose(res.outputs[1][1], attn.forward(x), rtol=0, atol=1e-12))
    True
"""

import numpy as np

from ..answers import answer
from ..nn import CausalSelfAttention, Module
from .dropout import ShardedDropout
from .layers import ColumnParallelLinear, RowParallelLinear
from .sequence import SequenceParallelColumnLinear, SequenceParallelRowLinear


def head_columns(heads, head_dim, dim):
    """``(qkv columns, proj rows)`` of the query heads ``heads`` (any of them, in
    order) of an attention of width ``dim``: head j is column block j of each of
    q, k and v in the fused ``qkv`` ([q | k | v], ``dim`` columns each) and row
    block j of ``proj``, blocks of ``head_dim``.

    >>> cols, rows = head_columns(range(2, 4), head_dim=1, dim=4)    # heads 2 and 3 of 4
    >>> cols.tolist(), rows.tolist()
    ([2, 3, 6, 7, 10, 11], [2, 3])
    """
    rows = np.concatenate([np.arange(j * head_dim, (j + 1) * head_dim) for j in heads]).astype(int)
    return np.concatenate([part * dim + rows for part in range(3)]), rows


class ParallelAttention(CausalSelfAttention):
    """This rank's heads of a ``CausalSelfAttention``.

    It runs the unsharded layer's own forward and backward: that code reads the
    number of heads from the width of ``qkv``'s output, so with a
    ``ColumnParallelLinear`` holding only my heads' columns and a
    ``RowParallelLinear`` holding their rows of ``proj``, the same lines
    compute my heads, and the two layers' f and g do the communication.

    ``sequence_parallel=True``: input and output are sequence shards
    (b, s/t, h), and g / g-bar of ``sequence`` replace f / g (see there,
    also for ``store_input_shard``). Attention dropout, if the layer has it,
    drops my heads' probabilities with the unsharded layer's mask.
    """

    def __init__(self, comm, heads, head_dim, qkv, proj, drop):
        Module.__init__(self)           # not CausalSelfAttention's: it would draw new weights
        self.comm, self.heads = comm, heads
        self.n_heads, self.head_dim = len(heads), head_dim
        self.qkv, self.proj, self.drop = qkv, proj, drop

    @classmethod
    def from_attention(cls, attn, comm, *, sequence_parallel=False, store_input_shard=True):
        H, hd, t = attn.n_heads, attn.head_dim, comm.world_size
        if attn.kv_heads is not None:
            raise ValueError(f"rank {comm.rank}: this layer has {attn.kv_heads} K/V heads for "
                             f"{H} query heads (grouped-query attention); ParallelAttention "
                             f"splits plain multi-head attention. Use GQAParallelAttention "
                             f"(Part 7), which also replicates K/V heads when t > kv_heads")
        if H % t:
            raise ValueError(f"tensor-parallel degree {t} does not divide the number of heads "
                             f"{H}: each rank must hold whole heads, the same number of them")
        heads = range(comm.rank * H // t, (comm.rank + 1) * H // t)
        # qkv's columns are [q | k | v]: my heads' block of each, so the local output
        # is again [my q | my k | my v], the layout split_heads expects.
        columns, mine = head_columns(heads, hd, H * hd)
        if sequence_parallel:
            qkv = SequenceParallelColumnLinear.from_linear(
                attn.qkv, comm, columns=columns, store_input_shard=store_input_shard)
            proj = SequenceParallelRowLinear.from_linear(attn.proj, comm, rows=mine)
        else:
            qkv = ColumnParallelLinear.from_linear(attn.qkv, comm, columns=columns)
            proj = RowParallelLinear.from_linear(attn.proj, comm, rows=mine)
        # probs are (b, heads, s, s): my heads are block `rank` of axis 1.
        drop = ShardedDropout.from_dropout(attn.drop, comm, axis=1)
        return cls(comm, heads, hd, qkv, proj, drop)

    @answer('tp_attention')
    def forward(self, x):
        with self.comm.span("tp.attention.forward"):
            return super().forward(x)       # qkv (f: no-op) -> my heads -> proj (g: AllReduce)

    @answer('tp_attention')
    def backward(self, dy):
        with self.comm.span("tp.attention.backward"):
            return super().backward(dy)     # proj (local) -> my heads -> qkv (f: AllReduce)
