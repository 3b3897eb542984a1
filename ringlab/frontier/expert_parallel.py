"""Expert parallelism: E experts spread over e ranks; tokens travel to their experts and back.

Rank r holds experts ``r*E/e .. (r+1)*E/e - 1`` (``experts_of``) and its own
tokens. A mixture-of-experts layer (``ringlab.nn.MoE``) then communicates
twice each way:

1. **dispatch**: every rank first tells every other how many of its tokens go
   to each of that rank's experts (an AlltoAll of counts: the receiver needs
   them to size its buffers, since routing changes every step), then sends the
   tokens (``alltoallv``, an AlltoAll of uneven sizes from ``isend``/``irecv``;
   an empty block is not sent at all, which only the counts make safe);
2. the experts run on what arrived;
3. **combine**: the outputs go back the same way, and each rank adds them up
   weighted by its gates (in expert order): ``y_t = sum_i gate_ti * E_i(x_t)``.

Backward reverses it: the gated gradients travel to the experts (the counts
are known by now: no second exchange), the experts' input gradients come
back; the experts' weight gradients stay where the experts are, the router's
where the tokens are.

``moe_dispatch_combine(comm, tokens, gates, expert)`` is steps 1-3, the
reference answer of the exercise of that name; ``ExpertParallelMoE`` the
whole layer, forward and backward, equal to ``ringlab.nn.MoE`` on each
rank's tokens. ``ep_dp_sgd_step`` puts EP inside data parallelism on a
(dp, ep) ``DeviceMesh``. ``node_limited_top_k`` is DeepSeek-V3's node-limited
routing and ``node_dispatch_combine`` the two-hop dispatch that makes it pay:
each token crosses to each chosen node once. ``expert_load`` reads the load
imbalance off a trace.

    >>> import numpy as np, ringlab
    >>> def program(comm, x):
    ...     gates = np.zeros((4, 4))
    ...     gates[:, 3] = 1.0                      # every token to expert 3 (on rank 1)
    ...     return moe_dispatch_combine(comm, x, gates, lambda i, rows: 10 * rows + i)
    >>> res = ringlab.run(program, [np.zeros((4, 2)), np.ones((4, 2))])
    >>> res.outputs[0][0], res.outputs[1][0]       # 10 x + 3
    (array([3., 3.]), array([13., 13.]))
    >>> [(e.src, e.dst, e.span.rsplit("/", 1)[-1], e.nbytes) for e in res.trace]
    [(0, 1, 'alltoall', 16), (1, 0, 'alltoall', 16), (0, 1, 'alltoallv', 64), \
(1, 0, 'alltoallv', 64)]
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ..answers import answer
from ..collectives import alltoall, ring_allreduce
from ..comm import collective
from ..nn import Module
from ..nn.moe import load_balancing_loss, route, router_grad, top_k_experts
from .nodes import cross_node_bytes  # noqa: F401  (re-exported: EP's cross-node bytes)


# -- who holds which experts ------------------------------------------------------------

def experts_of(rank, n_experts, e):
    """The experts rank ``rank`` of ``e`` holds: an equal contiguous block."""
    if n_experts % e:
        raise ValueError(f"{e} expert-parallel ranks cannot split {n_experts} experts evenly")
    per = n_experts // e
    return range(rank * per, (rank + 1) * per)


# -- AlltoAll of uneven sizes -----------------------------------------------------------

@answer("moe_dispatch_combine")
@collective
def alltoallv(comm, blocks, recv_rows):
    """Send ``blocks[d]`` (rows x width) to rank d, receive ``recv_rows[s]`` rows
    from rank s (they told us: the counts exchange). Empty blocks travel not at
    all; a block of the wrong size is an error naming both ranks. Returns the
    received blocks in rank order (``out[rank]`` is my own block)."""
    n, rank = comm.world_size, comm.rank
    width = blocks[rank].shape[1:]
    recvs = {src: comm.irecv(src, shape=(int(recv_rows[src]), *width))
             for src in range(n) if src != rank and recv_rows[src]}
    sends = [comm.isend(blocks[dst], dst, chunk=(rank, dst), op="copy")
             for dst in ((rank + k) % n for k in range(1, n)) if len(blocks[dst])]
    for req in sends:
        req.wait()
    out = [np.zeros((0, *width), dtype=blocks[rank].dtype) for _ in range(n)]
    out[rank] = blocks[rank].copy()
    for src, req in recvs.items():
        out[src] = req.wait()
    return out


# -- dispatch and combine ---------------------------------------------------------------

@dataclass
class Plan:
    """Where this rank's tokens went: ``rows[i]``, the tokens (in order) sent to
    expert i; ``counts`` (e, E/e), how many to each expert of each rank;
    ``recv`` (e, E/e), how many each rank sent to each of my experts."""

    rows: list
    counts: np.ndarray
    recv: np.ndarray


def _check(comm, tokens, gates):
    e = comm.world_size
    if gates.ndim != 2 or len(gates) != len(tokens):
        raise ValueError(f"rank {comm.rank}: gates must be (tokens, experts) = ({len(tokens)}, E), "
                         f"got shape {gates.shape}")
    if gates.shape[1] % e:
        raise ValueError(f"rank {comm.rank}: {gates.shape[1]} experts do not split evenly over "
                         f"{e} expert-parallel ranks")


@answer("moe_dispatch_combine")
def dispatch(comm, tokens, gates):
    """Send each token to the ranks of its experts (nonzero ``gates``; a token
    goes once to each of its experts). Returns ``(plan, inputs)``: ``inputs[j]``,
    the rows for my j-th expert, from rank 0's tokens to rank e-1's, each rank's
    in token order."""
    _check(comm, tokens, gates)
    e, E = comm.world_size, gates.shape[1]
    per = E // e
    rows = [np.flatnonzero(gates[:, i]) for i in range(E)]
    counts = np.array([len(r) for r in rows]).reshape(e, per)
    with comm.span("ep.dispatch"):
        recv = np.stack(alltoall(comm, list(counts)))         # first the counts ...
        blocks = [np.concatenate([tokens[rows[i]] for i in experts_of(d, E, e)])
                  for d in range(e)]
        got = alltoallv(comm, blocks, recv.sum(axis=1))       # ... then the tokens
    # got[s] holds rank s's rows for my experts, expert by expert: regroup by expert.
    pieces = [np.split(got[s], np.cumsum(recv[s])[:-1]) for s in range(e)]
    inputs = [np.concatenate([pieces[s][j] for s in range(e)]) for j in range(per)]
    return Plan(rows, counts, recv), inputs


@answer("moe_dispatch_combine")
def send_back(comm, plan, outputs, span="ep.combine"):
    """The way back: ``outputs[j]`` (rows of my j-th expert, in ``dispatch``'s
    order) to the ranks they came from. Returns ``back[i]``: the rows for my
    tokens ``plan.rows[i]`` from expert i, for every expert i."""
    e = comm.world_size
    E = plan.counts.size
    with comm.span(span):
        pieces = [np.split(out, np.cumsum(plan.recv[:, j])[:-1]) for j, out in enumerate(outputs)]
        blocks = [np.concatenate([pieces[j][s] for j in range(len(outputs))]) for s in range(e)]
        got = alltoallv(comm, blocks, plan.counts.sum(axis=1))
    back = []
    for d in range(e):                       # rank d's block: its experts' rows, expert by expert
        back += np.split(got[d], np.cumsum(plan.counts[d])[:-1])
    assert len(back) == E
    return back


@answer("moe_dispatch_combine")
def combine(comm, plan, outputs, gates):
    """``send_back`` and the gated sum: ``y[t] = sum_i gates[t, i] * out_i[t]``, the
    experts in ascending order. Returns ``(y, back)``."""
    back = send_back(comm, plan, outputs)
    y = np.zeros((len(gates), outputs[0].shape[1] if outputs else 0))
    for i, rows in enumerate(plan.rows):
        if len(rows):
            y[rows] += gates[rows, i][:, None] * back[i]
    return y, back


@answer("moe_dispatch_combine")
def moe_dispatch_combine(comm, tokens, gates, expert):
    """Route this rank's tokens to their experts' ranks and bring the gated
    results back: the reference answer of the exercise ``moe_dispatch_combine``.

    * ``tokens``: (n, d) floats, this rank's tokens.
    * ``gates``: (n, E) floats, E a multiple of the world size: ``gates[t, i]``
      is token t's gate for expert i, **0 where t does not go to i** -- not
      among its top k, or dropped by capacity (``ringlab.nn.moe.Routing.
      dense_gates`` gives this form, capacity already applied). A token whose
      gates are all 0 is sent nowhere and gets 0.
    * ``expert(i, x)``: expert i (global number, one of this rank's
      ``experts_of``) applied to rows x (m, d), m >= 0; returns (m, d). Called
      once per expert of this rank, in ascending order, with the rows from rank
      0's tokens first and each rank's in token order.

    Returns (n, d): ``y[t] = sum_i gates[t, i] * expert_i(tokens[t])``, summed
    in ascending i. Messages: an AlltoAll of counts (each rank's E/e ints to
    every other), the tokens' ``alltoallv``, the outputs' ``alltoallv`` back.
    """
    plan, inputs = dispatch(comm, tokens, gates)
    mine = experts_of(comm.rank, gates.shape[1], comm.world_size)
    outputs = [np.asarray(expert(i, x)) for i, x in zip(mine, inputs)]
    return combine(comm, plan, outputs, gates)[0]


# -- the layer ------------------------------------------------------------------------------

class ExpertParallelMoE(Module):
    """This rank's part of a ``ringlab.nn.MoE``: the router (replicated) and its
    experts, named as in the unsharded layer (``experts.5.fc.weight``).

    ``forward(x)`` routes this rank's tokens (capacity per rank: each rank's
    tokens are one of GShard's groups), dispatches, runs its experts, combines;
    ``backward(dy)`` returns dx and adds the task and aux-loss gradients into
    the router's (this rank's tokens' share) and its experts' (everyone's
    tokens) grads. ``seconds_per_token``: each expert computes for
    ``seconds_per_token * rows`` simulated seconds (label "expert", meta
    ``expert``, ``tokens``); twice that backward.
    """

    def __init__(self, comm, router, experts, moe, seconds_per_token=0.0):
        super().__init__()
        self.comm, self.router, self.experts = comm, router, experts
        self.n_experts, self.top_k, self.capacity_factor = moe.n_experts, moe.top_k, \
            moe.capacity_factor
        self.aux_loss_coef, self.gating, self.select = moe.aux_loss_coef, moe.gating, moe.select
        self.seconds_per_token = seconds_per_token
        self.mine = experts_of(comm.rank, moe.n_experts, comm.world_size)

    @classmethod
    def from_moe(cls, moe, comm, seconds_per_token=0.0):
        holder = Module()                       # children named by their global number
        for i in experts_of(comm.rank, moe.n_experts, comm.world_size):
            setattr(holder, str(i), copy.deepcopy(moe.experts.layers[i]))
        return cls(comm, copy.deepcopy(moe.router), holder, moe, seconds_per_token)

    def _expert(self, i):
        return getattr(self.experts, str(i))

    def _compute(self, i, rows, factor, label):
        if self.seconds_per_token:
            self.comm.compute(factor * self.seconds_per_token * rows, label, expert=i, tokens=rows)

    def forward(self, x):
        self.shape = x.shape
        x2 = x.reshape(-1, x.shape[-1])
        r = self.routing = route(self.router.forward(x2), self.top_k, self.capacity_factor,
                                 self.gating, self.select)
        self.aux_loss = self.aux_loss_coef * load_balancing_loss(r)[0]
        self.gates = r.dense_gates()
        self.plan, inputs = dispatch(self.comm, x2, self.gates)
        outputs = []
        for i, rows in zip(self.mine, inputs):
            self._compute(i, len(rows), 1, "expert")
            outputs.append(self._expert(i).forward(rows))
        y, self.back = combine(self.comm, self.plan, outputs, self.gates)
        return y.reshape(x.shape)

    def backward(self, dy):
        comm, plan, r = self.comm, self.plan, self.routing
        dy2 = dy.reshape(-1, dy.shape[-1])
        dgate = np.zeros(r.expert.shape)                 # (N, k), 0 where dropped
        gated = []                                        # per expert: gate * dy of its rows
        for i, rows in enumerate(plan.rows):
            if len(rows):
                which = np.argmax(r.expert[rows] == i, axis=1)
                dgate[rows, which] = (dy2[rows] * self.back[i]).sum(axis=1)
            gated.append(self.gates[rows, i][:, None] * dy2[rows])
        e = comm.world_size
        with comm.span("ep.dispatch.backward"):          # the counts are known: tokens only
            blocks = [np.concatenate([gated[i] for i in experts_of(d, self.n_experts, e)])
                      for d in range(e)]
            got = alltoallv(comm, blocks, plan.recv.sum(axis=1))
        pieces = [np.split(got[s], np.cumsum(plan.recv[s])[:-1]) for s in range(e)]
        dinputs = []
        for j, i in enumerate(self.mine):
            d_out = np.concatenate([pieces[s][j] for s in range(e)])
            self._compute(i, len(d_out), 2, "expert.backward")
            dinputs.append(self._expert(i).backward(d_out))
        back = send_back(comm, plan, dinputs, span="ep.combine.backward")
        dx = np.zeros_like(dy2)
        for i, rows in enumerate(plan.rows):
            if len(rows):
                dx[rows] += back[i]
        dx += self.router.backward(router_grad(r, dgate, self.gating, self.aux_loss_coef))
        return dx.reshape(self.shape)


def ep_dp_sgd_step(comm, mesh, layer, x, dy, lr):
    """One SGD step of an ``ExpertParallelMoE`` built on ``mesh.group("ep")``,
    inside data parallelism on a ``(dp, ep)`` mesh: forward and backward in the
    ep group on this rank's tokens ``x`` (``dy``: the gradient of the loss,
    summed over every rank's tokens), then the router's gradient summed over
    every rank (AllReduce in ep, then in dp: all hold the router) and each
    expert's over the dp group (the replicas of my experts). Spans
    ``ep.grad_sync``, ``dp.grad_sync``."""
    ep, dp = mesh.group("ep"), mesh.group("dp")
    layer.zero_grad()
    layer.forward(x)
    layer.backward(dy)
    router = layer.router.grads["weight"]
    with ep.span("ep.grad_sync"):                        # the router saw my ep group's tokens
        ring_allreduce(ep, router.reshape(-1), out=router.reshape(-1))
    with dp.span("dp.grad_sync"):                        # every gradient, over the replicas
        for g in layer.named_grads().values():
            ring_allreduce(dp, g.reshape(-1), out=g.reshape(-1))
    for name, p in layer.named_parameters().items():
        p -= lr * layer.named_grads()[name]


# -- node-limited routing (DeepSeek-V3) --------------------------------------------------

def node_limited_top_k(n_nodes, max_nodes):
    """DeepSeek-V3's node-limited routing (technical report, section 2.1.2,
    "Node-Limited Routing"): "each token will be sent to at most M nodes,
    which are selected according to the sum of the highest K_r/M affinity
    scores of the experts distributed on each node". Returns a ``select(probs,
    k)`` for ``ringlab.nn.MoE``: the E experts sit on ``n_nodes`` nodes, E/n
    consecutive ones each; per token, score each node by the sum of its k/M
    largest probabilities, keep the M best nodes (ties: the lower node), and
    take the top k experts among theirs.

    >>> p = np.array([[.30, .00, .20, .20, .10, .10, .05, .05]])   # 4 nodes of 2
    >>> top_k_experts(p, 2).tolist(), node_limited_top_k(4, 1)(p, 2).tolist()
    ([[0, 2]], [[2, 3]])
    """
    def select(probs, k):
        if k % max_nodes:
            raise ValueError(f"node-limited routing takes the k/M best experts per node: "
                             f"M = {max_nodes} must divide k = {k}")
        N, E = probs.shape
        if E % n_nodes:
            raise ValueError(f"{E} experts do not split evenly over {n_nodes} nodes")
        per_node = np.sort(probs.reshape(N, n_nodes, E // n_nodes), axis=-1)[..., ::-1]
        score = per_node[..., :k // max_nodes].sum(axis=-1)            # (N, nodes)
        nodes = np.argsort(-score, axis=-1, kind="stable")[:, :max_nodes]
        allowed = np.zeros((N, n_nodes), dtype=bool)
        np.put_along_axis(allowed, nodes, True, axis=1)
        masked = np.where(np.repeat(allowed, E // n_nodes, axis=1), probs, -np.inf)
        return top_k_experts(masked, k)
    return select


def node_dispatch_combine(comm, mesh, tokens, gates, expert):
    """``moe_dispatch_combine`` in two hops on a ``(node, local)`` mesh, as
    DeepSeek-V3 dispatches (section 3.2.2: tokens "are first transmitted via IB
    to the GPUs with the same in-node index on their target nodes" and then
    "forwarded via NVLink"): each token crosses to each node that holds any of
    its experts **once**, to the rank with my local index there (group
    ``node[...]``), with its gates for that node's experts; inside the node,
    ``moe_dispatch_combine`` over ``local[...]`` takes it to the experts and
    sums their gated outputs; the one sum per (token, node) crosses back.
    Cross-node bytes then grow with the nodes a token reaches, which node-limited
    routing caps at M, not with its k experts. Same arguments and result as
    ``moe_dispatch_combine`` (summed node by node)."""
    node, local = mesh.group("node"), mesh.group("local")
    n_nodes, E = mesh.size("node"), gates.shape[1]
    if E % comm.world_size:
        raise ValueError(f"rank {comm.rank}: {E} experts do not split evenly over "
                         f"{comm.world_size} ranks")
    per_node = E // n_nodes
    me = mesh.coord("node")
    d = tokens.shape[1]
    cols = [slice(b * per_node, (b + 1) * per_node) for b in range(n_nodes)]
    rows = [np.flatnonzero(gates[:, cols[b]].any(axis=1)) for b in range(n_nodes)]
    with comm.span("ep.node_dispatch"):
        recv = np.concatenate(alltoall(node, [np.array([len(r)]) for r in rows]))
        got = alltoallv(node, [np.concatenate([tokens[r], gates[r, cols[b]]], axis=1)
                               for b, r in enumerate(rows)], recv)
    arrived = np.concatenate(got)                                   # from node 0, 1, ...
    sums = moe_dispatch_combine(local, arrived[:, :d], arrived[:, d:],
                                lambda j, x: expert(me * per_node + j, x))
    with comm.span("ep.node_combine"):
        back = alltoallv(node, np.split(sums, np.cumsum(recv)[:-1]), [len(r) for r in rows])
    y = np.zeros_like(tokens, dtype=np.result_type(tokens, gates))
    for b in range(n_nodes):
        if len(rows[b]):
            y[rows[b]] += back[b]
    return y


# -- load imbalance -----------------------------------------------------------------------

def expert_load(trace, label="expert"):
    """What a run's ``comm.compute(..., label, expert=i, tokens=m)`` events say:
    ``tokens`` {expert: tokens}, ``busy`` [seconds per rank], ``wait`` [seconds
    each rank idles until the slowest finishes: max(busy) - busy], and
    ``imbalance``, max(busy) / mean(busy) (1: balanced)."""
    tokens, busy = {}, [0.0] * trace.world_size
    for c in trace.computes:
        if c.label == label:
            tokens[c.get("expert")] = tokens.get(c.get("expert"), 0) + c.get("tokens")
            busy[c.rank] += c.duration
    slowest = max(busy)
    mean = sum(busy) / len(busy)
    return {"tokens": dict(sorted(tokens.items())), "busy": busy,
            "wait": [slowest - b for b in busy],
            "imbalance": slowest / mean if mean else 1.0}
