"""ringlab.nn against torch autograd, finite differences, torch.optim and itself.

Every forward and every gradient is compared with torch in float64, with the
same weights copied in; torch runs on one thread (the tests must fit 2 cores).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ringlab.nn import GPT, MLP, SGD, Adam, CausalSelfAttention, Embedding, FlatBuffer, GeLU, LayerNorm, Linear, TransformerBlock, count_params, cross_entropy, flatten, mlp_model, mse, param_bytes
from ringlab.nn.data import ArithmeticTokens, Blobs, TeacherRegression

torch.set_num_threads(1)
TOL = 1e-10


def rel(a, b):
    """Relative error of a against the reference b, in the 2-norm."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def rng(seed=0):
    return np.random.default_rng(seed)


# --- torch references, written from torch.nn.functional, on a dict of named tensors ---

def t_linear(p, pre, x):
    return x @ p[pre + "weight"] + p[pre + "bias"] if pre + "bias" in p else x @ p[pre + "weight"]


def t_layer_norm(p, pre, x):
    return F.layer_norm(x, x.shape[-1:], p[pre + "weight"], p[pre + "bias"], eps=1e-5)


def t_attention(p, pre, x, n_heads):
    B, T, dim = x.shape
    q, k, v = t_linear(p, pre + "qkv.", x).reshape(B, T, 3, n_heads, -1).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return t_linear(p, pre + "proj.", out.transpose(1, 2).reshape(B, T, dim))


def t_mlp(p, pre, x, approximate="tanh"):
    return t_linear(p, pre + "proj.", F.gelu(t_linear(p, pre + "fc.", x), approximate=approximate))


def t_block(p, pre, x, n_heads):
    x = x + t_attention(p, pre + "attn.", t_layer_norm(p, pre + "ln1.", x), n_heads)
    return x + t_mlp(p, pre + "mlp.", t_layer_norm(p, pre + "ln2.", x))


def t_gpt(p, ids, n_heads, n_layers):
    x = p["tok_emb.weight"][ids] + p["pos_emb.weight"][: ids.shape[1]]
    for i in range(n_layers):
        x = t_block(p, f"blocks.{i}.", x, n_heads)
    return t_linear(p, "head.", t_layer_norm(p, "ln_f.", x))


def check_against_torch(module, x, torch_fn, dy=None):
    """Forward, backward with a random dy, and every gradient against torch autograd."""
    y = module.forward(x)
    dy = rng(99).standard_normal(y.shape) if dy is None else dy
    dx = module.backward(dy)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in module.named_parameters().items()}
    floating = np.issubdtype(x.dtype, np.floating)
    tx = torch.tensor(x, requires_grad=floating)
    ty = torch_fn(tp, tx)
    (ty * torch.tensor(dy)).sum().backward()
    assert rel(y, ty.detach()) <= TOL
    if floating:
        assert rel(dx, tx.grad) <= TOL
    for name, g in module.named_grads().items():
        assert rel(g, tp[name].grad) <= TOL, name


def x_of(*shape, seed=1):
    return rng(seed).standard_normal(shape)


# --- layers against torch -----------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias):
    check_against_torch(Linear(5, 3, rng(), bias=bias), x_of(2, 4, 5),
                        lambda p, x: t_linear(p, "", x))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_matches_torch(approximate):
    check_against_torch(GeLU(approximate), x_of(3, 7) * 3,
                        lambda p, x: F.gelu(x, approximate=approximate))


def test_layer_norm_matches_torch():
    ln = LayerNorm(6)
    ln.params["weight"][:] = x_of(6, seed=2)      # not the trivial 1 and 0
    ln.params["bias"][:] = x_of(6, seed=3)
    check_against_torch(ln, x_of(2, 3, 6) * 4 + 1, lambda p, x: t_layer_norm(p, "", x))


def test_embedding_matches_torch():
    ids = np.array([[0, 3, 3], [4, 0, 3]])         # repeated ids must add up
    check_against_torch(Embedding(5, 4, rng()), ids, lambda p, x: F.embedding(x, p["weight"]))


def test_attention_matches_torch():
    check_against_torch(CausalSelfAttention(8, 2, rng()), x_of(2, 5, 8),
                        lambda p, x: t_attention(p, "", x, 2))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_mlp_matches_torch(approximate):
    check_against_torch(MLP(6, 10, rng(), approximate), x_of(2, 3, 6),
                        lambda p, x: t_mlp(p, "", x, approximate))


def test_block_matches_torch():
    check_against_torch(TransformerBlock(8, 4, 16, rng()), x_of(2, 5, 8),
                        lambda p, x: t_block(p, "", x, 4))


