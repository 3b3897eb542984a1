"""The Megatron MLP (Shoeybi et al. 2019): column-parallel fc, local GeLU, row-parallel proj.

The transformer MLP is Y = GeLU(X A) B. Split A by columns and B by rows:
rank r computes GeLU(X A_r) B_r on its own, and Y is the sum over r. Why this
way round: GeLU is not linear, GeLU(a + b) != GeLU(a) + GeLU(b), so it cannot
be applied to partial sums; with A split by *columns* each rank holds complete
entries of X A (its columns), applies GeLU to them locally, and the split
along the hidden axis is exactly the split by rows that B needs. (Splitting A
by rows would need an AllReduce before the GeLU: two per forward.)

So the block is ``f -> fc -> GeLU -> proj -> g``: one AllReduce forward (g,
in proj) and one backward (f, in fc), each of a b*s*h activation.

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import MLP
    >>> mlp = MLP(dim=4, hidden=16, rng=np.random.default_rng(0))
    >>> x = np.random.default_rng(1).standard_normal((2, 3, 4))     # (b, s, h)
    >>> def program(comm, x):
    ...     return ParallelMLP.from_mlp(mlp, comm).forward(x)
    >>> res = ringlab.run(program, [x] * 4)
    >>> bool(np.allclose(res.outputs[3], mlp.forward(x), rtol=0, atol=1e-12))
    True
    >>> sorted({s.path for s in res.trace.spans if s.rank == 0})
    ['tp.mlp.forward', 'tp.mlp.forward/ring_allreduce']
"""

from ..answers import answer
from ..nn import GeLU, Module
from .layers import ColumnParallelLinear, RowParallelLinear
from .sequence import SequenceParallelColumnLinear, SequenceParallelRowLinear


class ParallelMLP(Module):
    """This rank's part of an ``MLP``: hidden units ``fc.columns`` (= ``proj.rows``).

    Parameter names are those of ``ringlab.nn.MLP`` (``fc.weight``, ...), holding shards.
    ``sequence_parallel=True``: input and output are sequence shards (b, s/t, h);
    see ``sequence``.
    """

    def __init__(self, comm, fc, act, proj):
        super().__init__()
        self.comm, self.fc, self.act, self.proj = comm, fc, act, proj

    @classmethod
    def from_mlp(cls, mlp, comm, *, sequence_parallel=False, store_input_shard=True):
        if sequence_parallel:
            fc = SequenceParallelColumnLinear.from_linear(mlp.fc, comm,
                                                          store_input_shard=store_input_shard)
            row = SequenceParallelRowLinear
        else:
            fc, row = ColumnParallelLinear.from_linear(mlp.fc, comm), RowParallelLinear
        # proj's rows must be the hidden units fc computes here: the same indices.
        proj = row.from_linear(mlp.proj, comm, rows=fc.columns)
        return cls(comm, fc, GeLU(mlp.act.approximate), proj)

    @answer('megatron_mlp')
    def forward(self, x):
        with self.comm.span("tp.mlp.forward"):
            h = self.fc.forward(x)           # (b, s, hidden/t): my hidden units, no communication
            h = self.act.forward(h)          # local: complete entries, so GeLU applies exactly
            return self.proj.forward(h)      # partial sums of Y -> the one AllReduce (g)
                                             # (with SP: g-bar's ReduceScatter)

    @answer('megatron_mlp')
    def backward(self, dy):
        with self.comm.span("tp.mlp.backward"):
            dh = self.proj.backward(dy)      # local: dY is replicated
            dh = self.act.backward(dh)
            return self.fc.backward(dh)      # partial dX -> the one AllReduce (f)

    def flops(self, x_shape):
        """My hidden units' matmuls: 1/t of the unsharded MLP's."""
        return self.fc.flops(x_shape) + self.proj.flops(self.fc.out_shape(x_shape))
