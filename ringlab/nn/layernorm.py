"""Layer normalisation over the last axis, with a learned scale and shift.

    y = (x - mean) / sqrt(var + eps) * weight + bias

``var`` is the biased variance (divide by n), as in torch.nn.LayerNorm.

    >>> import numpy as np
    >>> ln = LayerNorm(4)
    >>> y = ln.forward(np.array([[1.0, 2.0, 3.0, 4.0]]))
    >>> y.round(4)
    array([[-1.3416, -0.4472,  0.4472,  1.3416]])
    >>> round(float(y.mean()), 12), round(float(y.var()), 4)
    (0.0, 1.0)
"""

import numpy as np

from .module import Module


class LayerNorm(Module):
    """Normalise each row of the last axis; weight starts at 1, bias at 0."""

    def __init__(self, dim, eps=1e-5, dtype=np.float64):
        super().__init__()
        self.eps = eps
        self.add_param("weight", np.ones(dim, dtype))
        self.add_param("bias", np.zeros(dim, dtype))

    def forward(self, x):
        mean = x.mean(axis=-1, keepdims=True)
        var = x.var(axis=-1, keepdims=True)
        self.rstd = 1 / np.sqrt(var + self.eps)
        self.xhat = (x - mean) * self.rstd
        return self.xhat * self.params["weight"] + self.params["bias"]

    def backward(self, dy):
        xhat, n = self.xhat, self.xhat.shape[-1]
        lead = tuple(range(dy.ndim - 1))            # every axis but the last
        self.grads["weight"] += (dy * xhat).sum(axis=lead)
        self.grads["bias"] += dy.sum(axis=lead)
        g = dy * self.params["weight"]              # gradient w.r.t. xhat
        # xhat depends on x directly and through mean and var; the two row sums
        # below are those two indirect paths (mean: sum g, var: sum g*xhat).
        return self.rstd / n * (n * g - g.sum(-1, keepdims=True)
                                - xhat * (g * xhat).sum(-1, keepdims=True))