def test_gpt_with_cross_entropy_matches_torch():
    model = GPT(vocab=11, dim=8, n_heads=2, hidden=16, n_layers=2, seq_len=7, rng=rng())
    ids, targets = rng(5).integers(11, size=(3, 6)), rng(6).integers(11, size=(3, 6))
    loss, dlogits = cross_entropy(model.forward(ids), targets)
    model.backward(dlogits)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in model.named_parameters().items()}
    tlogits = t_gpt(tp, torch.tensor(ids), 2, 2)
    tloss = F.cross_entropy(tlogits.reshape(-1, 11), torch.tensor(targets).reshape(-1))
    tloss.backward()
    assert abs(loss - tloss.item()) <= TOL * abs(tloss.item())
    for name, g in model.named_grads().items():
        assert rel(g, tp[name].grad) <= TOL, name


def test_mse_and_cross_entropy_match_torch():
    pred, target = x_of(4, 3), x_of(4, 3, seed=2)
    tpred = torch.tensor(pred, requires_grad=True)
    F.mse_loss(tpred, torch.tensor(target)).backward()
    loss, dpred = mse(pred, target)
    assert abs(loss - F.mse_loss(tpred, torch.tensor(target)).item()) <= 1e-15
    assert rel(dpred, tpred.grad) <= TOL
    big = x_of(5, 4) * 1000                          # stable: no overflow to inf or nan
    loss, dlogits = cross_entropy(big, np.array([0, 1, 2, 3, 0]))
    tbig = torch.tensor(big, requires_grad=True)
    tloss = F.cross_entropy(tbig, torch.tensor([0, 1, 2, 3, 0]))
    tloss.backward()
    assert abs(loss - tloss.item()) <= TOL * tloss.item() and rel(dlogits, tbig.grad) <= TOL


def test_attention_heads_split_across_ranks_sum_to_the_whole():
    """Tensor parallelism's premise: heads are independent until the projection."""
    dim, n_heads, ranks = 8, 4, 2
    full, x = CausalSelfAttention(dim, n_heads, rng()), x_of(2, 5, dim)
    width = dim // ranks                                  # q (or k, v) columns per rank
    total = 0
    for r in range(ranks):
        # Rank r's heads: column block r of each of the q, k and v parts of qkv.
        cols = np.concatenate([np.arange(part * dim + r * width, part * dim + (r + 1) * width)
                               for part in range(3)])
        local = CausalSelfAttention(dim, n_heads, rng())
        local.qkv = Linear(dim, 3 * width, rng())
        local.proj = Linear(width, dim, rng(), bias=(r == 0))   # add the bias only once
        local.qkv.params["weight"][:] = full.qkv.params["weight"][:, cols]
        local.qkv.params["bias"][:] = full.qkv.params["bias"][cols]
        local.proj.params["weight"][:] = full.proj.params["weight"][r * width:(r + 1) * width]
        if r == 0:
            local.proj.params["bias"][:] = full.proj.params["bias"]
        total = total + local.forward(x)
        assert local.flops(x.shape) * ranks == full.flops(x.shape)
    assert rel(total, full.forward(x)) <= 1e-14


# --- finite differences ---------------------------------------------------------------------

def finite_difference_check(module, x, h=1e-6):
    """Central differences of sum(forward(x) * dy) for x and every parameter entry."""
    dy = rng(7).standard_normal(module.forward(x).shape)
    module.zero_grad()
    dx = module.backward(dy)
    f = lambda: float((module.forward(x) * dy).sum())  # noqa: E731
    for arr, grad in [(x, dx), *zip(module.named_parameters().values(),
                                    module.named_grads().values())]:
        numeric = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + h
            up = f()
            arr[i] = old - h
            numeric[i] = (up - f()) / (2 * h)
            arr[i] = old
        assert rel(grad, numeric) <= 1e-7


@pytest.mark.parametrize("make", [lambda: LayerNorm(4), lambda: CausalSelfAttention(4, 2, rng()),
                                  lambda: GeLU(), lambda: GeLU("none"),
                                  lambda: TransformerBlock(4, 2, 6, rng())])
def test_finite_differences(make):
    finite_difference_check(make(), x_of(2, 3, 4))


# --- float32 --------------------------------------------------------------------------------

def test_float32_agrees_with_float64():
    kw = dict(vocab=13, dim=16, n_heads=2, hidden=32, n_layers=2, seq_len=8)
    m64, m32 = GPT(**kw, rng=rng()), GPT(**kw, rng=rng(), dtype=np.float32)
    ids, targets = rng(1).integers(13, size=(4, 8)), rng(2).integers(13, size=(4, 8))
    losses = []
    for m in (m64, m32):
        logits = m.forward(ids)
        loss, dlogits = cross_entropy(logits, targets)
        m.backward(dlogits)
        losses.append(loss)
    assert logits.dtype == np.float32
    assert abs(losses[0] - losses[1]) <= 1e-5 * losses[0]
    for (name, g64), g32 in zip(m64.named_grads().items(), m32.named_grads().values()):
        assert g32.dtype == np.float32 and rel(g32, g64) <= 1e-4, name
    x = x_of(3, 16)
    y64, y32 = MLP(16, 32, rng()).forward(x), MLP(16, 32, rng(), dtype=np.float32).forward(
        x.astype(np.float32))
    assert y32.dtype == np.float32 and rel(y32, y64) <= 1e-5


