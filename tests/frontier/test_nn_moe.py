"""The mixture-of-experts MLP (ringlab.nn.moe) against torch autograd.

The torch reference routes with ``torch.topk``, places assignments in the
capacity buffer with cumulative sums as fairscale's top-2 gating does
(second choices after all first choices), computes every token's output one
token at a time, and differentiates task loss + aux loss with autograd."""

import math

import numpy as np
import pytest

from ringlab.nn import MoE
from ringlab.nn.moe import expert_capacity, load_balancing_loss, route

from support.torch_leaves import torch_leaves

torch = pytest.importorskip("torch")
F = torch.nn.functional


def torch_moe(moe, x, dy):
    """y, dx and the parameter gradients of sum(y * dy) + aux_loss, in torch."""
    W, xt = torch_leaves(moe, x)
    x2 = xt.reshape(-1, x.shape[-1])
    N, E, k = x2.shape[0], moe.n_experts, moe.top_k
    logits = x2 @ W["router.weight"]
    probs = torch.softmax(logits, dim=-1)
    top_logits, top = torch.topk(logits, k, dim=-1)              # sorted, largest first
    gates = (torch.softmax(top_logits, dim=-1) if moe.gating == "topk_softmax"
             else torch.gather(probs, 1, top))
    masks = F.one_hot(top, E)                                     # (N, k, E)
    if moe.capacity_factor is None:
        kept = torch.ones(N, k, dtype=torch.bool)
    else:
        C = math.ceil(moe.capacity_factor * k * N / E)
        before = torch.zeros(E, dtype=torch.long)
        kept = torch.zeros(N, k, dtype=torch.bool)
        for j in range(k):
            loc = torch.cumsum(masks[:, j], dim=0) - 1 + before    # place in the expert's buffer
            kept[:, j] = ((loc < C) & (masks[:, j] == 1)).any(dim=1)
            before = before + masks[:, j].sum(dim=0)
    outs = []
    for n in range(N):
        y_n = torch.zeros(x.shape[-1], dtype=torch.float64)
        for j in range(k):
            if kept[n, j]:
                i = int(top[n, j])
                h = x2[n] @ W[f"experts.{i}.fc.weight"] + W[f"experts.{i}.fc.bias"]
                h = F.gelu(h, approximate="tanh")
                y_n = y_n + gates[n, j] * (h @ W[f"experts.{i}.proj.weight"]
                                           + W[f"experts.{i}.proj.bias"])
        outs.append(y_n)
    y = torch.stack(outs).reshape(x.shape)
    f = masks.sum(dim=(0, 1)).double() / (N * k)                  # a count: no gradient
    aux = moe.aux_loss_coef * E * (f * probs.mean(dim=0)).sum()
    ((y * torch.tensor(dy)).sum() + aux).backward()
    return (y.detach().numpy(), float(aux.detach()), xt.grad.numpy(),
            {name: w.grad.numpy() for name, w in W.items()}, kept.numpy())


CASES = [dict(top_k=2, capacity_factor=None, gating="topk_softmax"),
         dict(top_k=2, capacity_factor=1.0, gating="topk_softmax"),
         dict(top_k=2, capacity_factor=0.5, gating="topk_softmax"),
         dict(top_k=1, capacity_factor=1.25, gating="softmax_topk"),   # Switch
         dict(top_k=3, capacity_factor=0.75, gating="softmax_topk")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_moe_equals_torch_autograd(case):
    moe = MoE(dim=4, hidden=6, n_experts=4, rng=np.random.default_rng(0), aux_loss_coef=0.1,
              **case)
    x = np.random.default_rng(1).standard_normal((2, 5, 4))
    dy = np.random.default_rng(2).standard_normal((2, 5, 4))
    y = moe.forward(x)
    dx = moe.backward(dy)
    y_t, aux_t, dx_t, grads_t, kept_t = torch_moe(moe, x, dy)
    assert np.array_equal(moe.routing.kept, kept_t)
    if case["capacity_factor"] is not None and case["capacity_factor"] < 1:
        assert not moe.routing.kept.all()                  # the case really drops some
    np.testing.assert_allclose(y, y_t, rtol=0, atol=1e-12)
    assert moe.aux_loss == pytest.approx(aux_t, rel=1e-12)
    np.testing.assert_allclose(dx, dx_t, rtol=0, atol=1e-12)
    for name, g in moe.named_grads().items():
        np.testing.assert_allclose(g, grads_t[name], rtol=0, atol=1e-12, err_msg=name)
    assert np.abs(moe.named_grads()["router.weight"]).max() > 0


def test_capacity_keeps_first_choices_first_then_earlier_tokens():
    # Six tokens, two experts; expert 0 is everyone's first choice, capacity 3.
    logits = np.array([[2.0, 1.0]] * 6)
    r = route(logits, top_k=2, capacity_factor=0.5)
    assert r.capacity == expert_capacity(6, 2, 2, 0.5) == 3
    assert r.kept[:, 0].tolist() == [True, True, True, False, False, False]
    assert r.kept[:, 1].tolist() == [True, True, True, False, False, False]
    assert r.dropped_tokens().tolist() == [3, 4, 5]
    # Capacity 4: all first choices of expert 0 fit up to token 3; expert 1's
    # second choices take tokens 0-3, so tokens 4 and 5 are dropped entirely.
    r = route(logits, top_k=2, capacity_factor=4 / 6)
    assert r.capacity == 4 and r.tokens_per_expert().tolist() == [4, 4]
    assert r.dropped_tokens().tolist() == [4, 5]


def test_second_choices_are_dropped_before_first_choices():
    # Expert 1 is token 0's second choice and token 1's first choice; capacity 1.
    logits = np.array([[3.0, 2.0, 0.0], [0.0, 3.0, 2.0], [0.0, 2.0, 3.0]])
    r = route(logits, top_k=2, capacity_factor=0.5)          # ceil(0.5 * 2 * 3 / 3) = 1
    assert r.expert.tolist() == [[0, 1], [1, 2], [2, 1]]
    assert r.kept.tolist() == [[True, False], [True, False], [True, False]]


def test_aux_loss_is_one_when_balanced_and_grows_with_imbalance():
    E, T = 4, 8
    logits = np.zeros((T, E))
    logits[np.arange(T), np.arange(T) % E] = 1.0             # each expert first for 2 tokens
    balanced = load_balancing_loss(route(logits, top_k=1))[0]
    logits[:, 0] += 5.0                                      # everyone prefers expert 0
    skewed = load_balancing_loss(route(logits, top_k=1))[0]
    assert balanced == pytest.approx(1.0)
    assert skewed > 3.0                                      # f_0 = 1, P_0 near 1: about E


def test_routing_dense_gates_and_rows_agree():
    moe = MoE(dim=4, hidden=6, n_experts=5, top_k=2, rng=np.random.default_rng(3),
              capacity_factor=0.8)
    moe.forward(np.random.default_rng(4).standard_normal((12, 4)))
    r = moe.routing
    dense = r.dense_gates()
    assert ((dense > 0).sum(axis=1) == r.kept.sum(axis=1)).all()
    for i in range(5):
        rows, gates = r.rows(i)
        assert rows.tolist() == np.flatnonzero(dense[:, i]).tolist()   # token order
        assert np.array_equal(gates, dense[rows, i])
    assert r.tokens_per_expert().max() <= r.capacity


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="top_k=5 must be in 1..n_experts=4"):
        MoE(4, 6, 4, 5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="gating must be one of"):
        MoE(4, 6, 4, 2, np.random.default_rng(0), gating="softmax")
