"""A mixture-of-experts MLP: a router sends each token to k of E expert MLPs.

A token x goes through a router, ``logits = x @ W_r`` (a Linear without bias),
and ``probs = softmax(logits)`` over all E experts. It is sent to the k experts
with the largest probabilities (ties: the lower expert number), and its output
is the gated sum of theirs::

    y(x) = sum over its kept experts i of  gate_i(x) * expert_i(x)

Two gatings, both as published:

* ``gating="topk_softmax"`` (the default): a softmax over the k chosen logits,
  so a token's gates sum to 1. Mixtral's ``G(x) = Softmax(TopK(x W_g))``
  (Jiang et al. 2024), which equals GShard's top-2 gates renormalized to sum 1.
* ``gating="softmax_topk"``: the chosen experts' full-softmax probabilities,
  not renormalized; with k = 1 this is the Switch Transformer's
  ``y = p_i(x) E_i(x)`` (Fedus et al. 2021, section 2.1). (Mixtral's gating
  with k = 1 gives a gate of 1 and no gradient to the router but the aux loss.)

**Capacity.** With ``capacity_factor=c`` an expert takes at most
``C = ceil(c * k * T / E)`` of the T tokens' k*T assignments (Switch's "expert
capacity = (tokens per batch / number of experts) x capacity factor", section
2.2, with k*T assignments for top-k). Which ones it keeps is deterministic:
assignments queue in the order (choice, token), every token's first choice
before any token's second choice and, within one choice, earlier tokens
first; the first C are kept. So an expert drops *second choices first, then
later tokens first*. This is the order of GShard's top-2 gating as fairscale
and DeepSpeed implement it ("locations2 += sum(mask1)": second choices are
placed after all first choices). A dropped assignment contributes nothing
(the gates are not renormalized over what is left); a token with all k
dropped gets y = 0, so in a transformer block only the residual carries it.
``capacity_factor=None``: no capacity, nothing dropped (dropless, as
DeepSeek-V3 trains).

**Load-balancing loss** (Switch Transformer, eq. 4-6, section 2.2):
``aux = N * sum_i f_i * P_i`` with N = E experts, f_i the fraction of the
T*k assignments that chose expert i (before capacity; Megatron-Core's
``switch_load_balancing_loss_func`` for k > 1, Switch's own fraction of tokens
for k = 1) and P_i the mean router probability of expert i over the T
tokens. f is a count and has no gradient; P does. It is 1 when routing is
uniform. ``forward`` stores ``aux_loss = aux_loss_coef * aux``, and
``backward`` adds its gradient: the training loss is ``task + aux_loss``.

    >>> import numpy as np
    >>> moe = MoE(dim=4, hidden=8, n_experts=4, top_k=2, rng=np.random.default_rng(0),
    ...           capacity_factor=1.0)
    >>> x = np.random.default_rng(1).standard_normal((2, 3, 4))
    >>> moe.forward(x).shape, moe.routing.capacity       # ceil(1.0 * 2 * 6 / 4)
    ((2, 3, 4), 3)
    >>> moe.routing.expert.T                             # per token: best expert first
    array([[1, 0, 0, 3, 3, 2],
           [3, 3, 2, 2, 0, 0]])
    >>> moe.routing.kept.T        # expert 3: 1st choices of tokens 3, 4, then token 0's 2nd
    array([[ True,  True,  True,  True,  True,  True],
           [ True, False,  True,  True,  True, False]])
    >>> moe.routing.tokens_per_expert()                  # at most 3 each
    array([3, 1, 3, 3])
    >>> dx = moe.backward(np.ones((2, 3, 4)))            # adds task and aux gradients
    >>> list(moe.named_grads())[:3]
    ['router.weight', 'experts.0.fc.weight', 'experts.0.fc.bias']
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .attention import softmax
from .linear import Linear
from .mlp import MLP
from .module import Module, Sequential

GATINGS = ("topk_softmax", "softmax_topk")


def top_k_experts(probs, k):
    """(N, k) expert numbers, each row's k largest ``probs``, best first; a stable
    sort, so equal scores go to the lower expert number."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]


