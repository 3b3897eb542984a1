"""ringlab.data_parallel: sync SGD equals one process; DDP buckets follow torch's rule;
the three gradient syncs agree; the overlap formula is the simulator's time."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ringlab
from ringlab.data_parallel.buckets import BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES, assign_buckets, ddp_sync, sync_flat, sync_per_parameter, training_step
from ringlab.data_parallel.sync_sgd import data_parallel_sgd, single_process_sgd
from ringlab.nn import mlp_model

DATA = ringlab.nn.data.TeacherRegression(n_samples=128, dim=4, out=2, seed=3)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("batch", [8, 13])
def test_sync_sgd_equals_one_process(world_size, batch):
    batches = [b for _, b in zip(range(6), DATA.batches(batch, seed=1))]
    kw = dict(sizes=[4, 8, 2], seed=0, lr=0.1)
    res = ringlab.run(data_parallel_sgd, [batches] * world_size, kwargs=kw)
    ref = single_process_sgd(batches, **kw)[1]
    assert all(np.array_equal(o[1], res.outputs[0][1]) for o in res.outputs)
    assert np.abs(res.outputs[0][1] - ref).max() <= 1e-12
    assert res.trace.steps == 6 * 2 * (world_size - 1)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=12),
       caps=st.tuples(st.integers(4, 400), st.integers(4, 400)))
def test_assign_buckets_follows_torch(sizes, caps):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    first, cap = caps
    # torch walks the tensors in the order given; DDP gives them in the order
    # gradients arrive, i.e. reversed registration order for a feed-forward model.
    want, _ = dist._compute_bucket_assignment_by_size(
        [torch.zeros(n) for n in reversed(sizes)], [first, cap], [False] * len(sizes))
    named = {i: np.zeros(n, np.float32) for i, n in enumerate(sizes)}
    got = assign_buckets(named, cap_bytes=cap, first_bucket_bytes=first)
    assert got == [[len(sizes) - 1 - i for i in b] for b in want]


def test_defaults_are_torchs():
    torch = pytest.importorskip("torch")
    from torch.nn.parallel import distributed
    assert distributed._DEFAULT_BUCKET_CAP_MB * distributed._MB_TO_BYTES == BUCKET_CAP_BYTES
    assert torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == FIRST_BUCKET_BYTES


def test_three_syncs_agree_and_ddp_overlaps():
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((32, 16)), rng.standard_normal((32, 16))) for _ in range(4)]
    kw = dict(model_fn=lambda: mlp_model([16] * 6, np.random.default_rng(0)),
              flops_per_second=1e9)
    net = ringlab.AlphaBeta(alpha=1e-6, beta=1e-9)
    runs = [ringlab.run(training_step, data, network=net, kwargs=dict(kw, sync=s, **extra))
            for s, extra in ((sync_per_parameter, {}), (sync_flat, {}),
                             (ddp_sync, dict(cap_bytes=2048, first_bucket_bytes=2048)))]
    for r in runs[:2]:
        assert np.allclose(r.outputs[0], runs[2].outputs[0], rtol=1e-12, atol=1e-15)
    per, flat, ddp = (r.time for r in runs)
    assert ddp < flat < per
    assert all(e.stream == 1 for e in runs[2].trace)


def test_sync_sgd_panel_and_figure():
    pytest.importorskip("ipywidgets")
    import matplotlib
    matplotlib.use("Agg")
    from ringlab.data_parallel.panel import curves, figure, sync_sgd_panel
    c = curves(3, 10, 0.1, steps=5)
    assert c["diff"] <= 1e-12 and np.allclose(c["dp"], c["single"], rtol=1e-12)
    assert figure(2, 8, 0.05)["bytes_per_step"] > 0
    assert sync_sgd_panel().children        # sliders and the output
