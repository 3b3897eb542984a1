"""Grouped-query attention under tensor parallelism: when there are fewer K/V heads than ranks.

Megatron splits attention by heads: rank r of t keeps H/t query heads. With
GQA (``ringlab.nn.CausalSelfAttention(kv_heads=G)``) a query head needs its
K/V head, h // (H/G), so the K/V heads must go where their queries are:

* G >= t (t divides G): rank r keeps K/V heads ``r*G/t ..``, exactly the
  ones its H/t query heads use. Nothing is duplicated.
* G < t (G divides t): each K/V head serves H/G query heads spread over t/G
  ranks, and each of those ranks keeps a **replica** of it: rank r holds K/V
  head ``r // (t/G)`` (vLLM's ``QKVParallelLinear``: ``num_kv_head_replicas =
  tp_size // total_num_kv_heads``, a rank's K/V shard ``tp_rank //
  num_kv_head_replicas``). Each rank then computes that head's k and v for
  itself: more compute and memory (a K/V cache of 1 head per rank, not G/t)
  but no extra messages in forward or backward -- f's AllReduce already sums
  every rank's part of dx. What does cost a message is *training* the
  replicas: each computes the gradient of its K/V weights from its own query
  heads only, so the replicas' gradients must be summed (an AllReduce among
  the t/G ranks that share a head, ``sync_replicated_kv_grads``) before they
  step, or the copies drift apart.

``gqa_tp_layout`` says who holds what, ``gqa_tp_costs`` the bytes and memory;
``GQAParallelAttention`` is the layer.

    >>> gqa_tp_layout(n_heads=8, kv_heads=2, t=4)      # (query heads, K/V heads) per rank
    [(range(0, 2), range(0, 1)), (range(2, 4), range(0, 1)), \
(range(4, 6), range(1, 2)), (range(6, 8), range(1, 2))]
    >>> import numpy as np, ringlab
    >>> from ringlab.nn import CausalSelfAttention
    >>> attn = CausalSelfAttention(16, 8, np.random.default_rng(0), kv_heads=2)
    >>> x = np.random.default_rng(1).standard_normal((1, 3, 16))
    >>> def program(comm, x):
    ...     return GQAParallelAttention.from_attention(attn, comm).forward(x)
    >>> res = ringlab.run(program, [x] * 4)
    >>> bool(np.allclose(res.outputs[3], attn.forward(x), rtol=0, atol=1e-12))
    True
"""

import numpy as np

from ..collectives import ring_allreduce
from ..tensor_parallel import ColumnParallelLinear, ParallelAttention, RowParallelLinear
from ..tensor_parallel.dropout import ShardedDropout


