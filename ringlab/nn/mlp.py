"""Feed-forward networks: the transformer's MLP and a small model for data parallelism.

    >>> import numpy as np
    >>> model = mlp_model([4, 16, 3], np.random.default_rng(0))
    >>> list(model.named_parameters())
    ['0.weight', '0.bias', '2.weight', '2.bias']
    >>> model.forward(np.zeros((5, 4))).shape
    (5, 3)
"""

import numpy as np

from .activations import GeLU
from .linear import Linear
from .module import Module, Sequential


class MLP(Module):
    """Linear(dim, hidden) -> GeLU -> Linear(hidden, dim), as in a transformer block."""

    def __init__(self, dim, hidden, rng, approximate="tanh", dtype=np.float64):
        super().__init__()
        self.fc = Linear(dim, hidden, rng, dtype=dtype)
        self.act = GeLU(approximate)
        self.proj = Linear(hidden, dim, rng, dtype=dtype)

    def forward(self, x):
        return self.proj.forward(self.act.forward(self.fc.forward(x)))

    def backward(self, dy):
        return self.fc.backward(self.act.backward(self.proj.backward(dy)))

    def flops(self, x_shape):
        return self.fc.flops(x_shape) + self.proj.flops(self.fc.out_shape(x_shape))


def mlp_model(sizes, rng, approximate="tanh", dtype=np.float64):
    """Sequential of Linear layers with GeLU between them (none after the last).

    ``sizes=[in, h1, ..., out]``. Small and fast: the model of the
    data-parallel chapters.
    """
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(Linear(n_in, n_out, rng, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(GeLU(approximate))
    return Sequential(*layers)
