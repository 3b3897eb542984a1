"""Expert parallelism against ringlab.nn.MoE in one process (each rank's tokens a
routing group): outputs, dx, router and expert gradients; the dispatch's messages
(counts first, then uneven token blocks), EP inside DP on a mesh against one
process, node-limited routing and the cross-node bytes it saves, and the load
imbalance read from the trace."""

import numpy as np
import pytest

import ringlab
from ringlab.frontier.expert_parallel import ExpertParallelMoE, cross_node_bytes, ep_dp_sgd_step, expert_load, experts_of, moe_dispatch_combine, node_dispatch_combine, node_limited_top_k
from ringlab.nn import MoE
from ringlab.nn.moe import top_k_experts

ATOL = 1e-12
DIM = 4


def data(*shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def make_moe(E=4, k=2, capacity_factor=1.0, dim=DIM, **kw):
    return MoE(dim, 6, E, k, np.random.default_rng(0), capacity_factor=capacity_factor,
               aux_loss_coef=0.05, **kw)


@pytest.mark.parametrize("e,E,k,cf", [(1, 4, 2, None), (2, 4, 2, 1.0), (4, 4, 1, 1.25),
                                      (2, 6, 3, 0.6), (4, 8, 2, None), (3, 6, 2, 0.8)])
def test_ep_layer_equals_moe_on_each_ranks_tokens(e, E, k, cf):
    moe = make_moe(E, k, cf)
    xs = [data(3, 4, DIM, seed=10 + r) for r in range(e)]       # 12 tokens per rank
    dys = [data(3, 4, DIM, seed=20 + r) for r in range(e)]

    def program(comm, r):
        layer = ExpertParallelMoE.from_moe(moe, comm)
        y = layer.forward(xs[r])
        dx = layer.backward(dys[r])
        return y, dx, {n: g.copy() for n, g in layer.named_grads().items()}, layer.aux_loss

    res = ringlab.run(program, list(range(e)))
    ref = make_moe(E, k, cf)
    dropped = 0
    for r in range(e):                        # one process: the same layer, rank by rank
        y, dx = ref.forward(xs[r]), ref.backward(dys[r])
        dropped += int((~ref.routing.kept).sum())
        np.testing.assert_allclose(res.outputs[r][0], y, rtol=0, atol=ATOL)
        np.testing.assert_allclose(res.outputs[r][1], dx, rtol=0, atol=ATOL)
        assert res.outputs[r][3] == pytest.approx(ref.aux_loss, rel=1e-12)
    grads = ref.named_grads()
    router = sum(out[2]["router.weight"] for out in res.outputs)   # each rank: its tokens
    np.testing.assert_allclose(router, grads["router.weight"], rtol=0, atol=ATOL)
    for r, out in enumerate(res.outputs):
        mine = {n for n in out[2] if n.startswith("experts.")}
        assert mine == {n for n in grads if n.split(".")[1] in
                        {str(i) for i in experts_of(r, E, e)}}
        for n in mine:
            np.testing.assert_allclose(out[2][n], grads[n], rtol=0, atol=ATOL, err_msg=n)
    assert dropped == 0 if cf is None else (dropped > 0 or cf > 1)   # small factors do drop


def expert_fn(scale):
    """A deterministic expert i: rows -> tanh(rows * (i + 1) * scale) + i."""
    return lambda i, rows: np.tanh(rows * (i + 1) * scale) + i


def one_process(tokens, gates, expert):
    y = np.zeros_like(tokens)
    for i in range(gates.shape[1]):
        rows = np.flatnonzero(gates[:, i])
        y[rows] += gates[rows, i][:, None] * expert(i, tokens[rows])
    return y


@pytest.mark.parametrize("e,E", [(2, 4), (3, 3), (4, 8)])
def test_moe_dispatch_combine_results_and_messages(e, E):
    n = 7
    tokens = [data(n, DIM, seed=r) for r in range(e)]
    gates = []
    for r in range(e):                           # top-2 gates with some tokens dropped
        g = np.zeros((n, E))
        rng = np.random.default_rng(100 + r)
        for t in range(n):
            if t % 3 != 2 or r == 0:             # rank >0: every third token dropped entirely
                g[t, rng.choice(E, 2, replace=False)] = rng.uniform(0.1, 1, 2)
        gates.append(g)
    calls = []

    def program(comm, r):
        def expert(i, rows):
            calls.append((comm.rank, i, len(rows)))
            return expert_fn(0.5)(i, rows)
        return moe_dispatch_combine(comm, tokens[r], gates[r], expert)

    res = ringlab.run(program, list(range(e)))
    for r in range(e):
        np.testing.assert_allclose(res.outputs[r], one_process(tokens[r], gates[r],
                                                                expert_fn(0.5)), rtol=0, atol=ATOL)
        dropped = ~gates[r].any(axis=1)
        assert not res.outputs[r][dropped].any()
    # Each rank called each of its experts once, ascending, with every token routed to it.
    want = [(r, i, sum(int((g[:, i] > 0).sum()) for g in gates))
            for r in range(e) for i in experts_of(r, E, e)]
    assert sorted(calls) == want
    # Messages: the counts AlltoAll (E/e int64 to every other rank), then the token
    # blocks (only non-empty ones), then the outputs back; counts strictly first.
    trace = res.trace
    for r in range(e):
        mine = sorted(trace.filter(src=r), key=lambda ev: ev.step)
        kinds = [ev.span.rsplit("/", 1)[-1] for ev in mine]
        first_token = kinds.index("alltoallv") if "alltoallv" in kinds else len(kinds)
        assert kinds[:first_token] == ["alltoall"] * (e - 1)
        assert all(ev.nbytes == 8 * E // e for ev in mine[:e - 1])
        for ev in mine[first_token:]:
            d = ev.dst
            rows = sum(int((gates[r][:, i] > 0).sum()) for i in experts_of(d, E, e)) \
                if ev.span.startswith("ep.dispatch") else \
                sum(int((gates[d][:, i] > 0).sum()) for i in experts_of(r, E, e))
            assert ev.nbytes == rows * DIM * 8 and rows > 0
    counts = [ev for ev in trace if ev.span.endswith("alltoall")]
    tokens_out = [ev for ev in trace if ev.span.endswith("alltoallv")]
    assert max(ev.step for ev in counts) < min(ev.step for ev in tokens_out)


def test_gates_must_match_tokens_and_split_over_ranks():
    def program(comm, _):
        return moe_dispatch_combine(comm, np.zeros((3, 2)), np.zeros((3, 3)), expert_fn(1))
    with pytest.raises(ringlab.RankError, match="3 experts do not split evenly over 2"):
        ringlab.run(program, [None, None])


# -- EP inside DP on a mesh ---------------------------------------------------------------

def test_ep_inside_dp_on_a_mesh_equals_one_process():
    dp, ep, E, lr, steps = 2, 2, 4, 0.1, 2
    moe = make_moe(E, 2, 1.0)
    world = dp * ep
    batches = [[data(6, DIM, seed=100 * s + r) for r in range(world)] for s in range(steps)]
    targets = [[data(6, DIM, seed=1000 + 100 * s + r) for r in range(world)] for s in range(steps)]
    n_total = 6 * world

    def program(comm, r):
        mesh = ringlab.DeviceMesh(comm, (dp, ep), ("dp", "ep"))
        layer = ExpertParallelMoE.from_moe(moe, mesh.group("ep"))
        for s in range(steps):
            y = layer.forward(batches[s][r])
            layer_dy = 2 * (y - targets[s][r]) / n_total        # mean squared error, all tokens
            ep_dp_sgd_step(comm, mesh, layer, batches[s][r], layer_dy, lr)
        return {n: p.copy() for n, p in layer.named_parameters().items()}

    res = ringlab.run(program, list(range(world)))
    ref = make_moe(E, 2, 1.0)
    for s in range(steps):                       # one process: every rank's group in turn
        ref.zero_grad()
        for r in range(world):
            y = ref.forward(batches[s][r])
            ref.backward(2 * (y - targets[s][r]) / n_total)
        for n, p in ref.named_parameters().items():
            p -= lr * ref.named_grads()[n]
    want = ref.named_parameters()
    start = make_moe(E, 2, 1.0).named_parameters()
    assert np.abs(want["router.weight"] - start["router.weight"]).max() > 1e-3
    for out in res.outputs:
        for n, p in out.items():
            np.testing.assert_allclose(p, want[n], rtol=0, atol=ATOL, err_msg=n)
    assert set(res.trace.groups) == {"ep[0]", "ep[1]", "dp[0]", "dp[1]"}


# -- node-limited routing -------------------------------------------------------------------

def test_node_limited_top_k_picks_nodes_by_their_best_k_over_m_scores():
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.ones(16), size=200)
    n_nodes, M, k = 4, 2, 4
    chosen = node_limited_top_k(n_nodes, M)(probs, k)
    nodes = chosen // (16 // n_nodes)
    assert all(len(set(row)) <= M for row in nodes.tolist())
    for p, row in zip(probs, chosen):             # brute force: the best M nodes by top-2 sums
        score = [np.sort(p[b * 4:(b + 1) * 4])[::-1][:k // M].sum() for b in range(n_nodes)]
        best = sorted(range(n_nodes), key=lambda b: (-score[b], b))[:M]
        allowed = np.concatenate([np.arange(b * 4, (b + 1) * 4) for b in best])
        want = allowed[np.argsort(-p[allowed], kind="stable")][:k]
        assert sorted(row.tolist()) == sorted(want.tolist())
    free = top_k_experts(probs, k) // 4
    assert max(len(set(row)) for row in free.tolist()) > M      # unrestricted goes wider


def test_node_dispatch_combine_equals_flat_and_node_limiting_saves_cross_node_bytes():
    n_nodes, g, E, k, M, n = 4, 2, 16, 4, 2, 24       # 8 ranks, 2 per node, 2 experts each
    dim = 32                                           # a token much wider than its gates
    world = n_nodes * g
    moe_free = make_moe(E, k, None, dim)
    moe_limited = make_moe(E, k, None, dim, select=node_limited_top_k(n_nodes, M))
    xs = [data(n, dim, seed=r) for r in range(world)]

    def gates_of(moe, x):
        moe.forward(x)
        return moe.routing.dense_gates()

    def flat(comm, r, moe):
        return moe_dispatch_combine(comm, xs[r], gates_of(moe, xs[r]), expert_fn(0.3))

    def two_hop(comm, r, moe):
        mesh = ringlab.DeviceMesh(comm, (n_nodes, g), ("node", "local"))
        return node_dispatch_combine(comm, mesh, xs[r], gates_of(moe, xs[r]), expert_fn(0.3))

    results = {}
    for name, moe in (("free", moe_free), ("limited", moe_limited)):
        for how, prog in (("flat", flat), ("two_hop", two_hop)):
            res = ringlab.run(prog, list(range(world)), args=(moe,))
            results[name, how] = res
            for r in range(world):
                want = one_process(xs[r], gates_of(moe, xs[r]), expert_fn(0.3))
                np.testing.assert_allclose(res.outputs[r], want, rtol=0, atol=ATOL)
    cross = {key: cross_node_bytes(res.trace, g) for key, res in results.items()}
    # Two hops: per (token, remote node) one row of d + E/n (tokens + gates) there and d back,
    # plus one count per pair of nodes each way; node-limiting caps a token at M nodes.
    for name, moe in (("free", moe_free), ("limited", moe_limited)):
        pairs = 0
        for r in range(world):
            nodes = gates_of(moe, xs[r]).reshape(n, n_nodes, E // n_nodes).any(axis=2)
            nodes[:, r // g] = False                             # my own node: no crossing
            pairs += int(nodes.sum())
        counts = world * (n_nodes - 1) * 8
        assert cross[name, "two_hop"] == pairs * (2 * dim + E // n_nodes) * 8 + counts
    assert cross["limited", "two_hop"] < 0.8 * cross["free", "two_hop"]
    assert cross["free", "two_hop"] < cross["free", "flat"]


# -- load imbalance -----------------------------------------------------------------------

def test_load_imbalance_from_the_trace():
    e, E = 4, 4
    moe = make_moe(E, 1, None)
    moe.router.params["weight"][:, 0] += 3.0           # most tokens prefer expert 0
    xs = [data(10, DIM, seed=r) for r in range(e)]
    spt = 1e-6

    def program(comm, r):
        layer = ExpertParallelMoE.from_moe(moe, comm, seconds_per_token=spt)
        return layer.forward(xs[r])

    res = ringlab.run(program, list(range(e)), network=ringlab.AlphaBeta(1e-6, 1e-9))
    load = expert_load(res.trace)
    want = np.zeros(E, dtype=int)
    for x in xs:
        moe.forward(x)
        want += moe.routing.tokens_per_expert()
    assert load["tokens"] == {i: int(want[i]) for i in range(E)}
    assert load["busy"] == pytest.approx([spt * want[i] for i in range(E)])
    assert load["wait"] == pytest.approx([spt * (want.max() - want[i]) for i in range(E)])
    assert load["imbalance"] == pytest.approx(want.max() / want.mean())
    assert want[0] == want.max() >= 2 * want.mean() and load["wait"][0] == 0
    # The busiest expert's rank finishes last: everyone else waits for its outputs.
    ends = [max(c.end for c in res.trace.computes if c.rank == r) for r in range(e)]
    assert max(ends) == ends[int(np.argmax(want))]


def test_runs_are_deterministic():
    moe = make_moe(8, 2, 0.8)
    xs = [data(9, DIM, seed=r) for r in range(4)]

    def program(comm, r):
        layer = ExpertParallelMoE.from_moe(moe, comm)
        return layer.backward(layer.forward(xs[r]))

    a, b = (ringlab.run(program, list(range(4))) for _ in range(2))
    assert a.trace == b.trace
    assert all(np.array_equal(x, y) for x, y in zip(a.outputs, b.outputs))