def gqa_tp_layout(n_heads, kv_heads, t):
    """Per rank: (its query heads, its K/V heads), as ranges; K/V heads are
    replicated over t/G ranks when G < t."""
    H, G = n_heads, kv_heads
    if H % t:
        raise ValueError(f"tensor-parallel degree {t} does not divide the {H} query heads")
    if G >= t and G % t:
        raise ValueError(f"t = {t} ranks cannot split {G} K/V heads evenly (t must divide G)")
    if G < t and t % G:
        raise ValueError(f"{G} K/V heads cannot be replicated evenly over t = {t} ranks "
                         f"(G must divide t)")
    out = []
    for r in range(t):
        q = range(r * H // t, (r + 1) * H // t)
        kv = range(r * G // t, (r + 1) * G // t) if G >= t else range(r // (t // G),
                                                                       r // (t // G) + 1)
        out.append((q, kv))
    return out


def gqa_tp_costs(dim, n_heads, kv_heads, t, b, s, itemsize=8):
    """What one rank holds and sends, per layer, with ``GQAParallelAttention``:

    * ``kv_heads_per_rank``: max(G/t, 1); ``kv_replicas``: max(t/G, 1);
    * ``qkv_weight_bytes``: its columns of qkv, weight and bias,
      (dim + 1) * (H/t + 2 * kv_heads_per_rank) * head_dim;
    * ``kv_activation_bytes``: its k and v, 2 b s kv_heads_per_rank head_dim
      (the K/V cache of inference): G/t of the whole when G >= t, 1/G when G < t;
    * ``tp_allreduce_bytes``: g forward and f backward, 2 ring AllReduces of b s
      dim, 2(t-1)/t each (unchanged by GQA);
    * ``kv_grad_sync_bytes``: the replicas' gradient AllReduce, 2(r-1)/r of the
      K/V columns' 2 (dim + 1) head_dim numbers, r = kv_replicas (0 if r = 1).

    >>> costs = gqa_tp_costs(dim=4096, n_heads=32, kv_heads=8, t=16, b=1, s=4096, itemsize=2)
    >>> costs["kv_replicas"], costs["kv_activation_bytes"] // 2**20   # MiB of k and v
    (2, 2)
    """
    H, G = n_heads, kv_heads
    gqa_tp_layout(H, G, t)                                  # the checks
    hd = dim // H
    g_local, replicas = max(G // t, 1), max(t // G, 1)
    kv_cols = 2 * g_local * hd
    ring = lambda n, p: 2 * (p - 1) * n // p               # noqa: E731  ring AllReduce, n numbers
    return {
        "q_heads_per_rank": H // t, "kv_heads_per_rank": g_local, "kv_replicas": replicas,
        "qkv_weight_bytes": (dim + 1) * (H // t * hd + kv_cols) * itemsize,
        "kv_activation_bytes": 2 * b * s * g_local * hd * itemsize,
        "tp_allreduce_bytes": 2 * ring(b * s * dim, t) * itemsize,
        "kv_grad_sync_bytes": ring((dim + 1) * kv_cols, replicas) * itemsize,
    }


class GQAParallelAttention(ParallelAttention):
    """This rank's query heads of a GQA ``CausalSelfAttention`` and the K/V heads
    they use (replicas when G < t). Forward and backward as ``ParallelAttention``
    (f, my heads, g); ``kv_columns``: the positions of my K/V columns in my
    ``qkv`` shard; ``sync_replicated_kv_grads()`` sums their gradients over the
    ranks that hold the same K/V head (group ``kv_replicas``)."""

    @classmethod
    def from_attention(cls, attn, comm, **_):
        H, hd, t = attn.n_heads, attn.head_dim, comm.world_size
        G = attn.kv_heads or H
        q_heads, kv_heads = gqa_tp_layout(H, G, t)[comm.rank]
        cols = lambda heads, start: np.concatenate(       # noqa: E731
            [np.arange(start + h * hd, start + (h + 1) * hd) for h in heads])
        q_cols = cols(q_heads, 0)
        kv_cols = np.concatenate([cols(kv_heads, H * hd), cols(kv_heads, (H + G) * hd)])
        qkv = ColumnParallelLinear.from_linear(attn.qkv, comm,
                                               columns=np.concatenate([q_cols, kv_cols]))
        proj = RowParallelLinear.from_linear(attn.proj, comm, rows=q_cols)
        drop = ShardedDropout.from_dropout(attn.drop, comm, axis=1)   # probs: my query heads
        layer = cls(comm, q_heads, hd, qkv, proj, drop)
        layer.kv_heads, layer.kv_head_range = len(kv_heads), kv_heads
        layer.kv_columns = np.arange(len(q_cols), len(q_cols) + len(kv_cols))
        replicas = max(t // G, 1)
        # Every rank calls split (it is collective); ranks sharing a K/V head share a color.
        layer.replica_group = comm.split(kv_heads.start, name="kv_replicas") \
            if replicas > 1 else None
        return layer

    def sync_replicated_kv_grads(self):
        """Sum my K/V columns' weight and bias gradients over the replicas of my
        K/V head: each replica saw only its own query heads' share."""
        group = self.replica_group
        if group is None:
            return
        w, b = self.qkv.grads["weight"], self.qkv.grads["bias"]
        with group.span("tp.kv_grad_sync"):
            flat = np.concatenate([w[:, self.kv_columns].ravel(), b[self.kv_columns]])
            ring_allreduce(group, flat, out=flat)
        n = w.shape[0] * len(self.kv_columns)
        w[:, self.kv_columns] = flat[:n].reshape(w.shape[0], -1)
        b[self.kv_columns] = flat[n:]
