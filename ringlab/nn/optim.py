"""SGD and Adam on named arrays, updating the parameters in place.

An optimizer takes a dict name -> array (e.g. ``model.named_parameters()``) or a
single array (e.g. a rank's shard of a flat parameter buffer under ZeRO, which
is then called "param"). ``step(grads)`` takes gradients of the same form and
updates every array IN PLACE: the arrays keep their identity, so a model, a
FlatBuffer view or a shard sees the new values without being told.

The arithmetic follows torch.optim.SGD / torch.optim.Adam (single-tensor code
path) operation by operation, so the results agree to rounding.

    >>> import numpy as np
    >>> w = np.array([1.0, -2.0])
    >>> opt = Adam(w, lr=0.1)
    >>> opt.step(np.array([0.5, 0.5]))
    >>> w                         # the first Adam step moves each entry by ~lr
    array([ 0.9, -2.1])
    >>> opt.state["param"]["step"]
    1
"""

import math

import numpy as np


def _named(arrays):
    """A single array becomes {"param": array}; a mapping is used as it is."""
    return {"param": arrays} if isinstance(arrays, np.ndarray) else dict(arrays)


def _named_params(params):
    named = _named(params)
    if not named:   # e.g. GPT().params: a composite's own dict is empty
        raise ValueError("no parameters to optimize; pass model.named_parameters()")
    return named


class SGD:
    """p -= lr * g, with optional heavy-ball momentum and L2 weight decay (torch's)."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        self.params = _named_params(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.state = {name: {} for name in self.params}   # "momentum_buffer" once used

    def step(self, grads):
        grads = _named(grads)
        for name, p in self.params.items():
            g = grads[name]
            if self.weight_decay:
                g = g + self.weight_decay * p       # L2 penalty: new array, grads untouched
            if self.momentum:
                state = self.state[name]
                if "momentum_buffer" not in state:  # first step: buffer = g, as torch
                    state["momentum_buffer"] = g.copy()
                else:
                    state["momentum_buffer"] *= self.momentum
                    state["momentum_buffer"] += g
                g = state["momentum_buffer"]
            p -= self.lr * g


class Adam:
    """Adam (Kingma & Ba) with bias correction, as torch.optim.Adam.

    ``weight_decay`` is torch.optim.Adam's L2 term added to the gradient (not
    AdamW's decoupled decay). ``state[name]`` holds "step" and the moment
    estimates "m" and "v" (torch calls them exp_avg and exp_avg_sq).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.params = _named_params(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.state = {name: {"step": 0, "m": np.zeros_like(p), "v": np.zeros_like(p)}
                      for name, p in self.params.items()}

    def step(self, grads):
        grads = _named(grads)
        beta1, beta2 = self.betas
        for name, p in self.params.items():
            g, state = grads[name], self.state[name]
            if self.weight_decay:
                g = g + self.weight_decay * p
            state["step"] += 1
            t, m, v = state["step"], state["m"], state["v"]
            m += (1 - beta1) * (g - m)              # torch: m.lerp_(g, 1 - beta1)
            v *= beta2
            v += (1 - beta2) * g * g
            # Early on m and v are biased towards their zero start; dividing by
            # 1 - beta^t removes that bias (t = 1: the first step is ~lr * sign(g)).
            step_size = self.lr / (1 - beta1**t)
            denom = np.sqrt(v) / math.sqrt(1 - beta2**t) + self.eps
            p -= step_size * (m / denom)
