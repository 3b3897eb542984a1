"""ringlab.sums: which ranks' inputs a value sums, up to the rounding of any order."""

import numpy as np

from ringlab import sums


def test_a_slice_summed_in_another_order_is_found_with_its_ranks():
    xs = sums.random_vectors(np.random.default_rng(3), 5, 6)
    backwards = sum(x[2:5] for x in [xs[4], xs[1], xs[0]])       # another summation order
    assert sums.SubsetSums(xs).find(backwards) == (2, 5, frozenset({0, 1, 4}))


def test_more_than_rounding_off_or_no_rank_at_all_is_no_sum():
    xs = sums.random_vectors(np.random.default_rng(4), 4, 5)
    table = sums.SubsetSums(xs)
    assert table.find(xs[1] + xs[2] + 1e-9) is None
    assert table.find(np.zeros(3)) is None                          # the empty set: no rank
    assert table.find(np.ones(9)) is None                           # longer than any slice


def test_inputs_that_cannot_be_told_apart_give_no_answer():
    ones = [np.ones(4)] * 3                                         # every pair sums to 2
    assert sums.SubsetSums(ones).find(np.full(2, 2.0)) is None
    assert sums.SubsetSums(ones).find(np.full(2, 3.0)) is None       # one set, but any slice


def test_holds_and_which_agree_with_find():
    xs = sums.random_vectors(np.random.default_rng(5), 3, 4)
    total = xs[0] + xs[2]
    assert sums.holds(total, xs, [0, 2]) and not sums.holds(total, xs, [0, 1, 2])
    assert sums.which(total, xs) == (0, 2)
    assert sums.SubsetSums(xs).find(total) == (0, 4, frozenset({0, 2}))
