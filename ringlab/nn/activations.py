"""GeLU activation, in its two forms.

``approximate="tanh"`` (the default) is the formula GPT-2 was trained with,
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); it is plain numpy and fast.
``approximate="none"`` is the exact x * Phi(x) with the normal CDF Phi, which is
torch.nn.functional.gelu's default. numpy has no vectorised erf, so it calls
math.erf per element: exact, but slower. The argument has torch's name and values.

Forward keeps only its input x for backward, which recomputes tanh (or the
CDF) from it, as Megatron's fused bias-GeLU does: the activation memory is the
8sbh bytes Korthikanti et al. (2022) count for the GeLU input, not twice that.

    >>> import numpy as np
    >>> x = np.array([-1.0, 0.0, 2.0])
    >>> GeLU().forward(x).round(4)
    array([-0.1588,  0.    ,  1.9546])
    >>> GeLU(approximate="none").forward(x).round(4)
    array([-0.1587,  0.    ,  1.9545])
"""

import math

import numpy as np

from .module import Module

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)     # elementwise math.erf; returns objects


class GeLU(Module):
    """Gaussian error linear unit; no parameters."""

    def __init__(self, approximate="tanh"):
        super().__init__()
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', not {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        self.x = x
        if self.approximate == "tanh":
            return 0.5 * x * (1 + self._tanh(x))
        return x * self._cdf(x)

    def backward(self, dy):
        x = self.x
        if self.approximate == "tanh":
            # d/dx of 0.5 x (1 + tanh(u)), with u = c (x + 0.044715 x^3).
            t = self._tanh(x)                    # recomputed: cheaper than storing it
            du = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * (x * x))
            return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)
        pdf = np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
        return dy * (self._cdf(x) + x * pdf)     # d/dx of x Phi(x)

    @staticmethod
    def _tanh(x):
        # x * x * x, not x**3: numpy's pow is several times slower than two multiplies.
        return np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))

    @staticmethod
    def _cdf(x):
        return 0.5 * (1 + _erf(x / math.sqrt(2)).astype(x.dtype))