def expert_capacity(n_tokens, n_experts, top_k, capacity_factor):
    """C = ceil(capacity_factor * top_k * n_tokens / n_experts); None without a factor.

    >>> expert_capacity(10, 4, 2, 1.25)      # 1.25 * 20 / 4 = 6.25
    7
    """
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * top_k * n_tokens / n_experts)


def keep_within_capacity(expert, n_experts, capacity):
    """(N, k) bool: which assignments their expert keeps, taking them in the
    order (choice, token) until it has ``capacity`` (None: keep all)."""
    kept = np.ones(expert.shape, dtype=bool)
    if capacity is None:
        return kept
    taken = np.zeros(n_experts, dtype=int)
    for j in range(expert.shape[1]):              # every first choice, then every second...
        for n in range(expert.shape[0]):          # ... earlier tokens first
            i = expert[n, j]
            kept[n, j] = taken[i] < capacity
            taken[i] += kept[n, j]
    return kept


@dataclass
class Routing:
    """Where a batch of N tokens goes: ``expert`` (N, k) ints, best first;
    ``gate`` (N, k); ``kept`` (N, k) bool, False where capacity dropped the
    assignment; ``probs`` (N, E), the router's softmax; ``capacity`` (or None)."""

    expert: np.ndarray
    gate: np.ndarray
    kept: np.ndarray
    probs: np.ndarray
    capacity: int | None

    @property
    def n_experts(self):
        return self.probs.shape[1]

    def rows(self, i):
        """Tokens that expert i processes (kept assignments), in token order,
        and their gates for it."""
        hit = (self.expert == i) & self.kept          # a token chooses an expert at most once
        rows = np.flatnonzero(hit.any(axis=1))
        return rows, (self.gate * hit).sum(axis=1)[rows]

    def dense_gates(self):
        """(N, E): the gate of every kept assignment, 0 elsewhere -- the form
        ``moe_dispatch_combine`` takes."""
        out = np.zeros_like(self.probs)
        n, j = np.nonzero(self.kept)
        out[n, self.expert[n, j]] = self.gate[n, j]
        return out

    def tokens_per_expert(self):
        """(E,) how many tokens each expert processes (after capacity)."""
        return np.bincount(self.expert[self.kept], minlength=self.n_experts)

    def dropped_tokens(self):
        """Tokens whose every assignment was dropped (their output is 0)."""
        return np.flatnonzero(~self.kept.any(axis=1))


def route(logits, top_k, capacity_factor=None, gating="topk_softmax", select=top_k_experts):
    """Route N tokens from their router ``logits`` (N, E). ``select(probs, k)``
    picks the (N, k) experts (``top_k_experts``; node-limited routing passes its
    own). Returns a ``Routing``."""
    if gating not in GATINGS:
        raise ValueError(f"gating must be one of {GATINGS}, not {gating!r}")
    N, E = logits.shape
    probs = softmax(logits)
    expert = select(probs, top_k)
    if gating == "topk_softmax":
        gate = softmax(np.take_along_axis(logits, expert, axis=1))
    else:
        gate = np.take_along_axis(probs, expert, axis=1)
    capacity = expert_capacity(N, E, top_k, capacity_factor)
    return Routing(expert, gate, keep_within_capacity(expert, E, capacity), probs, capacity)


def load_balancing_loss(routing):
    """Switch's ``N * sum_i f_i * P_i`` and its gradient with respect to ``probs``.

    >>> E, T = 4, 8
    >>> uniform = Routing(np.arange(T)[:, None] % E, np.ones((T, 1)), np.ones((T, 1), bool),
    ...                   np.full((T, E), 1 / E), None)
    >>> float(load_balancing_loss(uniform)[0])   # balanced routing: 1
    1.0
    """
    T, k = routing.expert.shape
    E = routing.n_experts
    f = np.bincount(routing.expert.ravel(), minlength=E) / (T * k)   # before capacity
    P = routing.probs.mean(axis=0)
    loss = E * float(f @ P)
    return loss, np.broadcast_to(E * f / T, routing.probs.shape)     # d loss / d probs[n, i]


