"""FLOPs per iteration: counted from the matmuls, Narayanan et al.'s closed form, 6ND.

A transformer's FLOPs are its matmuls' (2 per multiply-add). Per layer and
token, forward: ``2 x`` the layer's weight-matrix entries (QKV, output
projection, the MLP), plus attention's two s x s products, ``2 x 2 s h``;
the logits add ``2 h V`` per token. Backward costs twice the forward (the
gradients with respect to the input and to the weights); full activation
recomputation runs the forward once more. So an iteration of B sequences:

    F = (3 + [recompute]) x B s (l (2 W + 4 s h) + 2 h V)

with W the matrix entries of one layer. For GPT (W = 12h^2) with full
recomputation this is Narayanan et al. (2021), equation 3,
``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``; without recomputation the layers
take 72 in place of 96 while the logits keep their ``6 B s h V``:
``72 B s l h^2 (1 + s/(6h)) + 6 B s h V``, the *model* FLOPs that MFU counts
(Korthikanti et al. 2022, sec. 6).

How long those FLOPs take is ``ringlab.analysis.timing``'s business: this
module only counts.

The "6ND" rule (Kaplan et al. 2020): 6 FLOPs per parameter per token, D = B s
tokens. It is ``F`` without recomputation with the attention products
(``4 s h`` per layer) left out and N = l W + V h: the two agree to within
``s / (6 h)`` (a few percent for large h).

    >>> from ringlab.analysis.config import Model
    >>> gpt = Model("gpt", layers=2, hidden=64, heads=4, seq_len=32, vocab=100)
    >>> B, s, l, h, V = 8, 32, 2, 64, 100
    >>> eq3 = 96 * B * s * l * h**2 + 16 * B * s**2 * l * h + 6 * B * s * h * V
    >>> flops_per_iteration(gpt, B, "full") == eq3     # eq. 3 multiplied out, in integers
    True
"""

from __future__ import annotations


def layer_matrix_entries(model):
    """W: entries of one dense layer's weight matrices (no biases, no LayerNorm)."""
    h, f = model.hidden, model.ffn
    kv = model.kv_dim
    return h * (h + 2 * kv) + h * h + (3 if model.gated else 2) * h * f


def moe_layer_matrix_entries(model):
    """The matrix entries one token goes through in a layer with experts: attention,
    the router (h x experts), its ``top_k`` experts and the shared ones. The
    model FLOPs of a mixture of experts count the experts a token uses, not all."""
    if not model.experts:
        return layer_matrix_entries(model)
    h, kv = model.hidden, model.kv_dim
    expert = (3 if model.gated else 2) * h * model.moe_ffn
    return (h * (h + 2 * kv) + h * h + h * model.experts
            + (model.top_k + model.shared_experts) * expert)


def forward_flops_per_token(model):
    """Forward FLOPs of one token through the whole model: the layers and the logits."""
    s, h = model.seq_len, model.hidden
    attn = 4 * s * h
    return (model.dense_layers * (2 * layer_matrix_entries(model) + attn)
            + model.moe_layers * (2 * moe_layer_matrix_entries(model) + attn)
            + 2 * h * model.vocab)


def flops_per_iteration(model, batch, recompute="none"):
    """Matmul FLOPs of one iteration of ``batch`` sequences, forward and backward;
    ``recompute="full"`` adds a forward of the layers (Narayanan's eq. 3 counts
    the logits' forward only once). "selective" recomputes only attention's
    s x s products (Korthikanti et al. 2022): ``4 s^2 h`` per layer and sequence.
    Attention is counted over the whole s x s matrix, causal or not, as
    Narayanan et al., Korthikanti et al. and PaLM's MFU (Chowdhery et al. 2022)
    count it: the convention the published numbers use."""
    s = model.seq_len
    passes = 3 * batch * s * forward_flops_per_token(model)
    if recompute == "full":
        passes += batch * s * (forward_flops_per_token(model) - 2 * model.hidden * model.vocab)
    elif recompute == "selective":
        passes += batch * s * model.layers * 4 * s * model.hidden
    return passes


def narayanan_flops(batch, seq_len, layers, hidden, vocab, recompute=True):
    """Narayanan et al. (2021), equation 3: ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``
    with full recomputation; without, ``72 B s l h^2 (1 + s/(6h)) + 6 B s h V``
    (the logits are not recomputed). GPT shapes only (ffn = 4h, no GQA)."""
    s, l, h, B, V = seq_len, layers, hidden, batch, vocab
    if recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V


def six_n_d(model, batch):
    """The 6ND rule: 6 x (non-embedding parameters + the V x h logits matrix) x tokens,
    N counting the experts a token uses."""
    n = (model.dense_layers * layer_matrix_entries(model)
         + model.moe_layers * moe_layer_matrix_entries(model) + model.vocab * model.hidden)
    return 6 * n * batch * model.seq_len
