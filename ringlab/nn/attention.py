"""Causal multi-head self-attention, GPT-2 style.

One fused Linear makes q, k and v; its output columns are laid out
[q | k | v], each of width dim, and inside each the heads follow one another in
blocks of head_dim columns. So head h of q is column block h of the q part:

    qkv columns:  [ q_0 q_1 .. q_{H-1} | k_0 .. k_{H-1} | v_0 .. v_{H-1} ]

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

    ``dropout=p`` drops attention probabilities (mask stream seeded with ``seed``);
    the default 0 is off, and then nothing is drawn or stored for it.
    """

    # Off unless __init__ sets one: a layer assembled from shards without
    # __init__ (as tensor-parallel code may do) still runs.
    drop = Dropout(0.0, seed=0)

    def __init__(self, dim, n_heads, rng, dtype=np.float64, dropout=0.0, seed=0):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim={dim} is not a multiple of n_heads={n_heads}")
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.qkv = Linear(dim, 3 * dim, rng, dtype=dtype)
        self.proj = Linear(dim, dim, rng, dtype=dtype)
        self.drop = Dropout(dropout, seed)

    def split_heads(self, qkv):
        """(B, T, 3*H*hd) -> q, k, v, each (B, H, T, hd)."""
        B, T, width = qkv.shape
        H = width // (3 * self.head_dim)
        q, k, v = qkv.reshape(B, T, 3, H, self.head_dim).transpose(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x):
        self.q, self.k, self.v = q, k, v = self.split_heads(self.qkv.forward(x))
        B, H, T, hd = q.shape
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
        dout = self.proj.backward(dy).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        dv = self.dropped.swapaxes(-1, -2) @ dout
        dp = self.drop.backward(dout @ v.swapaxes(-1, -2))
        # Softmax backward: ds = p * (dp - sum_j p_j dp_j). Masked entries have
        # p = 0, so they get no gradient without looking at the mask again.
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / math.sqrt(hd)
        dq, dk = ds @ k, ds.swapaxes(-1, -2) @ q
        # Undo split_heads: (3, B, H, T, hd) -> (B, T, 3, H, hd) -> (B, T, 3*H*hd).
        dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * H * hd)
        return self.qkv.backward(dqkv)

    def flops(self, x_shape):
        B, T, _ = x_shape
        width = self.qkv.out_features // 3          # H * hd: all heads this module holds
        # q k^T and probs @ v: per head, two matmuls of 2 * T * T * hd FLOPs each.
        return (self.qkv.flops(x_shape) + 2 * 2 * B * T * T * width
                + self.proj.flops((B, T, width)))
