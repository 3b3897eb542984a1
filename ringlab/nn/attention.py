"""Causal multi-head self-attention, GPT-2 style, and its grouped-query form.

One fused Linear makes q, k and v; its output columns are laid out
[q | k | v], each of width dim, and inside each the heads follow one another in
blocks of head_dim columns. So head h of q is column block h of the q part:

    qkv columns:  [ q_0 q_1 .. q_{H-1} | k_0 .. k_{H-1} | v_0 .. v_{H-1} ]

Grouped-query attention (GQA, Ainslie et al. 2023; Llama 2 70B and Llama 3
use it) keeps all H query heads but only G = ``kv_heads`` key/value heads:
query head h uses key/value head ``h // (H // G)``, so each K/V head serves a
group of H/G consecutive query heads (the order of Hugging Face's
``repeat_kv`` and of vLLM's ``QKVParallelLinear``). The k and v parts then
have G head blocks each: qkv is ``Linear(dim, (H + 2G) * head_dim)``, and the
K/V cache shrinks by H/G. ``kv_heads=1`` is multi-query attention (MQA,
Shazeer 2019); ``kv_heads=n_heads`` (the default) is the layer above, with the
same weights from the same seed and the same numbers, bit for bit.

Heads never interact until the output projection, which is why tensor
parallelism can give each rank a subset of heads (its q, k and v column blocks
of ``qkv.weight`` and the matching rows of ``proj.weight``). The number of
heads is read from the width of qkv's output, so a rank holding fewer heads
runs this same code.

    >>> import numpy as np
    >>> attn = CausalSelfAttention(8, 2, np.random.default_rng(0))
    >>> x = np.random.default_rng(1).standard_normal((1, 3, 8))
    >>> y = attn.forward(x)
    >>> attn.probs[0, 0].round(2)    # head 0: row t attends to positions <= t
    array([[1.  , 0.  , 0.  ],
           [0.44, 0.56, 0.  ],
           [0.27, 0.32, 0.41]])
    >>> gqa = CausalSelfAttention(8, 4, np.random.default_rng(0), kv_heads=2)
    >>> gqa.qkv.params["weight"].shape           # (4 + 2 * 2) heads of 2 columns
    (8, 16)
    >>> gqa.forward(x).shape, gqa.k.shape        # 2 K/V heads serve 4 query heads
    ((1, 3, 8), (1, 2, 3, 2))
"""

import math

import numpy as np

from .dropout import Dropout
from .linear import Linear
from .module import Module


def softmax(x):
    """Softmax over the last axis; subtracting the row max keeps exp() finite."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class CausalSelfAttention(Module):
    """Input and output (batch, time, dim); position t sees only positions <= t.

    ``kv_heads``: the number of key/value heads G (default: ``n_heads``, plain
    multi-head attention); it must divide ``n_heads``.
    ``dropout=p`` drops attention probabilities (mask stream seeded with ``seed``);
    the default 0 is off, and then nothing is drawn or stored for it.
    """

    # Off unless __init__ sets one: a layer assembled from shards without
    # __init__ (as tensor-parallel code may do) still runs.
    drop = Dropout(0.0, seed=0)
    # None: as many K/V heads as query heads, read from qkv's width (so that a
    # tensor-parallel shard built without __init__ runs this code unchanged).
    kv_heads = None

    def __init__(self, dim, n_heads, rng, dtype=np.float64, dropout=0.0, seed=0, kv_heads=None):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim={dim} is not a multiple of n_heads={n_heads}")
        G = n_heads if kv_heads is None else kv_heads
        if not 1 <= G <= n_heads or n_heads % G:
            raise ValueError(f"kv_heads={G} must divide n_heads={n_heads}: each K/V "
                             f"head serves the same number of query heads")
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        if G != n_heads:
            self.kv_heads = G                       # else the class's None: read from the width
        self.qkv = Linear(dim, dim + 2 * G * self.head_dim, rng, dtype=dtype)
        self.proj = Linear(dim, dim, rng, dtype=dtype)
        self.drop = Dropout(dropout, seed)

    def head_counts(self, width):
        """(H, G): the query and K/V heads that a qkv output of ``width`` columns holds."""
        if self.kv_heads is None:                   # G = H, however many this layer holds
            return width // (3 * self.head_dim), width // (3 * self.head_dim)
        return width // self.head_dim - 2 * self.kv_heads, self.kv_heads

    def split_heads(self, qkv):
        """(B, T, (H + 2G)*hd) -> q (B, H, T, hd), k and v (B, G, T, hd)."""
        B, T, width = qkv.shape
        hd = self.head_dim
        H, G = self.head_counts(width)
        heads = lambda part: part.reshape(B, T, -1, hd).transpose(0, 2, 1, 3)  # noqa: E731
        return (heads(qkv[..., :H * hd]), heads(qkv[..., H * hd:(H + G) * hd]),
                heads(qkv[..., (H + G) * hd:]))

    def forward(self, x):
        self.q, self.k, self.v = q, k, v = self.split_heads(self.qkv.forward(x))
        B, H, T, hd = q.shape
        group = H // k.shape[1]                  # query heads per K/V head (1 without GQA)
        # Query head h reads K/V head h // group: repeat each K/V head group times.
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = q @ k.swapaxes(-1, -2) / math.sqrt(hd)         # (B, H, T, T)
        future = np.triu(np.ones((T, T), dtype=bool), k=1)      # key after query
        self.probs = softmax(np.where(future, -np.inf, scores))  # exp(-inf) = 0
        # Backward needs both the probabilities (softmax) and the dropped ones (@ v).
        self.dropped = self.drop.forward(self.probs) if self.drop.p else self.probs
        out = self.dropped @ v                                  # (B, H, T, hd)
        # Merge heads back: (B, T, H*hd), head h in column block h, as in qkv.
        return self.proj.forward(out.transpose(0, 2, 1, 3).reshape(B, T, H * hd))

    def backward(self, dy):
        q, k, v, p = self.q, self.k, self.v, self.probs
        B, H, T, hd = q.shape
        G = k.shape[1]
        group = H // G
        dout = self.proj.backward(dy).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        dv = self.dropped.swapaxes(-1, -2) @ dout                # per query head
        dp = self.drop.backward(dout @ np.repeat(v, group, axis=1).swapaxes(-1, -2))
        # Softmax backward: ds = p * (dp - sum_j p_j dp_j). Masked entries have
        # p = 0, so they get no gradient without looking at the mask again.
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / math.sqrt(hd)
        dq, dk = ds @ np.repeat(k, group, axis=1), ds.swapaxes(-1, -2) @ q
        # A repeated K/V head's gradient is the sum over the query heads it served.
        dk = dk.reshape(B, G, group, T, hd).sum(axis=2)
        dv = dv.reshape(B, G, group, T, hd).sum(axis=2)
        # Undo split_heads: each part (B, heads, T, hd) -> (B, T, heads*hd), side by side.
        merge = lambda d: d.transpose(0, 2, 1, 3).reshape(B, T, -1)   # noqa: E731
        return self.qkv.backward(np.concatenate([merge(dq), merge(dk), merge(dv)], axis=-1))

    def flops(self, x_shape):
        B, T, _ = x_shape
        width = self.head_counts(self.qkv.out_features)[0] * self.head_dim   # my query heads
        # q k^T and probs @ v: per query head, two matmuls of 2 * T * T * hd FLOPs each.
        return (self.qkv.flops(x_shape) + 2 * 2 * B * T * T * width
                + self.proj.flops((B, T, width)))
