"""Megatron's conjugate operators ``f`` and ``g``: where tensor parallelism communicates.

Shoeybi et al. (2019) write every tensor-parallel block as local matmuls
between two tiny operators:

* ``f`` (``CopyToTensorParallelRegion``): forward is the identity -- every rank
  already holds the same input X; backward is an AllReduce -- each rank's
  ``dX`` is only the part of the gradient that flows through its own columns,
  and the true ``dX`` is their sum.
* ``g`` (``ReduceFromTensorParallelRegion``): forward is an AllReduce -- each
  rank computed a partial sum of the output (its rows of W); backward is the
  identity -- the sum's gradient reaches every term unchanged.

They are *conjugate*: each is the other's transpose. Copying one value to t
places (f) has as adjoint adding t values up (g's AllReduce), and vice versa;
so what one does going forward, the other does going backward. A block
``f -> local work -> g`` therefore has exactly one AllReduce forward (in g)
and one backward (in f).

    >>> import numpy as np, ringlab
    >>> def program(comm, x):
    ...     f, g = CopyToTensorParallelRegion(comm), ReduceFromTensorParallelRegion(comm)
    ...     return f.forward(x), f.backward(x), g.forward(x), g.backward(x)
    >>> res = ringlab.run(program, [np.array([1.0]), np.array([2.0])])
    >>> [float(a[0]) for a in res.outputs[0]]      # f: same, sum; g: sum, same
    [1.0, 3.0, 3.0, 1.0]
"""

import numpy as np

from ..collectives import ring_allreduce
from ..nn import Module


def allreduce(comm, x):
    """Sum ``x`` over the tensor-parallel group with the ring AllReduce.

    The ring splits its vector into ``world_size`` chunks along the first axis;
    flattening first makes the chunks equal for any shape (a (2, T, h)
    activation on 4 ranks would otherwise give two empty chunks).
    """
    flat = np.array(x, copy=True).reshape(-1)
    return ring_allreduce(comm, flat, out=flat).reshape(np.shape(x))


def identity(comm, x):
    """``x`` as it is: what f does forward and g backward."""
    return x


class _Conjugate(Module):
    """An operator on the group ``comm``: ``_forward(comm, x)`` going forward,
    ``_backward(comm, dy)``, its transpose, going backward."""

    def __init__(self, comm):
        super().__init__()
        self.comm = comm

    def forward(self, x):
        return self._forward(self.comm, x)

    def backward(self, dy):
        return self._backward(self.comm, dy)


# Conjugate: each is the other with forward and backward swapped.
class CopyToTensorParallelRegion(_Conjugate):
    """Megatron's ``f``: identity forward, AllReduce backward."""
    _forward, _backward = staticmethod(identity), staticmethod(allreduce)


class ReduceFromTensorParallelRegion(_Conjugate):
    """Megatron's ``g``: AllReduce forward, identity backward."""
    _forward, _backward = staticmethod(allreduce), staticmethod(identity)


f, g = CopyToTensorParallelRegion, ReduceFromTensorParallelRegion   # the paper's names
