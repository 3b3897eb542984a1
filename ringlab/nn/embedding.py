"""Embedding: a lookup table of learned vectors, one row per token id.

    >>> import numpy as np
    >>> emb = Embedding(5, 2, np.random.default_rng(0))
    >>> ids = np.array([[1, 3, 1]])
    >>> emb.forward(ids).shape
    (1, 3, 2)
    >>> _ = emb.backward(np.ones((1, 3, 2)))
    >>> emb.grads["weight"]              # row 1 was used twice, row 3 once
    array([[0., 0.],
           [2., 2.],
           [0., 0.],
           [1., 1.],
           [0., 0.]])
"""

import numpy as np

from .module import Module


class Embedding(Module):
    """``weight[ids]``; weight has shape (num_embeddings, dim), init N(0, 1) as torch."""

    def __init__(self, num_embeddings, dim, rng, dtype=np.float64):
        super().__init__()
        self.add_param("weight", rng.standard_normal((num_embeddings, dim)).astype(dtype))

    def forward(self, ids):
        self.ids = ids
        return self.params["weight"][ids]

    def backward(self, dy):
        # A row used k times gets k contributions. np.add.at adds once per
        # occurrence; plain `grad[ids] += dy` would keep only one of repeated ids.
        np.add.at(self.grads["weight"], self.ids, dy)
        return None                          # integer ids have no gradient
