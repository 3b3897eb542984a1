"""ringlab.data_parallel.ownership: the who-holds-what pieces agree with the runs
and the library objects they are read from."""

import math

import numpy as np
import pytest

import ringlab
from ringlab.data_parallel.async_ps import PSTask, run_async_ps
from ringlab.data_parallel.buckets import assign_buckets
from ringlab.data_parallel.ownership import (activation_bytes, bucket_holdings,
                                            one_rank_holdings, ps_holdings, replica_moment)
from ringlab.data_parallel.sync_sgd import shard
from ringlab.nn import GPT, Adam, count_params, mlp_model, param_bytes
from ringlab.nn.data import ArithmeticTokens, TeacherRegression
from ringlab.show.ownership import held_fraction


@pytest.mark.parametrize("p, b", [(4, 10), (3, 13), (1, 5)])
def test_a_replica_holds_the_model_its_rows_and_its_own_gradient(p, b):
    batch = next(iter(TeacherRegression(n_samples=64, dim=8, out=2).batches(b, seed=1)))
    res = ringlab.run(replica_moment, [batch] * p, kwargs=dict(sizes=[8, 32, 2]))
    h = dict(enumerate(res.outputs))
    n = count_params(mlp_model([8, 32, 2], np.random.default_rng(0)))
    rows = [p_ for r in h for p_ in h[r] if p_.kind == "data"]
    assert sorted((q.start, q.stop) for q in rows) == [
        (s[0] / b, (s[-1] + 1) / b) for s in (shard(np.arange(b), r, p) for r in range(p))]
    for r in h:
        assert held_fraction(h, r, "parameters") == held_fraction(h, r, "gradient") == 1
        assert h[r][0].text == f"W, {n:,} numbers"
        assert h[r][2].text.endswith(f"mean of {len(shard(np.arange(b), r, p))}")
    assert {s.name for s in res.trace.spans} <= {"ring_allreduce"}   # a real step ran
    assert res.trace.steps == 2 * (p - 1)


def test_buckets_cut_the_gradient_where_assign_buckets_does():
    params = mlp_model([64] * 5, np.random.default_rng(0),
                       dtype=np.float32).named_parameters()
    batches = [(np.ones((n, 64)), None) for n in (3, 5)]
    h = bucket_holdings(params, batches, cap_bytes=20_000)
    buckets = assign_buckets(params, cap_bytes=20_000)
    total = sum(a.nbytes for a in params.values())
    grads = [q for q in h[0] if q.kind == "gradients"]
    assert [q.text for q in grads] == [str(b) for b in range(len(buckets))]
    assert [round((q.stop - q.start) * total) for q in grads] == [
        sum(params[n].nbytes for n in names) for names in buckets]
    assert grads[0].stop == 1 and min(q.start for q in grads) == 0   # last layers first
    assert h[0][:-1] == h[1][:-1]                                    # every rank alike
    assert [(h[r][-1].start, h[r][-1].stop) for r in (0, 1)] == [(0, 3 / 8), (3 / 8, 1)]


def test_one_rank_holds_what_its_arrays_take():
    cfg = dict(vocab=16, dim=32, n_heads=4, hidden=128, n_layers=2, seq_len=16)
    gpt = GPT(**cfg, rng=np.random.default_rng(0))
    ids = next(ArithmeticTokens(vocab=16, seq_len=16).batches(16, seed=0))[0]
    h = one_rank_holdings(gpt, Adam(gpt.named_parameters()), ids)
    assert param_bytes(gpt) == 216_064 and activation_bytes(gpt) == 2_764_928
    assert [(q.tensor, q.text) for q in h[0]] == [
        ("parameters", "216 kB"), ("gradients", "216 kB"), ("Adam m, v", "432 kB"),
        ("activations", "2.76 MB")]
    gpt.forward(ids[:8])
    assert activation_bytes(gpt) == (2_764_928 + 128) // 2      # linear in the batch


def test_a_worker_holds_the_version_its_next_gradient_reads():
    task = PSTask.make(workers=4, updates=16, seed=0, lr=0.02)
    run = run_async_ps(task, math.inf)
    for version in range(len(run.log)):
        h = ps_holdings(run.log, version, 4)
        assert h[0][0].text == f"version {version}" and sorted(h) == [0, 1, 2, 3, 4]
        for w in range(1, 5):
            later = [i for i, (who, _) in enumerate(run.log) if who == w and i >= version]
            if not later:
                assert h[w] == []
                continue
            i = later[0]
            assert h[w][0].text == f"version {run.log[i][1]}" and run.log[i][1] <= version
            assert h[w][1].text == f"update {i}, τ = {run.staleness[i]}"
