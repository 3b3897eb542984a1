"""The Module: named parameters, named gradients, forward and backward by hand.

There is no autograd. Each module's ``forward(x)`` keeps what its backward will
need, and ``backward(dy)`` returns ``dx`` and ADDS (``+=``) its parameter
gradients into ``grads`` -- as torch does, so two backward passes without
``zero_grad()`` in between accumulate, which is how gradient accumulation
(and later micro-batching in pipeline parallelism) works.

A module holds its own tensors in ``params`` / ``grads`` (same keys, same
shapes) and its sub-modules as attributes; a composite such as GPT has empty
``params`` of its own. ``named_parameters()`` walks the whole tree and joins
names with dots, in registration order (the order the attributes were set):

    >>> import numpy as np
    >>> from ringlab.nn import Linear, GeLU, Sequential
    >>> net = Sequential(Linear(3, 4, np.random.default_rng(0)), GeLU(),
    ...                  Linear(4, 2, np.random.default_rng(1)))
    >>> list(net.named_parameters())
    ['0.weight', '0.bias', '2.weight', '2.bias']
    >>> count_params(net), param_bytes(net)
    (26, 208)
"""

import numpy as np


class Module:
    """Base class: ``params``/``grads`` dicts plus sub-modules found by attribute."""

    def __init__(self):
        # object.__setattr__: these three must exist before our __setattr__ runs.
        object.__setattr__(self, "params", {})
        object.__setattr__(self, "grads", {})
        object.__setattr__(self, "_children", {})

    def __setattr__(self, name, value):
        # Assigning a Module to an attribute registers it as a child (as in torch),
        # so `self.fc = Linear(...)` is all a layer needs to write.
        if isinstance(value, Module):
            self._children[name] = value
        object.__setattr__(self, name, value)

    def add_param(self, name, value):
        """Register a parameter and a zero gradient of the same shape and dtype."""
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)

    def forward(self, x):
        raise NotImplementedError

    def backward(self, dy):
        raise NotImplementedError

    def __call__(self, x):
        return self.forward(x)

    def flops(self, x_shape):
        """Forward matmul FLOPs (2*m*n*k each) for an input of ``x_shape``.

        Elementwise work (GeLU, LayerNorm, softmax) is ignored: it is small next
        to the matmuls. Layers without matmuls keep this default of 0.
        """
        return 0

    def out_shape(self, x_shape):
        """Shape of ``forward(x)``; most layers keep the shape."""
        return tuple(x_shape)

    def named_modules(self, prefix=""):
        """Yield (dotted name, module) for this module and all below it."""
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}{name}.")

    def named_parameters(self):
        """All parameters as an ordered dict "blocks.0.attn.qkv.weight" -> array."""
        return {p + k: v for p, m in self.named_modules() for k, v in m.params.items()}

    def named_grads(self):
        """All gradients, same names and order as ``named_parameters()``."""
        return {p + k: v for p, m in self.named_modules() for k, v in m.grads.items()}

    def zero_grad(self):
        # In place: the gradient arrays may be views into a flat buffer (DDP, ZeRO).
        for g in self.named_grads().values():
            g[...] = 0

    def rebind(self, params=None, grads=None):
        """Make named parameters / gradients use the given arrays, without copying.

        Used to put a model's tensors inside a FlatBuffer: after
        ``model.rebind(params=flat.views)`` the model reads and writes the buffer.
        """
        owners = {p + k: (m, k) for p, m in self.named_modules() for k in m.params}
        for table, attr in ((params, "params"), (grads, "grads")):
            for name, array in (table or {}).items():
                module, key = owners[name]
                old = getattr(module, attr)[key]
                if (array.shape, array.dtype) != (old.shape, old.dtype):
                    raise ValueError(f"{name}: {array.dtype}{array.shape}, "
                                     f"expected {old.dtype}{old.shape}")
                getattr(module, attr)[key] = array


class Sequential(Module):
    """Run modules one after another; backward runs them in reverse.

    Children are named "0", "1", ... like torch.nn.Sequential.
    """

    def __init__(self, *modules):
        super().__init__()
        self.layers = list(modules)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)       # registers child "0", "1", ... (see __setattr__)

    def forward(self, x):
        for m in self.layers:
            x = m.forward(x)
        return x

    def backward(self, dy):
        for m in reversed(self.layers):
            dy = m.backward(dy)
        return dy

    def flops(self, x_shape):
        total = 0
        for m in self.layers:
            total += m.flops(x_shape)
            x_shape = m.out_shape(x_shape)
        return total


def count_params(model):
    """Number of scalar parameters."""
    return sum(p.size for p in model.named_parameters().values())


def param_bytes(model):
    """Bytes the parameters take (8 per float64, 4 per float32)."""
    return sum(p.nbytes for p in model.named_parameters().values())
