"""The reference ring AllReduce against numpy, and its cost against the closed forms."""

import numpy as np
from hypothesis import given, settings, strategies as st

import ringlab
from ringlab.collectives import ring_allreduce


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 16), length=st.integers(0, 40), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.float64, np.float32, np.int64]))
def test_every_rank_gets_the_numpy_sum(n, length, seed, dtype):
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-100, 100, length).astype(dtype) for _ in range(n)]
    before = [x.copy() for x in xs]
    res = ringlab.run(ring_allreduce, xs)
    total = np.sum(before, axis=0)
    for out in res.outputs:
        assert out.dtype == dtype and np.array_equal(out, total)
    assert all(np.array_equal(a, b) for a, b in zip(xs, before)), "inputs must not be modified"


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 16), length=st.integers(0, 60))
def test_cost_matches_closed_form(n, length):
    res = ringlab.run(ring_allreduce, [np.zeros(length)] * n)
    t = res.trace
    # 2(N-1) steps; N messages per step (one per rank); every chunk crosses N-1 links per phase.
    assert t.steps == 2 * (n - 1)
    assert len(t) == 2 * n * (n - 1)
    assert t.total_bytes == 2 * (n - 1) * length * 8
    # Each rank sends 2(N-1) chunks of at most ceil(L/N) elements; exactly L/N when N divides L.
    assert max(t.bytes_sent()) <= 2 * (n - 1) * -(-length // n) * 8
    if length % n == 0:
        assert t.bytes_sent() == [2 * (n - 1) * (length // n) * 8] * n
    for step in range(1, t.steps + 1):
        evs = t.at_step(step)
        assert sorted(e.src for e in evs) == list(range(n)) == sorted(e.dst for e in evs)
        assert all(e.dst == (e.src + 1) % n for e in evs)
        assert {e.op for e in evs} == {"reduce" if step < n else "copy"}


def test_labels_describe_the_two_phases_for_four_ranks():
    # Hand-derived for N=4: at reduce-scatter step k (1-based) rank r sends chunk (r - k + 1) mod 4;
    # at all-gather step k it sends chunk (r - k + 2) mod 4.
    t = ringlab.run(ring_allreduce, [np.zeros(8)] * 4).trace
    for e in t:
        k = e.step if e.step <= 3 else e.step - 3
        want = (e.src - k + 1) % 4 if e.step <= 3 else (e.src - k + 2) % 4
        assert e.chunk == want, e


def test_works_in_rendezvous_mode_too():
    xs = [np.arange(7.0) + r for r in range(5)]
    res = ringlab.run(ring_allreduce, xs, mode="rendezvous")
    assert np.array_equal(res.outputs[3], np.sum(xs, axis=0))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 9), length=st.integers(0, 30), seed=st.integers(0, 2**32 - 1))
def test_out_sums_in_place_or_into_a_given_array_with_the_same_trace(n, length, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-100, 100, length).astype(np.float64) for _ in range(n)]
    before = [x.copy() for x in xs]
    total = np.sum(xs, axis=0)
    plain = ringlab.run(ring_allreduce, xs)

    in_place = [x.copy() for x in xs]
    res = ringlab.run(lambda comm, x: ring_allreduce(comm, x, out=x), in_place)
    for x, out in zip(in_place, res.outputs):
        assert out is x and np.array_equal(x, total)      # like dist.all_reduce: x now holds the sum
    assert res.trace == plain.trace

    targets = [np.full(length, np.nan) for _ in range(n)]
    res = ringlab.run(lambda comm, x, outs: ring_allreduce(comm, x, out=outs[comm.rank]), xs,
                      args=(targets,))
    for out, target in zip(res.outputs, targets):
        assert out is target and np.array_equal(target, total)
    assert all(np.array_equal(a, b) for a, b in zip(xs, before)), "x must not change when out is another array"
    assert res.trace == plain.trace
