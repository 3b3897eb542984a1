"""Context parallelism: ring attention, all-gather CP and Ulysses against the unsharded
ringlab.nn attention (forward, dx and every weight gradient, 1e-12), their traces
(who sends what to whom), the bytes per rank against the closed forms, the causal
load of the two layouts and the overlap of the ring's hops, on simulated time."""

import numpy as np
import pytest

import ringlab
from ringlab.frontier.blockwise import block_attention, block_attention_backward, causal_pairs
from ringlab.frontier.context_parallel import ContextParallelAttention, cp_bytes_per_rank
from ringlab.frontier.layout import positions, shard, unshard
from ringlab.frontier.ring_attention import RingAttention, ring_attention, zigzag_ring_attention
from ringlab.nn import CausalSelfAttention

ATOL = 1e-12
DIM, HEADS, B = 8, 4, 2


def data(*shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def run_layer(method, layout, c, kv_heads, **options):
    """The CP layer on c ranks, forward and backward; the whole-sequence results."""
    attn = CausalSelfAttention(DIM, HEADS, np.random.default_rng(0), kv_heads=kv_heads)
    s = 4 * c
    x, dy = data(B, s, DIM, seed=1), data(B, s, DIM, seed=2)

    def program(comm, _):
        layer = ContextParallelAttention.from_attention(attn, comm, method, layout, **options)
        y = layer.forward(shard(x, comm.rank, c, layout, axis=1))
        dx = layer.backward(shard(dy, comm.rank, c, layout, axis=1))
        return y, dx, {k: g.copy() for k, g in layer.named_grads().items()}

    before = {k: p.copy() for k, p in attn.named_parameters().items()}
    res = ringlab.run(program, [None] * c)
    # The ranks trained replicas: the layer they came from is untouched, and is the reference.
    assert all(np.array_equal(before[k], p) for k, p in attn.named_parameters().items())
    assert not any(g.any() for g in attn.named_grads().values())
    want = attn.forward(x), attn.backward(dy), attn.named_grads()
    return res, want, (x, dy)


CONFIGS = [(m, lay, c, g) for m in ("ring", "allgather", "ulysses")
           for lay in ("contiguous", "zigzag") for c in (1, 2, 4) for g in (HEADS, 2, 1)
           if not (m == "ulysses" and g % c)] + [("ring", "contiguous", 3, 2),
                                                 ("allgather", "zigzag", 3, 4)]


@pytest.mark.parametrize("method,layout,c,kv_heads", CONFIGS)
def test_cp_attention_equals_the_unsharded_layer(method, layout, c, kv_heads):
    res, (y_ref, dx_ref, grads_ref), _ = run_layer(method, layout, c, kv_heads)
    y = unshard([o[0] for o in res.outputs], layout, axis=1)
    dx = unshard([o[1] for o in res.outputs], layout, axis=1)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=ATOL)
    np.testing.assert_allclose(dx, dx_ref, rtol=0, atol=ATOL)
    for name, g in grads_ref.items():       # each rank's weight gradients: its tokens' share
        np.testing.assert_allclose(sum(o[2][name] for o in res.outputs), g, rtol=0, atol=ATOL)
    # Bytes: forward and backward, against the closed forms.
    h_kv = kv_heads * DIM // HEADS
    want = sum(cp_bytes_per_rank(method, c, DIM, 4 * c, B, h_kv=h_kv, backward=bw)
               for bw in (False, True))
    assert res.trace.bytes_sent() == [want] * c


