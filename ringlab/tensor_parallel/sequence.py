"""Sequence parallelism (Korthikanti et al. 2022): the rest of the layer split along the sequence.

Tensor parallelism splits the matmuls, but LayerNorm, dropout and the residual
adds run on the whole (b, s, h) activation on every rank: the same work and
the same memory t times. They act on each token on its own, so they can just
as well be split along the *sequence*: rank r keeps tokens
``r*s/t .. (r+1)*s/t``.

Between the two kinds of region the layout must change, and Megatron's f and
g change with it (section 4.2.2 of the paper):

* ``g`` (``GatherFromSequenceParallelRegion``), before a column-parallel
  linear: the linear needs every token, so forward AllGathers the sequence;
  backward, each rank holds a *partial* dX of every token (through its
  columns only): a ReduceScatter both sums them and hands each rank its tokens.
* ``g_bar`` (``ReduceScatterToSequenceParallelRegion``), after a
  row-parallel linear: forward, each rank holds partial sums of every token;
  a ReduceScatter sums them and leaves each rank its tokens; backward is an
  AllGather of dY.

ReduceScatter is the backward of AllGather, and ReduceScatter + AllGather is
an AllReduce, with the same bytes: so per layer sequence parallelism sends
exactly what the AllReduce form sends, and saves the activation memory.

Our activations are (b, s, h); the collectives cut along the first axis, so
the operators move the sequence axis there (Megatron keeps (s, b, h) for this
reason) and back.

    >>> import numpy as np, ringlab
    >>> x = np.arange(2 * 4 * 1.0).reshape(2, 4, 1)          # (b, s, h), s = 4
    >>> def program(comm, x):
    ...     mine = x[:, 2 * comm.rank:2 * comm.rank + 2]       # my 2 tokens
    ...     return g(comm).forward(mine), g_bar(comm).forward(x)
    >>> res = ringlab.run(program, [x, x])
    >>> bool(np.array_equal(res.outputs[1][0], x))            # g: everyone has all tokens
    True
    >>> res.outputs[1][1][..., 0]                             # g_bar: 2x, rank 1's tokens
    array([[ 4.,  6.],
           [12., 14.]])
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allgather, ring_reduce_scatter
from .layers import ColumnParallelLinear, RowParallelLinear
from .operators import _Conjugate

SEQ = 1     # the sequence axis of a (b, s, h) activation


def allgather_sequence(comm, x):
    """(b, s/t, h) on each rank -> (b, s, h): every rank's tokens, in rank order."""
    b, n, h = x.shape
    flat = np.ascontiguousarray(np.moveaxis(x, SEQ, 0)).reshape(-1)   # (s/t, b, h) flat
    whole = ring_allgather(comm, flat).reshape(n * comm.world_size, b, h)
    return np.moveaxis(whole, 0, SEQ)


def reduce_scatter_sequence(comm, x):
    """(b, s, h) partial sums on each rank -> (b, s/t, h): the sum of my tokens."""
    b, s, h = x.shape
    if s % comm.world_size:
        raise ValueError(f"rank {comm.rank}: sequence parallelism needs the sequence length "
                         f"{s} to be a multiple of the tensor-parallel degree {comm.world_size}")
    flat = np.ascontiguousarray(np.moveaxis(x, SEQ, 0)).reshape(-1)   # (s, b, h) flat
    # Equal chunks of the flat (s, b, h) vector are blocks of s/t whole tokens.
    mine = ring_reduce_scatter(comm, flat).reshape(s // comm.world_size, b, h)
    return np.moveaxis(mine, 0, SEQ)


class GatherFromSequenceParallelRegion(_Conjugate):
    """The paper's g: AllGather of the sequence forward, ReduceScatter backward."""
    _forward, _backward = staticmethod(allgather_sequence), staticmethod(reduce_scatter_sequence)


class ReduceScatterToSequenceParallelRegion(_Conjugate):
    """The paper's g-bar: ReduceScatter along the sequence forward, AllGather backward."""
    _forward, _backward = staticmethod(reduce_scatter_sequence), staticmethod(allgather_sequence)


g, g_bar = GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion  # the paper's


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """A column-parallel linear whose input is a sequence shard (b, s/t, h): g replaces f.

    ``store_input_shard=True`` (the default, and what Megatron does,
    section 4.2.2 of the paper): keep only my s/t tokens of the input for
    backward, and AllGather them again there (span ``regather_input``) to
    compute dW. That costs one AllGather more per linear in backward (Megatron
    overlaps it with the dX matmul) and saves (t-1)/t of the stored input,
    which the paper's formula (sbh/t)(34 + 5as/h) assumes. ``False`` keeps
    the gathered input: the same bytes as the AllReduce form, more memory.
    """

    def __init__(self, comm, weight, bias=None, *, columns, gather_output=False,
                 store_input_shard=True):
        if gather_output:
            raise ValueError("a sequence-parallel column linear feeds a row-parallel one: "
                             "gather_output is not supported")
        super().__init__(comm, weight, bias, columns=columns)
        self.f = GatherFromSequenceParallelRegion(comm)   # g: where Megatron had f
        self.store_input_shard = store_input_shard

    @classmethod
    def from_linear(cls, linear, comm, *, columns=None, store_input_shard=True):
        layer = super().from_linear(linear, comm, columns=columns)
        layer.store_input_shard = store_input_shard
        return layer

    @answer('column_parallel_linear')
    def forward(self, x):
        y = super().forward(x)                   # g AllGathers x into self.x
        if self.store_input_shard:
            self.x, self.x_shard = None, x       # drop the gathered input; keep my tokens
        return y

    @answer('column_parallel_linear')
    def backward(self, dy):
        if self.store_input_shard:
            with self.comm.span("regather_input"):
                self.x = allgather_sequence(self.comm, self.x_shard)
        dx = super().backward(dy)                # dW from the whole input; g's ReduceScatter
        if self.store_input_shard:
            self.x = None
        return dx


class SequenceParallelRowLinear(RowParallelLinear):
    """A row-parallel linear whose output is a sequence shard: g-bar replaces g.

    The bias is added after the ReduceScatter, to my tokens only. Its gradient
    is still complete on every rank: backward AllGathers dY first, and sums it
    over all tokens. (Megatron adds the bias outside the layer, on the shard,
    and sums its gradient over the tp group with the LayerNorm's.)
    """

    def __init__(self, comm, weight, bias=None, *, rows):
        super().__init__(comm, weight, bias, rows=rows)
        self.g = ReduceScatterToSequenceParallelRegion(comm)
