"""A program run on the simulator and on the torch backend, compared: the same
outputs (dtype, shape and values), trace, spans and unreceived messages.
Shared by tests/backends/test_torch_backend.py and test_torch_groups.py."""

import numpy as np

import ringlab


def same(a, b):
    """``a`` and ``b`` equal, arrays in dtype and shape too, lists and tuples item by item."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def assert_same_run(program, inputs, **kw):
    """Run ``program`` on both backends (``kw`` goes to ``ringlab.run``); both runs."""
    sim = ringlab.run(program, inputs, **kw)
    real = ringlab.run(program, inputs, backend="torch", **kw)
    assert all(same(a, b) for a, b in zip(sim.outputs, real.outputs)), (sim.outputs, real.outputs)
    assert real.trace == sim.trace, sim.trace.diff(real.trace)
    assert real.trace.spans == sim.trace.spans
    assert real.trace.unreceived == sim.trace.unreceived
    return sim, real
