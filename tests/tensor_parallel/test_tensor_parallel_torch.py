"""The tensor-parallel programs on real processes (backend="torch"): the same outputs,
bit for bit, and the same trace (every event's src, dst, nbytes, group, step, span)
as the simulator. Few and small: each torch run costs seconds."""

import importlib.util

import numpy as np
import pytest

import ringlab
from ringlab.nn import MLP, CausalSelfAttention, TransformerBlock
from ringlab.tensor_parallel import ParallelAttention, ParallelMLP, ParallelTransformerBlock, tp_dp_sgd_step

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="backend='torch' needs PyTorch: pip install 'ringlab[torch]'")


@pytest.fixture(scope="module", autouse=True)
def pool():
    yield
    from ringlab.backends.torch import pool
    pool.shutdown()


def arrays(out):
    """Every array in a nest of tuples, lists and dicts, in order."""
    if isinstance(out, np.ndarray):
        return [out]
    if isinstance(out, dict):
        return [a for k in out for a in arrays(out[k])]
    if isinstance(out, (list, tuple)):
        return [a for o in out for a in arrays(o)]
    return [np.asarray(out)]


def assert_same_run(program, inputs):
    sim = ringlab.run(program, inputs)
    real = ringlab.run(program, inputs, backend="torch")
    for a, b in zip(arrays(sim.outputs), arrays(real.outputs), strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)
    fields = [(e.src, e.dst, e.nbytes, e.group, e.step, e.span) for e in sim.trace]
    assert [(e.src, e.dst, e.nbytes, e.group, e.step, e.span) for e in real.trace] == fields
    assert real.trace == sim.trace, sim.trace.diff(real.trace)
    assert real.trace.spans == sim.trace.spans
    return sim


def fwd_bwd(layer, x, dy):
    y = layer.forward(x)
    return y, layer.backward(dy), {k: v.copy() for k, v in layer.named_grads().items()}


def tp_layers(comm, args):
    """MLP, attention, the block, and the sequence-parallel block, on one tp group."""
    mlp, attn, block, x, dy = args
    n = x.shape[1] // comm.world_size
    mine = slice(comm.rank * n, (comm.rank + 1) * n)
    sp = ParallelTransformerBlock.from_block(block, comm, sequence_parallel=True)
    out = [fwd_bwd(ParallelMLP.from_mlp(mlp, comm), x, dy),
           fwd_bwd(ParallelAttention.from_attention(attn, comm), x, dy),
           fwd_bwd(ParallelTransformerBlock.from_block(block, comm), x, dy),
           fwd_bwd(sp, x[:, mine], dy[:, mine])]
    sp.sync_sequence_parallel_grads()
    return out, sp.named_grads()


def test_tp_layers_and_block_on_torch():
    rng = np.random.default_rng(0)
    mlp, attn = MLP(8, 32, rng), CausalSelfAttention(8, 4, rng)
    block = TransformerBlock(8, 4, 32, rng, dropout=0.2, seed=3)
    x, dy = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    sim = assert_same_run(tp_layers, [(mlp, attn, block, x, dy)] * 2)
    assert len(sim.trace) > 0 and {e.group for e in sim.trace} == {None}


def test_tp_dp_step_on_torch():
    block = TransformerBlock(8, 4, 32, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((4, 4, 8)), rng.standard_normal((4, 4, 8))
    sim = assert_same_run(tp_dp_sgd_step, [(block, x, dy, (2, 2), 0.1, True)] * 4)
    assert sim.trace.groups == ["tp[0]", "tp[1]", "dp[0]", "dp[1]"]
