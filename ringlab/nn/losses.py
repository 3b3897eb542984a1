"""Losses that return the loss and its gradient with respect to the prediction.

Both average over all positions, like torch's default reduction="mean", so
the returned gradient already carries the 1/N.

    >>> import numpy as np
    >>> loss, dlogits = cross_entropy(np.zeros((2, 4)), np.array([0, 3]))
    >>> round(loss, 6), round(float(np.log(4)), 6)     # uniform guess: log(classes)
    (1.386294, 1.386294)
    >>> dlogits.round(3)
    array([[-0.375,  0.125,  0.125,  0.125],
           [ 0.125,  0.125,  0.125, -0.375]])
    >>> mse(np.array([1.0, 2.0]), np.array([0.0, 0.0]))
    (2.5, array([1., 2.]))
"""

import numpy as np


def cross_entropy(logits, targets):
    """Mean of -log softmax(logits)[target] over all positions.

    logits (..., classes) floats, targets (...) ints. Returns (loss, dlogits).
    """
    # log-softmax via the max shift: exp never overflows, log never sees 0.
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)
    n = targets.size
    loss = -picked.sum() / n
    # d loss / d logits = (softmax - one_hot(target)) / n.
    dlogits = np.exp(log_probs)
    np.put_along_axis(dlogits, targets[..., None],
                      np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1, axis=-1)
    return float(loss), dlogits / n


def mse(pred, target):
    """Mean squared error over all elements. Returns (loss, dpred)."""
    diff = pred - target
    return float((diff**2).mean()), 2 * diff / diff.size
