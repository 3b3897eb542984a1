"""Synthetic data sets that a tiny model learns in seconds, fully fixed by seeds.

``Blobs``: Gaussian clusters to classify (the MLP; cross_entropy).
``TeacherRegression``: targets made by a random fixed network (the MLP; mse).
``ArithmeticTokens``: token sequences x_t = (start + stride * t) mod vocab (the GPT).
Each has ``batches(batch_size, seed)``, an endless generator of (inputs, targets).

    >>> data = ArithmeticTokens(vocab=10, seq_len=6, strides=(1, 3))
    >>> ids, targets = next(data.batches(2, seed=0))
    >>> ids
    array([[8, 1, 4, 7, 0, 3],
           [6, 7, 8, 9, 0, 1]])
    >>> targets                   # the next token at each position
    array([[1, 4, 7, 0, 3, 6],
           [7, 8, 9, 0, 1, 2]])
"""

import numpy as np


class Blobs:
    """``n_classes`` Gaussian clusters in ``dim`` dimensions; label = cluster id."""

    def __init__(self, n_samples=1024, dim=8, n_classes=4, spread=1.0, seed=0):
        rng = np.random.default_rng(seed)
        centers = 2 * rng.standard_normal((n_classes, dim))
        self.y = rng.integers(n_classes, size=n_samples)
        self.x = centers[self.y] + spread * rng.standard_normal((n_samples, dim))

    def batches(self, batch_size, seed=0):
        """Shuffled mini-batches (x, y), epoch after epoch; the seed fixes the order."""
        return _epochs(self.x, self.y, batch_size, seed)


class TeacherRegression:
    """y = tanh(x @ A) @ B for a fixed random "teacher" (A, B); x ~ N(0, 1)."""

    def __init__(self, n_samples=1024, dim=8, hidden=16, out=2, seed=0):
        rng = np.random.default_rng(seed)
        a = rng.standard_normal((dim, hidden)) / np.sqrt(dim)
        b = rng.standard_normal((hidden, out)) / np.sqrt(hidden)
        self.x = rng.standard_normal((n_samples, dim))
        self.y = np.tanh(self.x @ a) @ b

    def batches(self, batch_size, seed=0):
        """Shuffled mini-batches (x, y), epoch after epoch; the seed fixes the order."""
        return _epochs(self.x, self.y, batch_size, seed)


def _epochs(x, y, batch_size, seed):
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for i in range(0, len(x) - batch_size + 1, batch_size):   # drop a short tail
            idx = order[i:i + batch_size]
            yield x[idx], y[idx]


class ArithmeticTokens:
    """Sequences that count mod ``vocab`` from a random start by a random stride.

    After two tokens the rest is determined, but only by looking back to find
    the stride: a bigram model cannot beat log(len(strides)) per token, while
    attention can. So the loss falls fast at first, then further as attention
    learns.
    """

    def __init__(self, vocab=16, seq_len=16, strides=(1, 2, 3)):
        self.vocab, self.seq_len, self.strides = vocab, seq_len, np.asarray(strides)

    def batches(self, batch_size, seed=0):
        """Endless fresh batches of (ids, targets), each (batch_size, seq_len) ints."""
        rng = np.random.default_rng(seed)
        t = np.arange(self.seq_len + 1)
        while True:
            start = rng.integers(self.vocab, size=(batch_size, 1))
            stride = rng.choice(self.strides, size=(batch_size, 1))
            seq = (start + stride * t) % self.vocab
            yield seq[:, :-1], seq[:, 1:]    # predict token t+1 from tokens <= t
