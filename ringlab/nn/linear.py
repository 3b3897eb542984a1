"""Linear layer: y = x @ W + b.

Weight layout: ``weight`` has shape (in_features, out_features), the transpose of
torch.nn.Linear's (out, in). The code then reads like the math, and the
tensor-parallel splits read like Megatron-LM's paper: a column-parallel layer
keeps ``weight[:, cols]`` (a slice of the outputs), a row-parallel one keeps
``weight[rows, :]`` (a slice of the inputs).

    >>> import numpy as np
    >>> lin = Linear(3, 2, np.random.default_rng(0))
    >>> y = lin.forward(np.ones((4, 3)))
    >>> dx = lin.backward(np.ones((4, 2)))
    >>> y.shape, dx.shape, lin.grads["weight"].shape
    ((4, 2), (4, 3), (3, 2))
    >>> lin.grads["bias"]          # sum of dy over the 4 rows
    array([4., 4.])
    >>> lin.flops((4, 3))          # 2 * 4 * 3 * 2
    48
"""

import math

import numpy as np

from .module import Module


class Linear(Module):
    """``y = x @ weight + bias`` on inputs of shape (..., in_features).

    Init as torch.nn.Linear: weight and bias uniform in +-1/sqrt(in_features).
    """

    def __init__(self, in_features, out_features, rng, bias=True, dtype=np.float64):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features)
        # Draw in float64 and then cast, so float32 and float64 models built from
        # the same seed hold the same numbers (up to rounding).
        w = rng.uniform(-bound, bound, (in_features, out_features))
        self.add_param("weight", w.astype(dtype))
        if bias:
            self.add_param("bias", rng.uniform(-bound, bound, out_features).astype(dtype))

    def forward(self, x):
        self.x = x                  # backward needs x for dW = x^T dy
        y = x @ self.params["weight"]
        if "bias" in self.params:
            y = y + self.params["bias"]
        return y

    def backward(self, dy):
        self.backward_weight(dy)
        return self.backward_input(dy)

    # Zero-bubble pipelines (Qi et al. 2023) split the backward in two: the input
    # gradient (the previous stage waits for it) now, the weight gradient later.
    def backward_input(self, dy):
        """dx = dy @ W^T only: what the previous layer needs."""
        return dy @ self.params["weight"].T

    def backward_weight(self, dy):
        """Add dW = x^T dy (and db) into ``grads`` only: nobody waits for it."""
        # Fold all leading axes (batch, time, ...) into one: rows of a matrix.
        x2 = self.x.reshape(-1, self.x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        self.grads["weight"] += x2.T @ dy2
        if "bias" in self.params:
            self.grads["bias"] += dy2.sum(axis=0)

    def flops(self, x_shape):
        rows = math.prod(x_shape[:-1])
        return 2 * rows * self.in_features * self.out_features

    def out_shape(self, x_shape):
        return (*x_shape[:-1], self.out_features)
