"""ringlab.nn: numpy layers with an explicit forward and backward (no autograd).

Parameters and gradients are named arrays ("blocks.0.attn.qkv.weight"), so the
parallel chapters can move, flatten, split and shard them by name. A training
step is five lines:

    >>> import numpy as np
    >>> from ringlab.nn import GPT, Adam, cross_entropy
    >>> model = GPT(vocab=16, dim=16, n_heads=2, hidden=32, n_layers=2, seq_len=8,
    ...             rng=np.random.default_rng(0))
    >>> opt = Adam(model.named_parameters(), lr=1e-2)
    >>> ids = np.random.default_rng(1).integers(16, size=(4, 8))
    >>> loss, dlogits = cross_entropy(model.forward(ids[:, :-1]), ids[:, 1:])
    >>> model.backward(dlogits)                  # adds into model.named_grads()
    >>> opt.step(model.named_grads())            # updates the parameters in place
    >>> round(loss, 4)
    3.1876

Conventions: ``Linear.weight`` is (in, out) and y = x @ W + b; GeLU defaults to
the tanh approximation (GPT-2's); parameters are ordered by module registration
(forward order); ``backward`` accumulates (+=) into the gradients.
"""

from .module import Module, Sequential, count_params, param_bytes
from .linear import Linear
from .activations import GeLU
from .dropout import Dropout
from .layernorm import LayerNorm
from .embedding import Embedding
from .attention import CausalSelfAttention
from .mlp import MLP, mlp_model
from .moe import MoE
from .gpt import GPT, TransformerBlock
from .losses import cross_entropy, mse
from .optim import SGD, Adam
from .flat import FlatBuffer, flatten
from . import data

__all__ = [
    "Module", "Sequential", "Linear", "GeLU", "Dropout", "LayerNorm", "Embedding",
    "CausalSelfAttention", "MLP", "MoE", "TransformerBlock", "GPT", "mlp_model", "cross_entropy", "mse", "SGD", "Adam",
    "FlatBuffer", "flatten", "count_params", "param_bytes", "data",
]
