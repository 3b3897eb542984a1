"""A GPT on a dp x pp x cp x tp mesh (ringlab.frontier.nd_mesh) against one process
(every parameter after Adam steps, 1e-10), each dimension's messages in its own
groups, and each group's bytes against the closed forms of Parts 3, 4 and 7."""

import numpy as np
import pytest

import ringlab
from ringlab.frontier.context_parallel import cp_bytes_per_rank
from ringlab.frontier.nd_mesh import bytes_by_dimension, nd_gpt_adam, single_process_gpt_adam
from ringlab.tensor_parallel import tp_bytes_per_layer

CFG = dict(vocab=11, dim=8, n_heads=2, hidden=16, n_layers=2, seq_len=8)
B, S = 4, 8
BATCHES = [np.random.default_rng(s).integers(CFG["vocab"], size=(B, S + 1)) for s in range(2)]
KW = dict(config=CFG, seed=0, lr=1e-2)


def run(shape):
    n = int(np.prod(shape))
    return ringlab.run(nd_gpt_adam, [BATCHES] * n, kwargs=dict(KW, shape=shape))


SHAPES = [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2), (1, 1, 4, 1),
          (2, 2, 2, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "dp%d-pp%d-cp%d-tp%d" % s)
def test_nd_training_equals_one_process(shape):
    res = run(shape)
    ref_losses, ref = single_process_gpt_adam(BATCHES, **KW)
    start = single_process_gpt_adam([], **KW)[1]
    covered = {name: np.zeros(p.shape, dtype=bool) for name, p in ref.items()}
    for losses, params in res.outputs:
        for name, (p, index) in params.items():
            np.testing.assert_allclose(p, ref[name][index], rtol=0, atol=1e-10, err_msg=name)
            covered[name][index] = True
    assert all(c.all() for c in covered.values())           # every number is somewhere
    assert max(np.abs(ref[k] - start[k]).max() for k in ref) > 1e-3
    # The last stage's losses, weighted by their tokens, are the whole batch's loss.
    dp, pp, cp, tp = shape
    last = [out[0] for r, out in enumerate(res.outputs) if (r // (cp * tp)) % pp == pp - 1]
    for step, want in enumerate(ref_losses):
        got = np.mean([losses[step] for losses in last])   # equal shares of tokens
        assert got == pytest.approx(want, rel=1e-12)


def test_each_dimension_talks_in_its_own_groups_with_the_predicted_bytes():
    shape = dp, pp, cp, tp = (2, 2, 2, 2)
    res = run(shape)
    trace = res.trace
    table = bytes_by_dimension(trace)
    assert set(table) == {"dp", "pp", "cp", "tp"}
    for e in trace:
        axis = str(e.group).split("[")[0]
        if axis == "tp":
            assert "tp.block" in e.span                  # f and g of the blocks
        elif axis == "cp":
            assert "ring_attention" in e.span or "cp.grad_sync" in e.span
        elif axis == "pp":
            assert e.span.startswith("pp.") and e.op in ("activation", "gradient")
        else:
            assert e.span.startswith("dp.grad_sync")
    # Closed forms, per rank per step: b = B/dp rows, n = S/cp tokens, h = dim.
    b, n, h, steps = B // dp, S // cp, CFG["dim"], len(BATCHES)
    layers = CFG["n_layers"] // pp
    per_rank = {axis: [0] * res.world_size for axis in table}
    for e in trace:
        per_rank[str(e.group).split("[")[0]][e.src] += e.nbytes
    # tp: 4 AllReduces of b*n*h per layer (Part 3's tp_bytes_per_layer).
    assert per_rank["tp"] == [steps * layers * tp_bytes_per_layer(b, n, h, tp, 8)] * 16
    # cp: ring attention on my heads (h/tp wide K/V), forward and backward, + the grad sync.
    ring = sum(cp_bytes_per_rank("ring", cp, h // tp, S, b, backward=bw) for bw in (0, 1))
    attn = trace.filter(span="ring_attention.forward").bytes_sent()
    attn = [a + x for a, x in zip(attn, trace.filter(span="ring_attention.backward").bytes_sent())]
    assert attn == [steps * layers * ring] * 16
    # pp: one activation forward, one gradient back, (b, n, h) floats, per stage boundary.
    pp_sent = per_rank["pp"]
    assert sorted(set(pp_sent)) == [steps * b * n * h * 8]
    # dp and the cp grad sync: a ring AllReduce (2(k-1)/k) of my flat gradients each.
    numel = sum(p.size for p, _ in res.outputs[0][1].values())
    sync = trace.filter(span="cp.grad_sync").bytes_sent()
    assert sync[0] == steps * 2 * (cp - 1) * numel * 8 // cp
    assert per_rank["dp"][0] == steps * 2 * (dp - 1) * numel * 8 // dp


def test_tp_is_innermost_consecutive_ranks():
    res = run((2, 1, 2, 2))
    groups = res.trace.group_ranks
    assert groups["tp[0]"] == (0, 1) and groups["cp[0]"] == (0, 2) and groups["dp[0]"] == (0, 4)


def test_runs_are_deterministic():
    a, b = run((1, 2, 2, 1)), run((1, 2, 2, 1))
    assert a.trace == b.trace
    assert all(np.array_equal(x[1][k][0], y[1][k][0]) for x, y in zip(a.outputs, b.outputs)
               for k in x[1])
