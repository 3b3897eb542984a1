"""ringlab's synchronous SGD ends where torch's DistributedDataParallel does.

The same MLP (ringlab in float64, torch in float32, the same initial numbers),
the same 20 batches, SGD; DDP on 2 and 4 gloo processes started with
torch.multiprocessing ("spawn": torch_ddp.py says why not "fork"). The
parameters agree to float32 rounding. And the
ringlab program itself runs unchanged on backend="torch", with the same
outputs and trace as in the simulator."""

import numpy as np
import pytest

import ringlab
from ringlab.data_parallel.sync_sgd import data_parallel_sgd, single_process_sgd

torch = pytest.importorskip("torch")

KW = dict(sizes=[4, 16, 2], seed=0, lr=0.1)
DATA = ringlab.nn.data.TeacherRegression(n_samples=256, dim=4, out=2, seed=1)
BATCHES = [b for _, b in zip(range(20), DATA.batches(8, seed=2))]


def test_torch_twin_starts_equal():
    from ringlab.data_parallel.torch_ddp import flat_params, torch_twin
    start = single_process_sgd([], **KW)[1]
    assert np.allclose(flat_params(torch_twin(KW["sizes"], KW["seed"])), start, rtol=0, atol=1e-7)


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_on_gloo_matches_ringlab_sync_sgd(world_size):
    from ringlab.data_parallel.torch_ddp import train_ddp
    ours = ringlab.run(data_parallel_sgd, [BATCHES] * world_size, kwargs=KW).outputs[0][1]
    theirs = train_ddp(world_size, BATCHES, **KW)
    start = single_process_sgd([], **KW)[1]
    assert np.abs(ours - start).max() > 0.05                 # training moved the parameters
    assert np.allclose(theirs, ours, rtol=1e-4, atol=1e-5)   # float32 rounding, 20 steps


def test_sync_sgd_runs_unchanged_on_torch():
    inputs = [BATCHES[:5]] * 3
    sim = ringlab.run(data_parallel_sgd, inputs, kwargs=KW)
    real = ringlab.run(data_parallel_sgd, inputs, kwargs=KW, backend="torch")
    assert real.trace == sim.trace
    for a, b in zip(sim.outputs, real.outputs):
        assert a[0] == b[0] and np.array_equal(a[1], b[1])
