"""The reference collectives against numpy, on any world size, root and length,
and their traces against the shape that defines each algorithm."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ringlab
from ringlab import RankError
from ringlab.collectives import alltoall, binomial_broadcast, binomial_reduce, chain_broadcast, flat_broadcast, naive_allgather, pairwise_alltoall, recursive_doubling_allgather, ring_allgather, ring_allreduce, ring_alltoall, ring_reduce_scatter, tree_allreduce, tree_broadcast

SETTINGS = settings(max_examples=25, deadline=None)
worlds = st.integers(1, 16)
lengths = st.integers(0, 23)          # 0, shorter than the world, and not dividing it
seeds = st.integers(0, 2**32 - 1)
BROADCASTS = [flat_broadcast, chain_broadcast, tree_broadcast, binomial_broadcast]


def vectors(n, length, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.integers(-100, 100, length).astype(dtype) for _ in range(n)]


def run_unmodified(program, inputs, **kw):
    """Run, and check that no rank modified its input."""
    before = [None if x is None else np.copy(x) for x in inputs]
    res = ringlab.run(program, inputs, **kw)
    for x, b in zip(inputs, before):
        assert (x is None and b is None) or np.array_equal(x, b), "inputs must not be modified"
    return res


# -- AllGather -----------------------------------------------------------------------

@SETTINGS
@given(n=worlds, length=lengths, seed=seeds, dtype=st.sampled_from([np.float64, np.float32, np.int64]))
def test_ring_allgather_concatenates_in_rank_order(n, length, seed, dtype):
    xs = vectors(n, length, seed, dtype)
    res = run_unmodified(ring_allgather, xs)
    for out in res.outputs:
        assert out.dtype == dtype and np.array_equal(out, np.concatenate(xs))
    t = res.trace
    assert t.steps == n - 1 and len(t) == n * (n - 1)
    assert all(e.dst == (e.src + 1) % n and e.op == "copy" for e in t)
    # Hand-derived: at step k rank r passes on block (r - k + 1) mod N, the one it got at step k-1.
    assert all(e.chunk == (e.src - e.step + 1) % n for e in t)


@SETTINGS
@given(n=worlds, seed=seeds, data=st.data())
def test_ring_allgather_takes_blocks_of_different_lengths(n, seed, data):
    sizes = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    xs = [np.arange(s, dtype=float) + 10 * r for r, s in enumerate(sizes)]
    res = ringlab.run(ring_allgather, xs)
    assert all(np.array_equal(out, np.concatenate(xs)) for out in res.outputs)


@SETTINGS
@given(n=worlds, length=lengths, seed=seeds, data=st.data())
def test_naive_allgather_from_any_root(n, length, seed, data):
    root = data.draw(st.integers(0, n - 1))
    xs = vectors(n, length, seed)
    res = run_unmodified(naive_allgather, xs, kwargs={"root": root})
    assert all(np.array_equal(out, np.concatenate(xs)) for out in res.outputs)
    assert all(root in (e.src, e.dst) for e in res.trace)
    assert res.trace.steps == 2 * (n - 1)      # N-1 steps to gather (one receive per step), N-1 back
    spans = {e.span for e in res.trace}
    assert spans <= {"naive_allgather", "naive_allgather/flat_broadcast"}


@settings(max_examples=15, deadline=None)
@given(k=st.integers(0, 4), length=lengths, seed=seeds)
def test_recursive_doubling_allgather_on_powers_of_two(k, length, seed):
    n = 2 ** k
    xs = vectors(n, length, seed)
    res = run_unmodified(recursive_doubling_allgather, xs)
    assert all(np.array_equal(out, np.concatenate(xs)) for out in res.outputs)
    assert res.trace.steps == k
    # In step s partners differ in bit s-1 only, and exchange 2^(s-1) blocks.
    for e in res.trace:
        assert e.src ^ e.dst == 2 ** (e.step - 1) and e.nbytes == 2 ** (e.step - 1) * length * 8
        # The label names the blocks sent: the sender's group of 2^(s-1) consecutive blocks.
        size = 2 ** (e.step - 1)
        first = e.src // size * size
        assert e.chunk == tuple(range(first, first + size)) and e.op == "copy"


@pytest.mark.parametrize("n", [3, 5, 6, 12])
def test_recursive_doubling_refuses_other_sizes_clearly(n):
    with pytest.raises(RankError, match=f"power-of-two world_size, got {n}"):
        ringlab.run(recursive_doubling_allgather, [np.zeros(2)] * n)


# -- ReduceScatter -------------------------------------------------------------------

@SETTINGS
@given(n=worlds, length=lengths, seed=seeds, dtype=st.sampled_from([np.float64, np.int64]))
def test_ring_reduce_scatter_leaves_chunk_r_on_rank_r(n, length, seed, dtype):
    xs = vectors(n, length, seed, dtype)
    res = run_unmodified(ring_reduce_scatter, xs)
    want = np.array_split(np.sum(xs, axis=0), n)
    for r, out in enumerate(res.outputs):
        assert out.dtype == dtype and np.array_equal(out, want[r])
    t = res.trace
    assert t.steps == n - 1 and len(t) == n * (n - 1)
    assert all(e.dst == (e.src + 1) % n and e.op == "reduce" for e in t)


@SETTINGS
@given(n=worlds, length=lengths, seed=seeds)
def test_reduce_scatter_then_all_gather_is_all_reduce(n, length, seed):
    def composed(comm, x):
        return ring_allgather(comm, ring_reduce_scatter(comm, x))
    xs = vectors(n, length, seed)
    res = ringlab.run(composed, xs)
    ref = ringlab.run(ring_allreduce, xs)
    total = np.sum(xs, axis=0)
    assert all(np.array_equal(out, total) for out in res.outputs)
    assert res.trace.steps == ref.trace.steps == 2 * (n - 1)
    assert res.trace.total_bytes == ref.trace.total_bytes
    spans = [c["span"] for c in res.trace.collectives()]
    assert spans == ["ring_reduce_scatter", "ring_allgather"] or n == 1   # (N=1: both at step 0)


# -- Broadcast, Reduce, tree AllReduce -----------------------------------------------

@settings(max_examples=40, deadline=None)
@given(n=worlds, length=lengths, seed=seeds, data=st.data(), algorithm=st.sampled_from(BROADCASTS))
def test_every_broadcast_delivers_the_root_data(n, length, seed, data, algorithm):
    root = data.draw(st.integers(0, n - 1))
    x = vectors(1, length, seed)[0]
    inputs = [x if r == root else None for r in range(n)]
    kwargs = {"segments": data.draw(st.integers(1, 5))} if algorithm is chain_broadcast else {}
    res = run_unmodified(algorithm, inputs, args=(root,), kwargs=kwargs)
    for out in res.outputs:
        assert np.array_equal(out, x) and out is not x
    t = res.trace
    assert all(e.dst != root for e in t)
    segments = kwargs.get("segments", 1)
    received = [sum(e.dst == r for e in t) for r in range(n)]
    assert received == [0 if r == root else segments for r in range(n)]


@pytest.mark.parametrize("n", range(1, 17))
def test_tree_broadcast_steps_follow_the_heap(n):
    # Independent of the code: walk the heap, left child one step after its parent, right child two.
    when = {0: 0}
    for i in range(n):
        for child, delay in ((2 * i + 1, 1), (2 * i + 2, 2)):
            if child < n:
                when[child] = when[i] + delay
    for root in {0, n // 2, n - 1}:
        res = ringlab.run(tree_broadcast, [np.ones(3) if r == root else None for r in range(n)], args=(root,))
        got = {(e.dst - root) % n: e.step for e in res.trace}
        assert got == {i: s for i, s in when.items() if i}
        for e in res.trace:
            p, c = (e.src - root) % n, (e.dst - root) % n
            assert c in (2 * p + 1, 2 * p + 2)
        assert res.trace.steps == max(when.values())


@pytest.mark.parametrize("n", range(1, 17))
def test_binomial_broadcast_needs_ceil_log2_steps_and_the_binary_tree_more(n):
    want = math.ceil(math.log2(n)) if n > 1 else 0
    for root in {0, 1 % n, n - 1}:
        inputs = [np.ones(2) if r == root else None for r in range(n)]
        bino = ringlab.run(binomial_broadcast, inputs, args=(root,)).trace
        binary = ringlab.run(tree_broadcast, inputs, args=(root,)).trace
        assert bino.steps == want and len(bino) == n - 1
        assert binary.steps >= bino.steps
    # The common claim "a binary tree broadcasts in ceil(log2 N) steps" fails under one port:
    if n in (7, 8, 15, 16):
        assert binary.steps > want


def test_binary_tree_claim_counterexample_by_hand():
    # N=7: position 6 is the right child of the right child of the root: 2 + 2 = 4 steps, not 3.
    t = ringlab.run(tree_broadcast, [np.ones(1)] + [None] * 6).trace
    assert [(e.step, e.src, e.dst) for e in t] == [(1, 0, 1), (2, 0, 2), (2, 1, 3), (3, 1, 4),
                                                  (3, 2, 5), (4, 2, 6)]


@settings(max_examples=15, deadline=None)
@given(n=worlds, segments=st.integers(1, 6), length=st.integers(0, 20))
def test_chain_broadcast_pipelines_its_segments(n, segments, length):
    x = np.arange(float(length))
    res = ringlab.run(chain_broadcast, [x] + [None] * (n - 1), kwargs={"segments": segments},
                      record_payloads=True)
    t = res.trace
    assert t.steps == (n - 2 + segments if n > 1 else 0)
    pieces = np.array_split(x, segments)
    for e in t:
        assert e.dst == e.src + 1 and e.step == e.chunk + e.src + 1     # segment s leaves rank i at step s+i+1
        assert np.array_equal(res.payload(e), pieces[e.chunk])


@SETTINGS
@given(n=worlds, length=lengths, seed=seeds, data=st.data())
def test_binomial_reduce_sums_onto_any_root(n, length, seed, data):
    root = data.draw(st.integers(0, n - 1))
    xs = vectors(n, length, seed)
    res = run_unmodified(binomial_reduce, xs, args=(root,))
    for r, out in enumerate(res.outputs):
        assert np.array_equal(out, np.sum(xs, axis=0)) if r == root else out is None
    t = res.trace
    assert [sum(e.src == r for e in t) for r in range(n)] == [int(r != root) for r in range(n)]
    assert all(e.op == "reduce" for e in t)
    assert t.steps <= (math.ceil(math.log2(n)) if n > 1 else 0)


@SETTINGS
@given(n=worlds, length=lengths, seed=seeds)
def test_tree_allreduce_is_reduce_then_broadcast(n, length, seed):
    xs = vectors(n, length, seed)
    res = run_unmodified(tree_allreduce, xs)
    assert all(np.array_equal(out, np.sum(xs, axis=0)) for out in res.outputs)
    t = res.trace
    up, down = t.filter(span="binomial_reduce"), t.filter(span="binomial_broadcast")
    assert len(up) == len(down) == n - 1 and len(t) == 2 * (n - 1)
    assert all(e.span.startswith("tree_allreduce/") for e in t)
    if n > 1:
        assert max(e.step for e in up) < min(e.step for e in down)


@pytest.mark.parametrize("program", [flat_broadcast, tree_broadcast, binomial_broadcast,
                                     chain_broadcast, binomial_reduce, naive_allgather])
def test_bad_root_is_a_clear_error(program):
    with pytest.raises(RankError, match=r"rank 0: \w+\(root=5\): root must be a rank in 0\.\.2"):
        ringlab.run(program, [np.ones(2)] * 3, kwargs={"root": 5})


def test_broadcast_root_without_data_and_bad_segments_are_clear_errors():
    with pytest.raises(RankError, match="the root \\(rank 1\\) has no data"):
        ringlab.run(tree_broadcast, [None, None, None], args=(1,))
    with pytest.raises(RankError, match="segments must be an int >= 1"):
        ringlab.run(chain_broadcast, [np.ones(2), None], kwargs={"segments": 0})


# -- AlltoAll ------------------------------------------------------------------------

def send_buffers(n, length, seed):
    rng = np.random.default_rng(seed)
    return [[rng.integers(-100, 100, length).astype(float) for _ in range(n)] for _ in range(n)]


@settings(max_examples=40, deadline=None)
@given(n=worlds, length=st.integers(0, 4), seed=seeds,
       algorithm=st.sampled_from([alltoall, pairwise_alltoall, ring_alltoall]))
def test_alltoall_transposes_the_blocks(n, length, seed, algorithm):
    blocks = send_buffers(n, length, seed)
    before = [[b.copy() for b in row] for row in blocks]
    res = ringlab.run(algorithm, blocks, record_payloads=True)
    for c, out in enumerate(res.outputs):
        assert len(out) == n
        for r in range(n):
            assert np.array_equal(out[r], before[r][c])      # rank c ends with blocks[r][c]
    assert all(np.array_equal(a, b) for ra, rb in zip(blocks, before) for a, b in zip(ra, rb))
    # The labels tell the truth: each message carries exactly the (src, dst) blocks it names.
    for e in res.trace:
        payload = res.payload(e)
        named = [e.chunk] if algorithm is not ring_alltoall else list(e.chunk)
        stacked = payload if algorithm is ring_alltoall else payload[None]
        assert len(stacked) == len(named)
        for (s, d), got in zip(named, stacked):
            assert np.array_equal(got, before[s][d])
    t = res.trace
    assert t.steps == n - 1 and len(t) == n * (n - 1)
    if algorithm is ring_alltoall:
        assert all(e.dst == (e.src + 1) % n for e in t)
    else:
        assert sorted(e.chunk for e in t) == [(s, d) for s in range(n) for d in range(n) if s != d]
        assert all(e.chunk == (e.src, e.dst) for e in t)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_pairwise_alltoall_pairs_by_xor_on_powers_of_two(n):
    t = ringlab.run(pairwise_alltoall, [[np.zeros(1)] * n] * n).trace
    assert all(e.src ^ e.dst == e.step for e in t)


@pytest.mark.parametrize("n", [3, 5, 6, 7])
def test_pairwise_alltoall_shifts_otherwise(n):
    t = ringlab.run(pairwise_alltoall, [[np.zeros(1)] * n] * n).trace
    assert all(e.dst == (e.src + e.step) % n for e in t)


def test_alltoall_errors_are_clear():
    with pytest.raises(RankError, match="needs one block per rank \\(world_size=3\\), got 2"):
        ringlab.run(alltoall, [[np.zeros(1)] * 2] * 3)
    with pytest.raises(RankError, match="ring_alltoall needs blocks of one shape"):
        ringlab.run(ring_alltoall, [[np.zeros(1), np.zeros(2)]] * 2)


# -- every algorithm ------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_everything_also_runs_when_sends_block_until_received(n):
    xs = vectors(n, 7, 0)
    root = n - 1
    bcast = [xs[0] if r == root else None for r in range(n)]
    runs = [(ring_allgather, xs, {}), (naive_allgather, xs, {}), (ring_reduce_scatter, xs, {}),
            (binomial_reduce, xs, {"root": root}), (tree_allreduce, xs, {}),
            (alltoall, send_buffers(n, 2, 0), {}), (pairwise_alltoall, send_buffers(n, 2, 0), {}),
            (ring_alltoall, send_buffers(n, 2, 0), {})]
    runs += [(b, bcast, {"root": root}) for b in BROADCASTS]
    if n & (n - 1) == 0:
        runs.append((recursive_doubling_allgather, xs, {}))
    for program, inputs, kwargs in runs:
        buffered = ringlab.run(program, inputs, kwargs=kwargs)
        rendezvous = ringlab.run(program, inputs, kwargs=kwargs, mode="rendezvous")
        assert rendezvous.trace == buffered.trace, program.__name__
