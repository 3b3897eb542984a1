"""ringlab.data_parallel.holdings: the who-holds-what pieces agree with the runs
and the library objects they are read from."""

import numpy as np
import pytest

import ringlab
from ringlab.data_parallel.holdings import replica_moment
from ringlab.data_parallel.sync_sgd import shard
from ringlab.nn import count_params, mlp_model
from ringlab.nn.data import TeacherRegression
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
