"""ringlab's synchronous SGD ends where torch's DistributedDataParallel does.

The same MLP (ringlab in float64, torch in float32, the same initial numbers),
the same 20 batches, SGD; DDP on 2 and 4 gloo processes of the torch backend
(torch_ddp.py says why those). The parameters agree to float32 rounding; a
cross-check that hangs ends at its timeout, named. And the
ringlab program itself runs unchanged on backend="torch", with the same
outputs and trace as in the simulator."""

import json
import subprocess
import sys

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


def _rank_0_never_joins(comm, _):
    import torch.distributed as dist
    if comm.rank:
        dist.barrier()                    # waits for rank 0, which is somewhere else
    else:
        while True:
            pass


def test_a_hung_cross_check_raises_timeout_error_naming_it():
    from ringlab.data_parallel.torch_ddp import run_gloo_workers
    with pytest.raises(TimeoutError, match="a hung check on 2 gloo processes did not "
                                           "finish within 3 s"):
        run_gloo_workers(_rank_0_never_joins, 2, (), what="a hung check", timeout=3)
    theirs = run_gloo_workers(lambda comm, _: comm.rank + 40, 2, (), what="", timeout=30)
    assert theirs == 40                   # the pool still runs the next check


def test_sync_sgd_runs_unchanged_on_torch():
    inputs = [BATCHES[:5]] * 3
    sim = ringlab.run(data_parallel_sgd, inputs, kwargs=KW)
    real = ringlab.run(data_parallel_sgd, inputs, kwargs=KW, backend="torch")
    assert real.trace == sim.trace
    for a, b in zip(sim.outputs, real.outputs):
        assert a[0] == b[0] and np.array_equal(a[1], b[1])


DDP_BUCKETS = r"""
import json, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
out = {}
for key, kw in (("default", {}), ("cap2", {"bucket_cap_mb": 2}),
                ("unused", {"find_unused_parameters": True})):
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers[:-1])
    ddp, name = DDP(model, **kw), {p: n for n, p in model.named_parameters()}
    def buckets():
        return [[name[p] for p in b.parameters()]
                for b in ddp.reducer._get_zeros_like_grad_buckets()]
    phases = [buckets()]                     # at construction
    for _ in range(2):                       # after iterations 1 and 2
        ddp(torch.randn(4, 512)).sum().backward()
        phases.append(buckets())
    out[key] = phases
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_ddp_buckets_are_one_bucket_then_rebuilt_in_ready_order():
    """torch's own DDP (gloo, one process) on the 12-layer MLP of the buckets
    chapter: with find_unused_parameters=False (the default) the first iteration
    runs with one bucket; the reducer then rebuilds the buckets once, in the order
    the gradients became ready, with caps of 1 MiB for the first and 25 MiB for
    the others: ``assign_buckets`` with torch's defaults. With
    find_unused_parameters=True the buckets are made at construction and kept,
    the 1 MiB cap going to the parameter registered first (its gradient comes
    last). Since torch 2.13 a ``bucket_cap_mb`` of your own caps the first
    bucket too."""
    from ringlab.data_parallel.buckets import BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES, assign_buckets
    from ringlab.nn import mlp_model
    run = subprocess.run([sys.executable, "-c", DDP_BUCKETS], capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    params = mlp_model([512] * 13, np.random.default_rng(0),
                       dtype=np.float32).named_parameters()
    every = sorted(params)
    default = got["default"]
    assert [sorted(b) for b in default[0]] == [every]        # one bucket ...
    assert [sorted(b) for b in default[1]] == [every]        # ... in iteration 1
    assert default[2] == assign_buckets(params, BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES)
    assert [len(b) for b in default[2]] == [2, 22]           # 1 MiB, then the rest
    unused = got["unused"]
    assert unused[0] == unused[1] == unused[2] and unused[0][-1] == ["0.weight"]
    assert [len(b) for b in unused[0]] == [23, 1]
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if version >= (2, 13):
        assert got["cap2"][2] == assign_buckets(params, 2 << 20, 2 << 20)
        assert len(got["cap2"][2]) == 6