# --- module plumbing ------------------------------------------------------------------------

def test_names_order_accumulation_and_zero_grad():
    model = GPT(vocab=5, dim=4, n_heads=2, hidden=8, n_layers=2, seq_len=3, rng=rng())
    names = list(model.named_parameters())
    assert names[:2] == ["tok_emb.weight", "pos_emb.weight"]
    assert "blocks.1.attn.qkv.weight" in names and names[-1] == "head.weight"
    assert list(model.named_grads()) == names
    ids = np.array([[1, 2, 3]])
    model.backward(cross_entropy(model.forward(ids), ids)[1])
    once = {k: g.copy() for k, g in model.named_grads().items()}
    model.backward(cross_entropy(model.forward(ids), ids)[1])      # accumulates
    for k, g in model.named_grads().items():
        assert np.allclose(g, 2 * once[k], rtol=1e-12, atol=0)
    model.zero_grad()
    assert all(not g.any() for g in model.named_grads().values())
    assert count_params(model) == sum(p.size for p in model.named_parameters().values())
    assert param_bytes(model) == 8 * count_params(model)


def test_flops():
    assert Linear(3, 4, rng()).flops((2, 5, 3)) == 2 * 10 * 3 * 4
    seq = mlp_model([3, 8, 2], rng())
    assert seq.flops((5, 3)) == 2 * 5 * (3 * 8 + 8 * 2)
    model = GPT(vocab=5, dim=4, n_heads=2, hidden=8, n_layers=1, seq_len=3, rng=rng())
    B, T, d, h, v = 2, 3, 4, 8, 5
    expected = 2 * B * T * (3 * d * d + d * d + 2 * d * h + d * v) + 4 * B * T * T * d
    assert model.flops((B, T)) == expected


# --- optimizers against torch.optim ---------------------------------------------------------

def run_against_torch(make_ours, make_torch, steps=5):
    params = {"a": x_of(3, 4), "b": x_of(5, seed=2)}
    grads = [{k: x_of(*v.shape, seed=10 * s + i) for i, (k, v) in enumerate(params.items())}
             for s in range(steps)]
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    ids = {k: id(v) for k, v in params.items()}
    opt, topt = make_ours(params), make_torch(list(tparams.values()))
    for g in grads:
        opt.step(g)
        for k, tp in tparams.items():
            tp.grad = torch.tensor(g[k])
        topt.step()
    for k, v in params.items():
        assert id(v) == ids[k]                           # updated in place
        assert rel(v, tparams[k].detach()) <= 1e-12
    return opt


@pytest.mark.parametrize("momentum, weight_decay", [(0, 0), (0.9, 0), (0.9, 0.01), (0, 0.1)])
def test_sgd_matches_torch(momentum, weight_decay):
    run_against_torch(lambda p: SGD(p, lr=0.1, momentum=momentum, weight_decay=weight_decay),
                      lambda p: torch.optim.SGD(p, lr=0.1, momentum=momentum,
                                                weight_decay=weight_decay))


@pytest.mark.parametrize("weight_decay", [0, 0.05])
def test_adam_matches_torch(weight_decay):
    opt = run_against_torch(
        lambda p: Adam(p, lr=0.01, weight_decay=weight_decay),
        lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=weight_decay, foreach=False))
    assert opt.state["a"]["step"] == 5 and opt.state["b"]["m"].shape == (5,)
    defaults = Adam(np.zeros(1))                         # torch's defaults, which ours copies
    assert (defaults.lr, defaults.betas, defaults.eps) == (1e-3, (0.9, 0.999), 1e-8)
    with pytest.raises(ValueError, match="named_parameters"):
        Adam(GPT(5, 4, 2, 8, 1, 3, rng()).params)         # a composite's own params: empty


def test_adam_on_a_shard_equals_adam_on_the_whole():
    params = {"a": x_of(3, 4), "b": x_of(5, seed=2)}
    whole = {k: v.copy() for k, v in params.items()}
    flat, gflat = flatten(params, pad_to=4), flatten({k: 0.1 * v for k, v in params.items()},
                                                     pad_to=4)
    shard_opts = [Adam(flat.shard(r, 4), lr=0.1) for r in range(4)]  # ZeRO-style: 4 slices
    whole_opt = Adam(whole, lr=0.1)
    for _ in range(3):
        for r, opt in enumerate(shard_opts):
            opt.step(gflat.shard(r, 4))
        whole_opt.step({k: 0.1 * v for k, v in params.items()})
    for k in params:
        np.testing.assert_array_equal(flat.views[k], whole[k])