# -- the exercise's function ------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("c", [1, 2, 3, 5])
def test_ring_attention_function_and_its_messages(c, causal):
    n, H, d = 3, 2, 4
    q, k, v = (data(B, H, c * n, d, seed=i) for i in range(3))
    blocks = [tuple(a[:, :, r * n:(r + 1) * n] for a in (q, k, v)) for r in range(c)]
    res = ringlab.run(lambda comm, qkv: ring_attention(comm, *qkv, causal), blocks)
    pos = np.arange(c * n)
    want, _ = block_attention(q, k, v, pos, pos, causal)
    np.testing.assert_allclose(np.concatenate(res.outputs, axis=2), want, rtol=0, atol=ATOL)
    block_bytes = 2 * B * H * n * d * 8                  # one block: K and V
    for r in range(c):
        sent = sorted(res.trace.filter(src=r), key=lambda e: e.step)
        assert len(sent) == c - 1                        # each block once per hop
        assert all(e.dst == (r + 1) % c and e.nbytes == block_bytes for e in sent)
        assert [e.chunk for e in sent] == [(r - t) % c for t in range(c - 1)]
        assert all(e.shape == (2, B, H, n, d) for e in sent)   # never the whole sequence
    assert not [s for s in res.trace.spans if "allgather" in s.path]


def test_ring_attention_backward_messages():
    """K/V: c-1 hops; their gradients c hops, one hop behind, the last one home."""
    c, n, H, d = 4, 2, 2, 3
    q, k, v, dout = (data(1, H, c * n, d, seed=i) for i in range(4))

    def program(comm, _):
        att = RingAttention(comm, causal=True)
        mine = [a[:, :, comm.rank * n:(comm.rank + 1) * n] for a in (q, k, v, dout)]
        att.forward(*mine[:3])
        return att.backward(mine[3])

    res = ringlab.run(program, [None] * c)
    bwd = res.trace.filter(span="ring_attention.backward")
    for r in range(c):
        sent = sorted(bwd.filter(src=r), key=lambda e: e.step)
        assert len(sent) == 2 * c - 1 and all(e.dst == (r + 1) % c for e in sent)
        # In step t a rank passes on block (r - t) and its accumulated gradients.
        assert sorted(e.chunk for e in sent) == sorted(
            [(r - t) % c for t in range(c - 1)] + [(r - t) % c for t in range(c)])
        assert sent[-1].chunk == (r + 1) % c             # the last hop: home, to its owner
    pos = np.arange(c * n)
    out, lse = block_attention(q, k, v, pos, pos, True)
    want = block_attention_backward(q, k, v, pos, pos, True, lse, (dout * out).sum(-1), dout)
    for got, ref in zip(zip(*res.outputs), want):
        np.testing.assert_allclose(np.concatenate(got, axis=2), ref, rtol=0, atol=ATOL)


def test_zigzag_ring_attention_function():
    c, n, H, d = 3, 4, 2, 2
    q, k, v = (data(1, H, c * n, d, seed=i) for i in range(3))
    blocks = [tuple(shard(a, r, c, "zigzag", axis=2) for a in (q, k, v)) for r in range(c)]
    res = ringlab.run(lambda comm, qkv: zigzag_ring_attention(comm, *qkv), blocks)
    pos = np.arange(c * n)
    want, _ = block_attention(q, k, v, pos, pos, True)
    np.testing.assert_allclose(unshard(res.outputs, "zigzag", axis=2), want, rtol=0, atol=ATOL)


def test_ulysses_runs_alltoall_pairs_and_allgather_gathers():
    c = 4
    res, _, _ = run_layer("ulysses", "contiguous", c, HEADS)
    for phase in ("ulysses.forward", "ulysses.backward"):
        calls = [s for s in res.trace.spans if s.rank == 0 and s.name == "alltoall"
                 and s.path.startswith(phase)]
        assert len(calls) == 4                           # q, k, v, out (dout, dq, dk, dv)
        events = res.trace.filter(span=phase)
        pairs = [(e.src, e.dst) for e in events]     # every ordered pair, once per AlltoAll
        assert sorted(pairs) == sorted([(a, b) for a in range(c) for b in range(c)
                                        if a != b] * 4)
    res, _, _ = run_layer("allgather", "zigzag", c, 2)
    names = [s.name for s in res.trace.spans if s.rank == 0]
    assert names.count("ring_allgather") == 1 and names.count("ring_reduce_scatter") == 1


# -- layouts, causal load and overlap on simulated time -----------------------------------

