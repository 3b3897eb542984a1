"""Column- and row-parallel Linear layers (Megatron-LM), y = x @ W + b split over t ranks.

``ColumnParallelLinear`` splits W (in, out) by output *columns*: rank r keeps
``W[:, cols_r]`` and ``b[cols_r]``, sees the whole input X, and computes its
slice of the output with no communication. Backward, each rank's
``dY_r @ W_r^T`` is only a partial sum of dX (the part through its columns);
Megatron's ``f`` AllReduces it.

``RowParallelLinear`` splits W by input *rows*: rank r keeps ``W[rows_r, :]``
and gets the matching columns of X -- exactly the slice a column-parallel
layer leaves it. ``X_r @ W_r`` is a partial sum of the output; ``g``
AllReduces it, and then the bias is added, once (adding it on every rank
before the sum would count it t times). Backward is local.

Both are built from an unsharded ``ringlab.nn.Linear``, so a test can compare
them with the layer they came from; ``columns`` and ``rows`` say which part of
it a rank holds (its ``params``/``grads`` hold that part, accumulated +=):

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import Linear
    >>> fc, proj = Linear(4, 6, np.random.default_rng(0)), Linear(6, 4, np.random.default_rng(1))
    >>> x = np.random.default_rng(2).standard_normal((3, 4))
    >>> def program(comm, x):
    ...     col = ColumnParallelLinear.from_linear(fc, comm)     # X replicated
    ...     row = RowParallelLinear.from_linear(proj, comm)      # X split, as col leaves it
    ...     return col.columns, row.forward(col.forward(x))
    >>> res = ringlab.run(program, [x, x])
    >>> res.outputs[1][0]                           # rank 1's output columns of fc
    array([3, 4, 5])
    >>> bool(np.allclose(res.outputs[1][1], proj.forward(fc.forward(x)), rtol=0, atol=1e-12))
    True
"""

import numpy as np

from ..answers import answer
from ..collectives import ring_allgather
from ..nn import Module
from .operators import CopyToTensorParallelRegion, ReduceFromTensorParallelRegion


def my_block(n, comm, what):
    """The indices of this rank's equal contiguous block of ``range(n)``.

    Megatron requires equal shards; so do we, with an error that names both numbers.
    """
    t = comm.world_size
    if n % t:
        raise ValueError(f"tensor-parallel degree {t} does not divide {what}={n}")
    size = n // t
    return np.arange(comm.rank * size, (comm.rank + 1) * size)


class _Shard(Module):
    """What a shard shares with ``Linear``: its own (local) sizes and FLOPs, so
    ``flops`` of a tensor-parallel MLP or attention is this rank's part."""

    @property
    def in_features(self):
        return self.params["weight"].shape[0]

    @property
    def out_features(self):
        return self.params["weight"].shape[1]

    def flops(self, x_shape):
        """The local matmul's FLOPs, 2 * rows * in * out of my shard."""
        return 2 * int(np.prod(x_shape[:-1])) * self.in_features * self.out_features

    def out_shape(self, x_shape):
        return (*x_shape[:-1], self.out_features)


class ColumnParallelLinear(_Shard):
    """Y_r = X @ W[:, columns] + b[columns]; input replicated, output sharded by columns.

    ``gather_output=True`` AllGathers the shards so every rank returns the
    whole Y (in rank order of the shards); by default the output stays
    sharded, ready for a ``RowParallelLinear``.
    """

    def __init__(self, comm, weight, bias=None, *, columns, gather_output=False):
        super().__init__()
        self.comm, self.columns, self.gather_output = comm, columns, gather_output
        self.add_param("weight", weight)
        if bias is not None:
            self.add_param("bias", bias)
        self.f = CopyToTensorParallelRegion(comm)   # identity now, AllReduce of dX later

    @classmethod
    def from_linear(cls, linear, comm, *, columns=None, gather_output=False):
        """This rank's shard of ``linear``: ``columns`` (indices of its outputs),
        by default the rank's equal contiguous block."""
        if columns is None:
            columns = my_block(linear.out_features, comm, "out_features")
        bias = linear.params["bias"][columns] if "bias" in linear.params else None
        return cls(comm, linear.params["weight"][:, columns], bias,     # fancy indexing copies
                   columns=np.asarray(columns), gather_output=gather_output)

    @answer('column_parallel_linear')
    def forward(self, x):
        self.x = x = self.f.forward(x)
        y = x @ self.params["weight"]                # my columns of Y: no communication
        if "bias" in self.params:
            y = y + self.params["bias"]
        if self.gather_output:
            # ring_allgather concatenates along the first axis: bring the columns there.
            y = np.moveaxis(ring_allgather(self.comm, np.moveaxis(y, -1, 0)), 0, -1)
        return y

    @answer('column_parallel_linear')
    def backward(self, dy):
        if self.gather_output:
            # AllGather's backward is a split: keep the gradient of my own columns.
            width = self.params["weight"].shape[1]
            dy = dy[..., self.comm.rank * width:(self.comm.rank + 1) * width]
        x2, dy2 = self.x.reshape(-1, self.x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        self.grads["weight"] += x2.T @ dy2           # my columns of dW: local
        if "bias" in self.params:
            self.grads["bias"] += dy2.sum(axis=0)
        # dX through my columns only; the true dX sums every rank's: f AllReduces.
        return self.f.backward(dy @ self.params["weight"].T)


class RowParallelLinear(_Shard):
    """Y = sum_r X_r @ W[rows_r, :] + b; input sharded by columns, output replicated.

    Every rank holds the whole bias; its gradient comes out the same on every rank.
    """

    def __init__(self, comm, weight, bias=None, *, rows):
        super().__init__()
        self.comm, self.rows = comm, rows
        self.add_param("weight", weight)
        if bias is not None:
            self.add_param("bias", bias)
        self.g = ReduceFromTensorParallelRegion(comm)   # AllReduce now, identity later

    @classmethod
    def from_linear(cls, linear, comm, *, rows=None):
        """This rank's shard of ``linear``: ``rows`` (indices of its inputs),
        by default the rank's equal contiguous block."""
        if rows is None:
            rows = my_block(linear.in_features, comm, "in_features")
        bias = np.array(linear.params["bias"]) if "bias" in linear.params else None
        return cls(comm, linear.params["weight"][rows, :], bias, rows=np.asarray(rows))

    @answer('row_parallel_linear')
    def forward(self, x):
        self.x = x                                   # my columns of X
        y = self.g.forward(x @ self.params["weight"])   # partial sums -> the full product
        if "bias" in self.params:
            y = y + self.params["bias"]              # after the sum: added once, not t times
        return y

    @answer('row_parallel_linear')
    def backward(self, dy):
        dy = self.g.backward(dy)                     # identity: every rank has the whole dY
        x2, dy2 = self.x.reshape(-1, self.x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        self.grads["weight"] += x2.T @ dy2           # my rows of dW
        if "bias" in self.params:
            self.grads["bias"] += dy2.sum(axis=0)    # replicated: the same on every rank
        return dy @ self.params["weight"].T          # dX for my columns of X: exact, local
