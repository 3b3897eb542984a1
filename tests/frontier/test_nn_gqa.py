"""Grouped-query attention (ringlab.nn.CausalSelfAttention with kv_heads) against torch:
the layer written with torch ops and differentiated by autograd, its attention core
torch's own ``scaled_dot_product_attention(is_causal=True, enable_gqa=True)``."""

import numpy as np
import pytest

from ringlab.nn import CausalSelfAttention

from support.torch_leaves import torch_leaves

torch = pytest.importorskip("torch")
F = torch.nn.functional


def torch_attention(layer, x, dy):
    """Forward and backward of ``layer``'s weights in torch (float64): y, dx, grads."""
    W, xt = torch_leaves(layer, x)
    B, T, dim = x.shape
    H, hd = layer.n_heads, layer.head_dim
    G = layer.kv_heads or H
    qkv = xt @ W["qkv.weight"] + W["qkv.bias"]
    q, k, v = qkv.split([H * hd, G * hd, G * hd], dim=-1)
    heads = lambda a: a.reshape(B, T, -1, hd).transpose(1, 2)  # noqa: E731
    out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True,
                                         enable_gqa=True)
    y = out.transpose(1, 2).reshape(B, T, H * hd) @ W["proj.weight"] + W["proj.bias"]
    y.backward(torch.tensor(dy))
    return (y.detach().numpy(), xt.grad.numpy(),
            {k: w.grad.numpy() for k, w in W.items()})


@pytest.mark.parametrize("n_heads,kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3), (6, 2)])
def test_gqa_forward_and_backward_equal_torch_autograd(n_heads, kv_heads):
    dim, B, T = 2 * n_heads, 2, 5
    layer = CausalSelfAttention(dim, n_heads, np.random.default_rng(0), kv_heads=kv_heads)
    x = np.random.default_rng(1).standard_normal((B, T, dim))
    dy = np.random.default_rng(2).standard_normal((B, T, dim))
    y = layer.forward(x)
    dx = layer.backward(dy)
    y_t, dx_t, grads_t = torch_attention(layer, x, dy)
    assert layer.qkv.params["weight"].shape == (dim, dim + 2 * kv_heads * 2)
    assert layer.k.shape == (B, kv_heads, T, 2)             # only G K/V heads are made
    np.testing.assert_allclose(y, y_t, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dx, dx_t, rtol=0, atol=1e-12)
    for name, g in layer.named_grads().items():
        np.testing.assert_allclose(g, grads_t[name], rtol=0, atol=1e-12, err_msg=name)


def test_kv_heads_equal_to_heads_is_plain_attention_bit_for_bit():
    plain = CausalSelfAttention(8, 4, np.random.default_rng(0))
    same = CausalSelfAttention(8, 4, np.random.default_rng(0), kv_heads=4)
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    assert np.array_equal(plain.forward(x), same.forward(x))
    assert np.array_equal(plain.backward(x), same.backward(x))
    assert all(np.array_equal(plain.named_grads()[k], g) for k, g in same.named_grads().items())
    assert plain.kv_heads is None and same.kv_heads is None   # both read heads from the width


def test_query_head_h_uses_kv_head_h_over_group():
    """With the K/V weights of head 1 zeroed, only query heads 2 and 3 (group 1) change."""
    layer = CausalSelfAttention(8, 4, np.random.default_rng(0), kv_heads=2)
    x = np.random.default_rng(1).standard_normal((1, 4, 8))
    layer.forward(x)
    before = layer.dropped @ np.repeat(layer.v, 2, axis=1)
    w = layer.qkv.params["weight"]
    w[:, 8 + 2:8 + 4] = 0                   # k head 1's columns (k part starts at column 8)
    layer.forward(x)
    after = layer.dropped @ np.repeat(layer.v, 2, axis=1)
    changed = [not np.allclose(before[0, h], after[0, h]) for h in range(4)]
    assert changed == [False, False, True, True]


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="kv_heads=3 must divide n_heads=4"):
        CausalSelfAttention(8, 4, np.random.default_rng(0), kv_heads=3)


def test_flops_count_query_heads():
    mha = CausalSelfAttention(8, 4, np.random.default_rng(0))
    mqa = CausalSelfAttention(8, 4, np.random.default_rng(0), kv_heads=1)
    shape = (2, 5, 8)
    # Same attention matmuls; the qkv projection is (8 + 2*2) wide instead of 24.
    assert mha.flops(shape) - mqa.flops(shape) == 2 * 10 * 8 * (24 - 12)
