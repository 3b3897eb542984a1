"""Attention one key block at a time: partial results and the online-softmax merge.

Context parallelism never builds a rank's whole row of scores: a rank
attends its query block to one key/value block at a time and keeps, per
query, the output ``out`` and the log-sum-exp of its scores, ``lse``:

    lse = log sum_j exp(s_j),   out = sum_j exp(s_j - lse) v_j.

Two partial results over disjoint key sets merge exactly (the online-softmax
or log-sum-exp rule of Milakov & Gimelshein 2018, FlashAttention, and Ring
Attention; ``ring-flash-attn``'s ``_update_out_and_lse`` does the same)::

    lse = logaddexp(lse_a, lse_b)
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

so any number of blocks, in any order, give softmax(q k^T / sqrt(d)) v. A
query whose keys in a block are all masked has ``lse_b = -inf`` and weight 0.

Backward needs only ``lse`` and ``delta = sum(dout * out)`` per query: the
probabilities of block b are ``exp(s_b - lse)`` (recomputed, never stored),
and ``ds = p * (dout v^T - delta)``, summed into dq, dk and dv block by block.

Grouped-query attention: k and v may have G heads for q's H (G divides H);
query head h reads K/V head h // (H/G), and the K/V gradients are summed
over each group, as in ``ringlab.nn.CausalSelfAttention``.

    >>> import numpy as np
    >>> from ringlab.nn.attention import softmax
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 4, 3)) for _ in range(3))
    >>> pos = np.arange(4)
    >>> a = block_attention(q, k[:, :, :2], v[:, :, :2], pos, pos[:2], causal=True)
    >>> b = block_attention(q, k[:, :, 2:], v[:, :, 2:], pos, pos[2:], causal=True)
    >>> out, lse = merge(*a, *b)
    >>> s = np.where(np.triu(np.ones((4, 4), bool), 1), -np.inf, q @ k.swapaxes(-1, -2) / 3**.5)
    >>> bool(np.allclose(out, softmax(s) @ v, rtol=0, atol=1e-15))
    True
    >>> causal_pairs(pos, pos), causal_pairs(pos[:2], pos[2:])   # 4*5/2; a block all in the future
    (10, 0)
"""

import math

import numpy as np

from ..answers import answer


def _repeat(kv, heads):
    """K or V with G heads, repeated to ``heads`` query heads (a no-op copy if G = H)."""
    return np.repeat(kv, heads // kv.shape[1], axis=1)


def _fold(dkv, kv_heads):
    """A gradient over H query heads, summed over each group into G K/V heads."""
    B, H, n, d = dkv.shape
    return dkv.reshape(B, kv_heads, H // kv_heads, n, d).sum(axis=2)


def causal_pairs(q_pos, k_pos):
    """How many (query, key) pairs a causal mask leaves: key position <= query position."""
    return int((np.asarray(k_pos)[None, :] <= np.asarray(q_pos)[:, None]).sum())


def _scores(q, k, q_pos, k_pos, causal):
    s = q @ _repeat(k, q.shape[1]).swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(k_pos[None, :] > q_pos[:, None], -np.inf, s)   # key after query
    return s


# The block maths is what exercise ring_attention asks for: the learner writes it.
@answer("ring_attention")
def block_attention(q, k, v, q_pos, k_pos, causal):
    """Attention of queries ``q`` (B, H, m, d) at positions ``q_pos`` on one block
    of keys and values (B, G, n, d) at ``k_pos``: ``(out, lse)``, out (B, H, m, d)
    and lse (B, H, m); a query with every key masked gets out 0, lse -inf."""
    s = _scores(q, k, q_pos, k_pos, causal)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)          # a fully masked row: exp(-inf - 0) = 0
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]         # log 0 = -inf for a fully masked row
    out = (p @ _repeat(v, q.shape[1])) / np.where(total > 0, total, 1.0)
    return out, lse


@answer("ring_attention")
def merge(out_a, lse_a, out_b, lse_b):
    """The merge of two partial results over disjoint keys; ``out_a is None``
    (nothing yet) returns the second."""
    if out_a is None:
        return out_b, lse_b
    lse = np.logaddexp(lse_a, lse_b)
    finite = np.where(np.isfinite(lse), lse, 0.0)  # both -inf: both weights 0
    out = (np.exp(lse_a - finite)[..., None] * out_a + np.exp(lse_b - finite)[..., None] * out_b)
    return out, lse


def block_attention_backward(q, k, v, q_pos, k_pos, causal, lse, delta, dout):
    """This key block's share of the gradients: ``(dq, dk, dv)``, dk and dv with
    G heads. ``lse`` is the *final* log-sum-exp of each query (over all blocks),
    ``delta = (dout * out).sum(-1)`` with the final out."""
    H, G = q.shape[1], k.shape[1]
    p = np.exp(_scores(q, k, q_pos, k_pos, causal) - lse[..., None])   # masked: 0
    dv = _fold(p.swapaxes(-1, -2) @ dout, G)
    dp = dout @ _repeat(v, H).swapaxes(-1, -2)
    ds = p * (dp - delta[..., None]) / math.sqrt(q.shape[-1])
    dq = ds @ _repeat(k, H)
    dk = _fold(ds.swapaxes(-1, -2) @ q, G)
    return dq, dk, dv
