"""Sums of random floats: which ranks' contributions a value holds.

The reduction graders feed random float64 data: every element has a random
sign, a magnitude in [1, 16) and 52 random mantissa bits. Such data cannot
travel in fewer bytes than the algorithm sends (whole numbers could be packed
several to a float), and a value can be read back as "the sum over this set
of ranks" and no other:

* Summing k numbers in any order (sequential, pairwise, a ring's order)
  rounds by at most (k-1) u sum|x_i|, with u = eps/2 (Higham, Accuracy and
  Stability, ch. 4). The grader's own sum rounds as much, so a value is
  accepted within ``k * eps * sum|x_i|`` of it: twice the worst case of both.
* ``random_vectors`` redraws the data until, at every position, the sums over
  any two different sets of ranks are at least ``GAP`` apart, a million times
  the largest tolerance. A value within tolerance of one set's sum is then
  much closer to it than to any other set's.
"""

from __future__ import annotations

import numpy as np

EPS = np.finfo(np.float64).eps
GAP = 1e-6


def random_vectors(rng, n, length):
    """``n`` float64 vectors of ``length`` elements whose subset sums are ``GAP`` apart."""
    while True:
        x = rng.uniform(1, 2, (n, length)) * 2.0 ** rng.integers(0, 4, (n, length))
        x *= rng.choice([-1.0, 1.0], (n, length))
        if length == 0 or np.diff(np.sort(subset_sums(x), axis=0), axis=0).min(initial=np.inf) > GAP:
            return list(x)


def subset_sums(x):
    """Row m: the sum of the rows of ``x`` whose bit is set in m (all 2^n sets)."""
    n = len(x)
    masks = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
    return masks @ np.asarray(x, dtype=np.float64)


def holds(values, inputs, members, where=slice(None)):
    """Whether ``values`` is the sum over ranks ``members`` of ``inputs[r][where]``,
    up to rounding. ``values`` must be a 1-D float64 array of the right length."""
    parts = np.array([inputs[r][where] for r in members], dtype=np.float64)
    if not (isinstance(values, np.ndarray) and values.dtype == np.float64
            and values.shape == parts.shape[1:]):
        return False
    tol = len(members) * EPS * np.abs(parts).sum(axis=0)
    return bool(np.all(np.abs(values - parts.sum(axis=0)) <= tol))


def close(values, inputs, members, where=slice(None)):
    """Element-wise: which elements of ``values`` are the sum over ``members``."""
    parts = np.array([inputs[r][where] for r in members], dtype=np.float64)
    tol = len(members) * EPS * np.abs(parts).sum(axis=0)
    return np.abs(values - parts.sum(axis=0)) <= tol


def which(values, inputs, where=slice(None)):
    """The set of ranks (a tuple) whose sum ``values`` is, the same for every
    element, or None (not a sum over one set of ranks, or different sets)."""
    if not isinstance(values, np.ndarray) or values.dtype != np.float64 or values.size == 0:
        return None
    n = len(inputs)
    for m in range(1, 2 ** n):
        members = [r for r in range(n) if m >> r & 1]
        if holds(values, inputs, members, where):
            return tuple(members)
    return None
