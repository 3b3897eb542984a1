"""GQA under tensor parallelism (ringlab.frontier.gqa_tp) against the unsharded GQA layer:
who holds which heads, forward, dx and every gradient shard (after the replicas'
gradient sync), bytes from the trace against gqa_tp_costs, and memory."""

import numpy as np
import pytest

import ringlab
from ringlab.frontier.gqa_tp import GQAParallelAttention, gqa_tp_costs, gqa_tp_layout
from ringlab.nn import CausalSelfAttention
from ringlab.tensor_parallel import ParallelAttention

ATOL = 1e-12
B, S, HD = 2, 3, 2


@pytest.mark.parametrize("H,G,t", [(4, 4, 2), (4, 2, 2), (8, 4, 2), (4, 2, 4), (4, 1, 4),
                                   (8, 2, 4), (8, 1, 2), (6, 3, 3), (4, 1, 1)])
def test_gqa_tp_equals_unsharded_gqa(H, G, t):
    dim = H * HD
    attn = CausalSelfAttention(dim, H, np.random.default_rng(0), kv_heads=G)
    x = np.random.default_rng(1).standard_normal((B, S, dim))
    dy = np.random.default_rng(2).standard_normal((B, S, dim))

    def program(comm, _):
        layer = GQAParallelAttention.from_attention(attn, comm)
        y = layer.forward(x)
        dx = layer.backward(dy)
        layer.sync_replicated_kv_grads()
        return (layer.heads, layer.kv_head_range, layer.qkv.columns, y, dx,
                {k: g.copy() for k, g in layer.named_grads().items()})

    res = ringlab.run(program, [None] * t)
    y_ref, dx_ref = attn.forward(x), attn.backward(dy)
    ref = attn.named_grads()
    layout = gqa_tp_layout(H, G, t)
    for r, (heads, kv, cols, y, dx, grads) in enumerate(res.outputs):
        assert (heads, kv) == layout[r]
        assert all(h // (H // G) in kv for h in heads)        # my queries' K/V heads are here
        np.testing.assert_allclose(y, y_ref, rtol=0, atol=ATOL)
        np.testing.assert_allclose(dx, dx_ref, rtol=0, atol=ATOL)
        np.testing.assert_allclose(grads["qkv.weight"], ref["qkv.weight"][:, cols], rtol=0,
                                   atol=ATOL)
        np.testing.assert_allclose(grads["qkv.bias"], ref["qkv.bias"][cols], rtol=0, atol=ATOL)
        rows = np.arange(heads.start * HD, heads.stop * HD)
        np.testing.assert_allclose(grads["proj.weight"], ref["proj.weight"][rows], rtol=0,
                                   atol=ATOL)
        np.testing.assert_allclose(grads["proj.bias"], ref["proj.bias"], rtol=0, atol=ATOL)
    # Every query head once; every K/V head on t/G ranks when G < t, on one otherwise.
    assert sorted(h for q, _ in layout for h in q) == list(range(H))
    held = [h for _, kv in layout for h in kv]
    assert all(held.count(g) == max(t // G, 1) for g in range(G))
    # Bytes: f and g's AllReduces as for plain attention, and the replicas' gradient sync.
    costs = gqa_tp_costs(dim, H, G, t, B, S)
    sync = res.trace.filter(span="tp.kv_grad_sync")
    assert sync.bytes_sent() == [costs["kv_grad_sync_bytes"]] * t
    rest = [a - b for a, b in zip(res.trace.bytes_sent(), sync.bytes_sent())]
    assert rest == [costs["tp_allreduce_bytes"]] * t


def test_without_the_sync_the_replicas_gradients_differ():
    """The pitfall the sync fixes: each replica's K/V gradient is its queries' share only."""
    attn = CausalSelfAttention(8, 4, np.random.default_rng(0), kv_heads=1)
    x = np.random.default_rng(1).standard_normal((B, S, 8))

    def program(comm, _):
        layer = GQAParallelAttention.from_attention(attn, comm)
        layer.forward(x)
        layer.backward(np.ones_like(x))
        return layer.qkv.grads["weight"][:, layer.kv_columns].copy()

    parts = ringlab.run(program, [None] * 4).outputs
    attn.forward(x)
    attn.backward(np.ones_like(x))
    whole = attn.qkv.grads["weight"][:, 8:]
    assert not np.allclose(parts[0], parts[1])
    np.testing.assert_allclose(sum(parts), whole, rtol=0, atol=ATOL)


def test_memory_and_layout_closed_forms():
    # Llama 3 70B-like: 64 query heads, 8 K/V heads, head_dim 128.
    for t in (1, 2, 4, 8, 16, 32):
        c = gqa_tp_costs(8192, 64, 8, t, b=1, s=8192, itemsize=2)
        assert c["kv_heads_per_rank"] == max(8 // t, 1) and c["kv_replicas"] == max(t // 8, 1)
        assert c["kv_activation_bytes"] == 2 * 8192 * max(8 // t, 1) * 128 * 2
        layout = gqa_tp_layout(64, 8, t)
        assert len({kv for _, kv in layout}) == min(t, 8)
    # Past t = G the K/V activations per rank stop shrinking.
    assert gqa_tp_costs(8192, 64, 8, 16, 1, 8192)["kv_activation_bytes"] == \
        gqa_tp_costs(8192, 64, 8, 8, 1, 8192)["kv_activation_bytes"]


def test_bad_degrees_and_plain_tp_refuse():
    with pytest.raises(ValueError, match="t must divide G"):
        gqa_tp_layout(12, 6, 4)
    with pytest.raises(ValueError, match="G must divide t"):
        gqa_tp_layout(12, 2, 3)
    attn = CausalSelfAttention(8, 4, np.random.default_rng(0), kv_heads=2)
    with pytest.raises(ringlab.RankError, match="Use GQAParallelAttention"):
        ringlab.run(lambda comm, _: ParallelAttention.from_attention(attn, comm), [None] * 2)
