"""A whole transformer block with tensor parallelism (Megatron-LM), optionally sequence-parallel.

The pre-LN block is ``x + drop(attn(ln1(x)))`` then ``x + drop(mlp(ln2(x)))``.
Attention and MLP are each ``f -> local matmuls -> g``; the LayerNorms,
dropouts and residual adds are replicated: every rank does them on the
whole (b, s, h) activation. So a layer costs **2 AllReduces forward and 2
backward**, each of b*s*h elements. Shoeybi et al. (2019), Figure 4: "There
are 4 total communication operations in the forward and backward pass of a
single model parallel transformer layer"; Narayanan et al. (2021), section
3.3 (tensor and pipeline model parallelism): tensors of total size bsh are
all-reduced among t ranks twice each in the forward and in the backward pass,
per layer per microbatch: 8bsh(t-1)/t elements sent by each rank (a ring
AllReduce sends 2(t-1)/t of its vector), ``tp_bytes_per_layer`` below.

``sequence_parallel=True`` (Korthikanti et al. 2022) splits the replicated
regions along the sequence: input and output are (b, s/t, h), each AllReduce
becomes an AllGather and a ReduceScatter (see ``sequence``), and the
LayerNorm parameters' gradients become partial sums over my s/t tokens:
``sync_sequence_parallel_grads()`` AllReduces them over the tp group, as
Megatron's gradient sync does (``finalize_model_grads``).

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import TransformerBlock
    >>> block = TransformerBlock(dim=8, n_heads=4, hidden=32, rng=np.random.default_rng(0))
    >>> x = np.random.default_rng(1).standard_normal((2, 4, 8))
    >>> def program(comm, x):
    ...     return ParallelTransformerBlock.from_block(block, comm).forward(x)
    >>> res = ringlab.run(program, [x] * 2)
    >>> bool(np.allclose(res.outputs[1], block.forward(x), rtol=0, atol=1e-12))
    True
    >>> [c["span"] for c in res.trace.collectives() if c["span"].endswith("allreduce")]
    ['tp.block.forward/tp.attention.forward/ring_allreduce', \
'tp.block.forward/tp.mlp.forward/ring_allreduce']
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allreduce
from ..nn import LayerNorm, Module
from .attention import ParallelAttention
from .dropout import ShardedDropout, continue_stream
from .mlp import ParallelMLP
from .sequence import SEQ


def tp_bytes_per_layer(b, s, h, t, itemsize):
    """Bytes each rank sends per layer per microbatch, forward and backward:
    4 AllReduces of b*s*h elements, 2(t-1)/t of each (Narayanan et al. 2021, 3.3).
    Sequence parallelism sends the same (2 AllGathers + 2 ReduceScatters each way)
    when it keeps the gathered inputs; storing only their shards adds 2 AllGathers
    in backward: 10 instead of 8 halves, ``5/4`` of this."""
    return 8 * b * s * h * (t - 1) // t * itemsize


def copy_layernorm(ln):
    """A replica of ``ln`` (new arrays: each rank updates its own copy)."""
    out = LayerNorm(len(ln.params["weight"]), ln.eps, ln.params["weight"].dtype)
    for k in ln.params:
        out.params[k][...] = ln.params[k]
    return out


class ParallelTransformerBlock(Module):
    """This rank's part of a ``TransformerBlock``; parameter names are the block's.

    ``from_block(block, comm, sequence_parallel=False, store_input_shard=True)``.
    Forward runs in span ``tp.block.forward``, backward in ``tp.block.backward``,
    the LayerNorm gradient sync (sequence parallelism only) in ``tp.sp.grad_sync``.
    """

    def __init__(self, comm, ln1, attn, drop1, ln2, mlp, drop2, sequence_parallel):
        super().__init__()
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.ln1, self.attn, self.drop1 = ln1, attn, drop1
        self.ln2, self.mlp, self.drop2 = ln2, mlp, drop2

    @classmethod
    def from_block(cls, block, comm, sequence_parallel=False, store_input_shard=True):
        """The dropout streams continue from where ``block``'s stand: the next
        forward drops what ``block``'s next forward would."""
        kw = dict(sequence_parallel=sequence_parallel, store_input_shard=store_input_shard)
        attn = ParallelAttention.from_attention(block.attn, comm, **kw)
        mlp = ParallelMLP.from_mlp(block.mlp, comm, **kw)
        if sequence_parallel:       # dropout on my tokens, with the whole mask's rows
            drop1, drop2 = (ShardedDropout.from_dropout(d, comm, axis=SEQ)
                            for d in (block.drop1, block.drop2))
        else:                       # replicated: every rank draws and uses the whole mask
            drop1, drop2 = continue_stream(block.drop1), continue_stream(block.drop2)
        return cls(comm, copy_layernorm(block.ln1), attn, drop1, copy_layernorm(block.ln2),
                   mlp, drop2, sequence_parallel)

    @answer('tp_attention', 'megatron_mlp')
    def forward(self, x):
        """x: (b, s, h), or my tokens (b, s/t, h) with sequence parallelism."""
        with self.comm.span("tp.block.forward"):
            x = x + self.drop1.forward(self.attn.forward(self.ln1.forward(x)))
            return x + self.drop2.forward(self.mlp.forward(self.ln2.forward(x)))

    @answer('tp_attention', 'megatron_mlp')
    def backward(self, dy):
        with self.comm.span("tp.block.backward"):
            dy = dy + self.ln2.backward(self.mlp.backward(self.drop2.backward(dy)))
            return dy + self.ln1.backward(self.attn.backward(self.drop1.backward(dy)))

    def sync_sequence_parallel_grads(self):
        """Sum the LayerNorm gradients over the tp group (sequence parallelism only).

        Each rank's LayerNorms saw only its s/t tokens, so their weight and bias
        gradients are partial sums; the true gradient is their sum over the
        group. One AllReduce of the four vectors, concatenated.
        """
        if not self.sequence_parallel:
            return
        grads = [m.grads[k] for m in (self.ln1, self.ln2) for k in ("weight", "bias")]
        with self.comm.span("tp.sp.grad_sync"):
            flat = np.concatenate(grads)
            ring_allreduce(self.comm, flat, out=flat)
        for g, part in zip(grads, np.split(flat, len(grads))):
            g[...] = part

    def shard_index(self):
        """{name: index}: where each of my parameters sits in the unsharded block's,
        ``full[name][index]`` is my ``named_parameters()[name]``."""
        every = slice(None)
        out = {}
        for name in self.named_parameters():
            if name.endswith((".qkv.weight", ".fc.weight")):
                layer = self.attn.qkv if name.startswith("attn") else self.mlp.fc
                out[name] = (every, layer.columns)
            elif name.endswith((".qkv.bias", ".fc.bias")):
                out[name] = self.attn.qkv.columns if name.startswith("attn") else \
                    self.mlp.fc.columns
            elif name.endswith("proj.weight"):
                out[name] = (self.attn.proj if name.startswith("attn") else self.mlp.proj).rows
            else:                   # LayerNorms and the row-parallel biases: replicated
                out[name] = every
        return out