# --- flat buffers ---------------------------------------------------------------------------

def test_flat_buffer_views_roundtrip_padding_shards():
    arrays = {"w": x_of(2, 3), "b": x_of(4, seed=2), "s": x_of(1, 1, seed=3)}
    flat = FlatBuffer(arrays, pad_to=4)
    assert flat.numel == 11 and len(flat) == 12 and flat.data[11] == 0
    assert flat.offsets == {"w": 0, "b": 6, "s": 10}
    for k, a in arrays.items():                          # roundtrip, same shapes
        np.testing.assert_array_equal(flat.views[k], a)
        assert np.shares_memory(flat.views[k], flat.data)
    flat.views["b"][1] = 42.0                            # view -> buffer
    assert flat.data[7] == 42.0
    flat.data[10] = -1.0                                 # buffer -> view
    assert flat.views["s"][0, 0] == -1.0
    assert [len(flat.shard(r, 3)) for r in range(3)] == [4, 4, 4]
    assert flat.shard_range(3, 4) == (9, 12)
    np.testing.assert_array_equal(np.concatenate([flat.shard(r, 4) for r in range(4)]),
                                  flat.data)
    with pytest.raises(ValueError, match="pad_to=5"):
        flat.shard(0, 5)
    assert flatten(arrays).data.size == 11


def test_rebind_puts_model_inside_a_flat_buffer():
    model = mlp_model([3, 4, 2], rng())
    flat, gflat = flatten(model.named_parameters()), flatten(model.named_grads())
    model.rebind(params=flat.views, grads=gflat.views)
    x = x_of(5, 3)
    model.backward(mse(model.forward(x), 0 * model.forward(x))[1])
    assert gflat.data.any()                              # backward wrote into the buffer
    opt = SGD(flat.data, lr=0.1)
    before = model.forward(x).copy()
    opt.step(gflat.data)                                 # one step on the flat buffer
    assert not np.array_equal(model.forward(x), before)  # ...is a step of the model
    with pytest.raises(ValueError):
        model.rebind(params={"0.weight": np.zeros(3)})
    with pytest.raises(ValueError):
        model.rebind(params={"0.weight": np.zeros((3, 4), np.float32)})


# --- training and determinism ---------------------------------------------------------------

def train(model, opt, batches, steps):
    """The cross-entropy losses of ``steps`` steps of ``opt`` on the first batches."""
    losses = []
    for _, (x, y) in zip(range(steps), batches):
        model.zero_grad()
        loss, dlogits = cross_entropy(model.forward(x), y)
        model.backward(dlogits)
        opt.step(model.named_grads())
        losses.append(loss)
    return losses


def train_gpt(seed, steps=150):
    data = ArithmeticTokens(vocab=16, seq_len=12)
    model = GPT(vocab=16, dim=32, n_heads=4, hidden=64, n_layers=2, seq_len=12, rng=rng(seed))
    opt = Adam(model.named_parameters(), lr=1e-2)
    return train(model, opt, data.batches(16, seed=seed), steps)


def test_gpt_learns_arithmetic_tokens_deterministically():
    losses = train_gpt(0)
    start, end = np.mean(losses[:5]), np.mean(losses[-10:])
    assert end < 0.1 * start, (start, end)
    # Better than any bigram model, which cannot beat log(3) beyond the first token.
    assert end < math.log(3)
    assert train_gpt(0, steps=20) == losses[:20]         # bitwise identical


def train_mlp(seed, steps=150):
    data = Blobs(n_samples=512, dim=8, n_classes=4, seed=seed)
    model = mlp_model([8, 32, 4], rng(seed))
    opt = SGD(model.named_parameters(), lr=0.1, momentum=0.9)
    return train(model, opt, data.batches(32, seed=seed), steps)


def test_mlp_learns_blobs_deterministically():
    losses = train_mlp(0)
    assert np.mean(losses[-10:]) < 0.1 * np.mean(losses[:5])
    assert train_mlp(0) == losses


def test_mlp_learns_teacher_regression():
    data, model = TeacherRegression(seed=1), mlp_model([8, 32, 2], rng(1))
    opt = Adam(model.named_parameters(), lr=1e-2)
    losses = []
    for _, (x, y) in zip(range(200), data.batches(32, seed=1)):
        model.zero_grad()
        loss, dpred = mse(model.forward(x), y)
        model.backward(dpred)
        opt.step(model.named_grads())
        losses.append(loss)
    assert np.mean(losses[-10:]) < 0.1 * np.mean(losses[:5])