class MoE(Module):
    """Input and output (..., dim): ``router`` (Linear dim -> E, no bias) and
    ``experts``, E ``MLP(dim, hidden)`` (a ``Sequential`` used only as a
    container, for the names ``experts.3.fc.weight``; it never runs as a chain).

    After ``forward``: ``routing`` (a ``Routing``), ``aux_loss`` (a float, the
    coefficient included). ``backward(dy)`` returns dx and adds the gradients
    of the task loss and of ``aux_loss`` into the experts' and router's grads.
    """

    def __init__(self, dim, hidden, n_experts, top_k, rng, capacity_factor=None,
                 aux_loss_coef=0.01, gating="topk_softmax", select=top_k_experts,
                 approximate="tanh", dtype=np.float64):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be in 1..n_experts={n_experts}")
        if gating not in GATINGS:
            raise ValueError(f"gating must be one of {GATINGS}, not {gating!r}")
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.aux_loss_coef, self.gating, self.select = aux_loss_coef, gating, select
        self.router = Linear(dim, n_experts, rng, bias=False, dtype=dtype)
        self.experts = Sequential(*[MLP(dim, hidden, rng, approximate, dtype)
                                    for _ in range(n_experts)])

    def forward(self, x):
        self.shape = x.shape
        x2 = x.reshape(-1, x.shape[-1])                     # tokens: (N, dim)
        r = self.routing = route(self.router.forward(x2), self.top_k, self.capacity_factor,
                                 self.gating, self.select)
        self.aux_loss = self.aux_loss_coef * load_balancing_loss(r)[0]
        y = np.zeros_like(x2)
        self.outputs = {}                                  # expert -> (rows, gates, out)
        for i, expert in enumerate(self.experts.layers):   # ascending expert number
            rows, gates = r.rows(i)
            out = expert.forward(x2[rows])
            self.outputs[i] = (rows, gates, out)
            y[rows] += gates[:, None] * out
        return y.reshape(x.shape)

    def backward(self, dy):
        r = self.routing
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = np.zeros_like(dy2)
        dgate = np.zeros(r.expert.shape)                   # (N, k): d loss / d gate
        for i, expert in enumerate(self.experts.layers):
            rows, gates, out = self.outputs[i]
            which = np.argmax(r.expert[rows] == i, axis=1)  # the choice that sent it here
            dgate[rows, which] = (dy2[rows] * out).sum(axis=1)
            dx[rows] += expert.backward(gates[:, None] * dy2[rows])
        dx += self.router.backward(self.dlogits(dgate))
        return dx.reshape(self.shape)

    def dlogits(self, dgate):
        """The router logits' gradient from the gates' (N, k) and the aux loss."""
        return router_grad(self.routing, dgate, self.gating, self.aux_loss_coef)


def router_grad(routing, dgate, gating, aux_loss_coef):
    """d loss / d logits (N, E), from ``dgate`` (N, k), the gradient of each
    assignment's gate (0 for dropped ones), plus ``aux_loss_coef`` times the
    load-balancing loss's."""
    r = routing
    dprobs = aux_loss_coef * load_balancing_loss(r)[1]
    dlogits = np.zeros_like(r.probs)
    if gating == "topk_softmax":
        # Softmax over the chosen k: dz_j = g_j (dg_j - sum_l g_l dg_l), chosen j only.
        dz = r.gate * (dgate - (r.gate * dgate).sum(axis=1, keepdims=True))
        np.put_along_axis(dlogits, r.expert, dz, axis=1)
    else:
        dprobs = dprobs.copy()
        np.put_along_axis(dprobs, r.expert,
                          np.take_along_axis(dprobs, r.expert, axis=1) + dgate, axis=1)
    # Through the full softmax: dz = p * (dp - sum_j p_j dp_j).
    p = r.probs
    return dlogits + p * (dprobs - (p * dprobs).sum(axis=1, keepdims=True))
