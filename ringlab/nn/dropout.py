"""Dropout: zero each element with probability p, scale the rest by 1/(1-p).

Deterministic: a ``Dropout`` owns a generator seeded with ``seed``, and every
forward draws the next mask from it, so two modules built with the same seed
drop the same elements, call after call. The tensor-parallel block relies on
that to reproduce the unsharded block's masks.

The mask is stored as a bool array, 1 byte per element: what backward needs,
and what Korthikanti et al. (2022) count in their activation-memory formulas.
``p=0`` is the identity and stores nothing.

    >>> import numpy as np
    >>> drop = Dropout(0.5, seed=0)
    >>> drop.forward(np.ones(6))
    array([2., 0., 0., 0., 2., 2.])
    >>> drop.mask.dtype, drop.backward(np.ones(6))     # the same elements pass
    (dtype('bool'), array([2., 0., 0., 0., 2., 2.]))
"""

import numpy as np

from .module import Module


class Dropout(Module):
    """Inverted dropout (as torch.nn.Dropout): training-time scaling, no parameters."""

    def __init__(self, p, seed):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1), not {p}")
        self.p, self.seed = p, seed
        self.rng = np.random.default_rng(seed)
        self.mask = None

    def draw(self, shape):
        """The next mask from this module's stream: True where the element is kept."""
        return self.rng.random(shape) >= self.p

    def forward(self, x, mask=None):
        """``mask``: use this one instead of drawing (a shard of a mask drawn whole)."""
        if self.p == 0:
            return x
        self.mask = self.draw(x.shape) if mask is None else mask
        return self.apply(x)

    def backward(self, dy):
        if self.p == 0:
            return dy
        return self.apply(dy)        # y = x * mask / (1-p) is linear: the same map

    def apply(self, x):
        return (x * self.mask * (1 / (1 - self.p))).astype(x.dtype, copy=False)
