"""Dropout on a shard, with the masks of the unsharded layer.

A sharded layer must drop exactly the elements the unsharded one drops, or the
two could not be compared. Here every rank draws the *whole* mask from the
shared stream (the same seed and the same position in it on every rank) and
keeps its own block along ``axis``: heads for the attention probabilities,
the sequence for sequence parallelism. Every rank thus spends the time to
draw t times more random numbers than it uses -- fine at our sizes.

Megatron-LM does it differently: an RNG tracker (``CudaRNGStatesTracker``,
``tensor_parallel.random``) forks a per-rank stream (seed + 2718 + rank)
inside tensor-parallel regions, so each rank draws only its own part. Its
masks are then not those of any single-GPU run, which is fine for training
but would defeat our test that the sharded block equals the unsharded one.

    >>> import numpy as np, ringlab
    >>> from ringlab.nn import Dropout
    >>> whole = Dropout(0.5, seed=0)
    >>> def program(comm, x):
    ...     mine = ShardedDropout.from_dropout(whole, comm, axis=0)
    ...     return mine.forward(x)
    >>> res = ringlab.run(program, [np.ones(3), np.ones(3)])
    >>> np.concatenate(res.outputs), whole.forward(np.ones(6))
    (array([2., 0., 0., 0., 2., 2.]), array([2., 0., 0., 0., 2., 2.]))
"""

import copy

from ..nn import Dropout


def continue_stream(dropout):
    """A ``Dropout`` like ``dropout`` whose stream continues from where the
    unsharded module's stands: its next mask is the one ``dropout`` would draw next."""
    twin = Dropout(dropout.p, dropout.seed)
    twin.rng = copy.deepcopy(dropout.rng)
    return twin


class ShardedDropout(Dropout):
    """Dropout on block ``rank`` of ``parts`` equal blocks along ``axis``."""

    def __init__(self, p, seed, *, axis, rank, parts):
        super().__init__(p, seed)
        self.axis, self.rank, self.parts = axis, rank, parts

    @classmethod
    def from_dropout(cls, dropout, comm, *, axis):
        mine = cls(dropout.p, dropout.seed, axis=axis, rank=comm.rank, parts=comm.world_size)
        mine.rng = continue_stream(dropout).rng
        return mine

    def forward(self, x):
        if self.p == 0:
            return x
        shape = list(x.shape)
        size = shape[self.axis]
        shape[self.axis] = size * self.parts
        whole = self.draw(shape)                 # every rank draws the same whole mask ...
        index = [slice(None)] * x.ndim
        index[self.axis] = slice(self.rank * size, (self.rank + 1) * size)
        # ... and keeps a copy of its block: the whole mask is freed at once.
        return super().forward(x, mask=whole[tuple(index)].copy())