def test_zigzag_layout_tiles_the_sequence_and_balances_causal_work():
    for c in (1, 2, 3, 4, 8):
        n = 4
        every = np.concatenate([positions("zigzag", r, c, n) for r in range(c)])
        assert sorted(every.tolist()) == list(range(c * n))
        work = [sum(causal_pairs(positions("zigzag", r, c, n), positions("zigzag", j, c, n))
                    for j in range(c)) for r in range(c)]
        assert len(set(work)) == 1                       # every rank: the same work
        flat = [sum(causal_pairs(positions("contiguous", r, c, n),
                                 positions("contiguous", j, c, n)) for j in range(c))
                for r in range(c)]
        assert flat == [n * (n + 1) // 2 + r * n * n for r in range(c)]


NET = ringlab.AlphaBeta(alpha=1e-5, beta=1e-8)
SPP = 1e-6                                               # simulated seconds per (query, key) pair


def timed(layout, overlap, c=4, n=8, H=2, d=4, backward=False):
    q, k, v = (data(1, H, c * n, d, seed=i) for i in range(3))

    def program(comm, _):
        att = RingAttention(comm, True, layout, seconds_per_pair=SPP, overlap=overlap)
        out = att.forward(*(shard(a, comm.rank, c, layout, axis=2) for a in (q, k, v)))
        return att.backward(np.ones_like(out)) if backward else out

    return ringlab.run(program, [None] * c, network=NET)


def test_causal_load_contiguous_against_zigzag_from_the_trace():
    c, n = 4, 8
    hop = 1e-5 + 1e-8 * (2 * 2 * n * 4 * 8)              # one K/V block: 1024 bytes
    for layout, overlap in [("contiguous", True), ("zigzag", True), ("zigzag", False)]:
        res = timed(layout, overlap)
        busy = [sum(x.duration for x in res.trace.computes if x.rank == r) for r in range(c)]
        if layout == "contiguous":                       # rank r: its diagonal and r full blocks
            assert busy == pytest.approx([SPP * (n * (n + 1) / 2 + r * n * n) for r in range(c)])
        else:                                            # s(s+1)/2 pairs, shared equally
            assert busy == pytest.approx([SPP * (c * n) * (c * n + 1) / 2 / c] * c)
        # Overlapped, each hop (20 us) hides under a step's compute (>= 32 us): the
        # makespan is the busiest rank's compute; without overlap the c-1 hops add up.
        want = max(busy) + (0 if overlap else (c - 1) * hop)
        assert res.time == pytest.approx(want)
    assert timed("zigzag", True).time < timed("contiguous", True).time * 0.6


def test_overlap_hides_all_hops_but_the_last_one_home_in_backward():
    c, n = 4, 8
    hop = 1e-5 + 1e-8 * 1024
    res = timed("zigzag", True, backward=True)
    busy = sum(x.duration for x in res.trace.computes if x.rank == 0)
    assert busy == pytest.approx(3 * SPP * (c * n) * (c * n + 1) / 2 / c)   # forward + 2x
    assert res.time == pytest.approx(busy + hop)         # the gradients' last hop is exposed
    res = timed("zigzag", False, backward=True)
    assert res.time == pytest.approx(busy + (3 * c - 2) * hop)   # c-1 + c-1 + c hops
    # The hops of the overlapped run ran on the communication stream, during compute.
    res = timed("zigzag", True)
    steps = [x for x in res.trace.computes if x.rank == 0]
    assert all(e.stream == 1 for e in res.trace)
    for e, compute in zip(sorted(res.trace.filter(src=0), key=lambda e: e.start), steps):
        assert compute.start <= e.start < e.end <= compute.end


def test_runs_are_deterministic():
    a, _, _ = run_layer("ring", "zigzag", 4, 2)
    b, _, _ = run_layer("ring", "zigzag", 4, 2)
    assert a.trace == b.trace
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a.outputs, b.outputs))


def test_bad_layouts_and_methods_are_named():
    with pytest.raises(ValueError, match="n = 3 tokens per rank must be even"):
        positions("zigzag", 0, 2, 3)
    with pytest.raises(ValueError, match="layout must be one of"):
        positions("striped", 0, 2, 4)
    with pytest.raises(ValueError, match="method must be one of"):
        cp_bytes_per_rank("tree", 2, 8, 8, 1)
