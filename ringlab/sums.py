"""Sums of random floats: which ranks' contributions a value holds.

The one place that reads "which ranks' inputs does this payload sum": the
trace player (``ringlab.show.player.payloads``) and the reduction graders ask
it. The graders feed random float64 data: every element has a random
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

    >>> xs = random_vectors(np.random.default_rng(0), 3, 4)
    >>> which(xs[0] + xs[2], xs), SubsetSums(xs).find((xs[1] + xs[2])[1:3])
    ((0, 2), (1, 3, frozenset({1, 2})))
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


def subset_masks(n):
    """Row m: 1 for the ranks whose bit is set in m, 0 elsewhere (all 2^n sets)."""
    return (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1


def subset_sums(x):
    """Row m: the sum of the rows of ``x`` whose bit is set in m (all 2^n sets)."""
    return subset_masks(len(x)) @ np.asarray(x, dtype=np.float64)


class SubsetSums:
    """Every subset's sum of the vectors ``xs`` (all of one length), element by
    element, with the rounding each may have (as ``holds`` allows it);
    ``find(p)`` says which slice of which subset's sum ``p`` is."""

    def __init__(self, xs):
        x = np.stack([np.asarray(v, dtype=np.float64) for v in xs])
        self.masks = subset_masks(len(x))
        self.table = self.masks @ x
        self.tol = self.masks.sum(axis=1)[:, None] * EPS * (self.masks @ np.abs(x))

    def find(self, p):
        """``(start, stop, ranks)`` if ``p`` (1-D float64) is one non-empty subset's
        sum over one slice, else None (also None if several subsets or slices
        fit: the inputs cannot tell them apart)."""
        width = self.table.shape[1]
        if p is None or not 0 < len(p) <= width:
            return None
        m = len(p)
        # Candidates by the first element, then checked on the whole slice.
        hits = np.argwhere(np.abs(self.table[:, : width - m + 1] - p[0])
                           <= self.tol[:, : width - m + 1])
        fits = [(s, o) for s, o in hits
                if np.all(np.abs(self.table[s, o:o + m] - p) <= self.tol[s, o:o + m])]
        if len(fits) != 1 or not self.masks[fits[0][0]].any():
            return None
        s, o = fits[0]
        return int(o), int(o) + m, frozenset(int(r) for r in np.flatnonzero(self.masks[s]))


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
