"""A tiny GPT: token and position embeddings, pre-LN transformer blocks, a head.

    >>> import numpy as np
    >>> from ringlab.nn import cross_entropy
    >>> model = GPT(vocab=11, dim=8, n_heads=2, hidden=32, n_layers=2, seq_len=6,
    ...             rng=np.random.default_rng(0))
    >>> ids = np.array([[1, 2, 3, 4]])
    >>> logits = model.forward(ids)
    >>> logits.shape
    (1, 4, 11)
    >>> loss, dlogits = cross_entropy(logits, np.array([[2, 3, 4, 5]]))
    >>> model.backward(dlogits)
    >>> list(model.named_parameters())[:4]
    ['tok_emb.weight', 'pos_emb.weight', 'blocks.0.ln1.weight', 'blocks.0.ln1.bias']
"""

import numpy as np

from .attention import CausalSelfAttention
from .dropout import Dropout
from .embedding import Embedding
from .layernorm import LayerNorm
from .linear import Linear
from .mlp import MLP
from .module import Module, Sequential


class TransformerBlock(Module):
    """Pre-LN block (GPT-2): x + attn(ln1(x)), then x + mlp(ln2(x)).

    ``dropout=p`` (default 0: off) drops the attention probabilities and the
    outputs of attention and MLP before each residual add, as GPT-2 and
    Megatron do; the three mask streams are seeded ``(seed, 0)``, ``(seed, 1)``
    and ``(seed, 2)``.
    """

    def __init__(self, dim, n_heads, hidden, rng, approximate="tanh", dtype=np.float64,
                 dropout=0.0, seed=0):
        super().__init__()
        self.ln1 = LayerNorm(dim, dtype=dtype)
        self.attn = CausalSelfAttention(dim, n_heads, rng, dtype=dtype, dropout=dropout,
                                        seed=(seed, 0))
        self.drop1 = Dropout(dropout, (seed, 1))
        self.ln2 = LayerNorm(dim, dtype=dtype)
        self.mlp = MLP(dim, hidden, rng, approximate, dtype=dtype)
        self.drop2 = Dropout(dropout, (seed, 2))

    def forward(self, x):
        x = x + self.drop1.forward(self.attn.forward(self.ln1.forward(x)))
        return x + self.drop2.forward(self.mlp.forward(self.ln2.forward(x)))

    def backward(self, dy):
        # A residual x + f(x) passes dy straight through and adds f's gradient.
        dy = dy + self.ln2.backward(self.mlp.backward(self.drop2.backward(dy)))
        return dy + self.ln1.backward(self.attn.backward(self.drop1.backward(dy)))

    def flops(self, x_shape):
        return self.attn.flops(x_shape) + self.mlp.flops(x_shape)


class GPT(Module):
    """ids (batch, time) of ints -> logits (batch, time, vocab).

    The head is a Linear without bias, not tied to the token embedding.
    """

    def __init__(self, vocab, dim, n_heads, hidden, n_layers, seq_len, rng,
                 approximate="tanh", dtype=np.float64):
        super().__init__()
        self.tok_emb = Embedding(vocab, dim, rng, dtype=dtype)
        self.pos_emb = Embedding(seq_len, dim, rng, dtype=dtype)
        self.blocks = Sequential(*[TransformerBlock(dim, n_heads, hidden, rng, approximate,
                                                    dtype) for _ in range(n_layers)])
        self.ln_f = LayerNorm(dim, dtype=dtype)
        self.head = Linear(dim, vocab, rng, bias=False, dtype=dtype)

    def forward(self, ids):
        if ids.shape[1] > len(self.pos_emb.params["weight"]):
            raise ValueError(f"{ids.shape[1]} tokens, but the model has only "
                             f"{len(self.pos_emb.params['weight'])} positions (seq_len)")
        positions = np.arange(ids.shape[1])
        x = self.tok_emb.forward(ids) + self.pos_emb.forward(positions)  # broadcast over batch
        return self.head.forward(self.ln_f.forward(self.blocks.forward(x)))

    def backward(self, dlogits):
        dx = self.blocks.backward(self.ln_f.backward(self.head.backward(dlogits)))
        self.tok_emb.backward(dx)
        self.pos_emb.backward(dx.sum(axis=0))    # positions were shared by the batch
        # Returns None: the input ids have no gradient.

    def flops(self, ids_shape):
        x_shape = (*ids_shape, self.head.in_features)
        return self.blocks.flops(x_shape) + self.head.flops(x_shape)
