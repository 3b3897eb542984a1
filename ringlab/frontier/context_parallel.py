"""Context-parallel attention: the ``ringlab.nn`` layer on this rank's tokens, and its bytes.

``ContextParallelAttention`` runs a ``CausalSelfAttention`` on this rank's
n = s/c tokens (b, n, dim): the qkv and output projections act token by token,
so they need nobody else; only the attention core in between talks, by one of
three methods:

* ``"ring"``: ``ring_attention.RingAttention``, K/V blocks around the ring;
* ``"allgather"``: ``allgather_attention.AllGatherAttention`` (Llama 3);
* ``"ulysses"``: ``ulysses.UlyssesAttention`` (AlltoAll to head shards).

The weights are replicated over the cp group and each rank's gradients are
partial sums over its tokens: their sum over the group (an AllReduce, like
data parallelism's) is the whole sequence's gradient.

**Bytes each rank sends** per layer and sequence, b sequences of s tokens, K/V
width ``h_kv`` = G * head_dim (h for plain attention), itemsize bytes each
(``cp_bytes_per_rank``; checked against traces in the tests):

=========== ================================ ==================================
method      forward                          backward
=========== ================================ ==================================
ring        (c-1) * 2 b (s/c) h_kv           (2c-1) * 2 b (s/c) h_kv (0 if c=1)
allgather   (c-1) * 2 b (s/c) h_kv           (c-1) * 2 b (s/c) h_kv
ulysses     (c-1)/c * b (s/c) (2h + 2h_kv)   the same
=========== ================================ ==================================

The ring and the all-gather send the same K/V forward: c-1 blocks of 2b(s/c)h_kv,
about 2bsh_kv in all, independent of c. Ulysses sends about 4bsh/c, a c-th of
that, falling with c (the DeepSpeed-Ulysses analysis: "4Nh/P", constant when N
and P grow together); it pays with a cap, c <= heads. Backward, the ring's
gradients go around once more (c hops, with the last one home).

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import CausalSelfAttention
    >>> from ringlab.frontier.layout import shard, unshard
    >>> attn = CausalSelfAttention(8, 2, np.random.default_rng(0))
    >>> x = np.random.default_rng(1).standard_normal((2, 8, 8))   # b = 2, s = 8, h = 8
    >>> def program(comm, x):
    ...     layer = ContextParallelAttention.from_attention(attn, comm, "ring", "zigzag")
    ...     return layer.forward(shard(x, comm.rank, 2, "zigzag", axis=1))
    >>> res = ringlab.run(program, [x, x])
    >>> y = unshard(res.outputs, "zigzag", axis=1)
    >>> bool(np.allclose(y, attn.forward(x), rtol=0, atol=1e-12))
    True
    >>> res.trace.bytes_sent() == [cp_bytes_per_rank("ring", c=2, h=8, s=8, b=2)] * 2
    True
"""

import copy

import numpy as np

from ..nn import Module
from .allgather_attention import AllGatherAttention
from .ring_attention import RingAttention
from .ulysses import UlyssesAttention

METHODS = {"ring": RingAttention, "allgather": AllGatherAttention, "ulysses": UlyssesAttention}


def cp_bytes_per_rank(method, c, h, s, b, itemsize=8, backward=False, h_kv=None):
    """Bytes one rank sends in the attention core of one layer: forward, or with
    ``backward=True`` the backward pass. ``h``: hidden size (query heads x
    head_dim); ``h_kv``: K/V width (default h); s tokens per sequence, b sequences.

    >>> cp_bytes_per_rank("ring", c=4, h=64, s=1024, b=1, itemsize=2)   # 3 * 2 * 256 * 64 * 2
    196608
    >>> cp_bytes_per_rank("ulysses", c=4, h=64, s=1024, b=1, itemsize=2)   # 3/4 * 256 * 256 * 2
    98304
    """
    h_kv = h if h_kv is None else h_kv
    if s % c:
        raise ValueError(f"{c} ranks cannot split {s} tokens evenly")
    n = s // c
    if method == "ring":
        # K/V make c-1 hops; backward, again, and their gradients c (the last one home).
        blocks = c - 1 if not backward else (2 * c - 1 if c > 1 else 0)
        return blocks * 2 * b * n * h_kv * itemsize
    if method == "allgather":                       # AllGather forward, ReduceScatter backward
        return (c - 1) * 2 * b * n * h_kv * itemsize
    if method == "ulysses":                         # q, k, v, out (dout, dq, dk, dv backward)
        return (c - 1) * b * n * (2 * h + 2 * h_kv) * itemsize // c
    raise ValueError(f"method must be one of {list(METHODS)}, not {method!r}")


class ContextParallelAttention(Module):
    """A ``CausalSelfAttention``'s projections around a context-parallel core.

    ``ContextParallelAttention(attn, comm, method, layout, **core_options)``
    uses ``attn``'s own ``qkv`` and ``proj`` (and ``split_heads``): pass a
    tensor-parallel ``ParallelAttention`` to split heads too (its projections
    then talk in their tp group, the core in ``comm``, the cp group).
    ``from_attention`` copies an unsharded layer's projections first, so
    every rank owns its replica. ``core_options``: ``seconds_per_pair``,
    ``overlap`` (ring only).
    """

    def __init__(self, attn, comm, method="ring", layout="zigzag", **core_options):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, not {method!r}")
        self.comm, self.method, self.layout = comm, method, layout
        self.qkv, self.proj, self.split_heads = attn.qkv, attn.proj, attn.split_heads
        causal = True
        self.core = METHODS[method](comm, causal, layout, **core_options)

    @classmethod
    def from_attention(cls, attn, comm, method="ring", layout="zigzag", **core_options):
        return cls(copy.deepcopy(attn), comm, method, layout, **core_options)   # my replica

    def forward(self, x):
        """x: this rank's tokens (b, n, dim), in the layout's order."""
        q, k, v = self.split_heads(self.qkv.forward(x))
        out = self.core.forward(q, k, v)                        # (b, H, n, hd)
        b, H, n, hd = self._heads_shape = out.shape
        return self.proj.forward(out.transpose(0, 2, 1, 3).reshape(b, n, H * hd))

    def backward(self, dy):
        b, H, n, hd = self._heads_shape
        dout = self.proj.backward(dy).reshape(b, n, H, hd).transpose(0, 2, 1, 3)
        dq, dk, dv = self.core.backward(dout)
        merge = lambda d: d.transpose(0, 2, 1, 3).reshape(b, n, -1)   # noqa: E731
        return self.qkv.backward(np.concatenate([merge(dq), merge(dk), merge(dv)], axis=-1))
