"""The task of the parameter-server chapter: a model, its data, each worker's speed.

Every rank gets the task as *plain data*, a tuple (``task.spec``), because
trusted grading runs each rank in a process of its own and passes only plain
values (numbers, tuples, arrays) between processes. ``PSTask.from_spec(spec)``
rebuilds the object on the rank:

    >>> task = PSTask.make(workers=3, updates=12, seed=0)
    >>> same = PSTask.from_spec(task.spec)
    >>> same.updates, same.workers, same.init.shape
    (12, 3, (212,))

``task.work(comm, params, k)`` is a worker's k-th gradient: it spends the
gradient's simulated compute time (``comm.compute``) and returns it.

This module holds no part of the exercise's answer (that is
``ringlab.data_parallel.async_ps``), so a learner's program may use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..nn import FlatBuffer, cross_entropy, mlp_model
from ..nn.data import Blobs

STOP = np.empty(0)   # the server's "no more work": an empty array instead of parameters


@dataclass
class PSTask:
    """The model's initial flat parameters (``init``), how many gradients the
    server applies in all (``updates``), the learning rate, and the hidden
    speed of each worker: ``mean_times[w - 1]`` seconds per gradient for rank
    w, times a per-gradient log-normal jitter drawn from ``seed``."""

    init: np.ndarray
    updates: int
    lr: float
    mean_times: tuple
    jitter: float = 0.25
    seed: int = 0
    sizes: tuple = (8, 16, 4)
    batch: int = 16
    data: Blobs = field(default=None, repr=False)

    def __post_init__(self):
        if self.data is None:
            self.data = Blobs(n_samples=512, dim=self.sizes[0], n_classes=self.sizes[-1],
                              spread=2.0, seed=self.seed)
        self._build()

    def _build(self):
        # One model whose parameters and gradients are views into flat buffers:
        # copying a flat vector in sets every layer's weights at once.
        self._model = mlp_model(list(self.sizes), np.random.default_rng(self.seed))
        self._p = FlatBuffer(self._model.named_parameters())
        self._g = FlatBuffer(self._model.named_grads())
        self._model.rebind(params=self._p.views, grads=self._g.views)

    # A copy rebuilds the model: copied views would no longer share memory with
    # the copied flat buffers.
    def __getstate__(self):
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def __setstate__(self, state):
        vars(self).update(state)
        self._build()

    @classmethod
    def make(cls, workers=4, updates=40, seed=0, straggler=2.0, lr=0.1, mean=0.1,
             jitter=0.25, sizes=(8, 16, 4)):
        """A task with ``workers`` workers of mean time ``mean`` seconds per
        gradient; the last one is a straggler, ``straggler`` times slower."""
        model = mlp_model(list(sizes), np.random.default_rng(seed))
        init = FlatBuffer(model.named_parameters()).data.copy()
        times = tuple([float(mean)] * (workers - 1) + [float(mean * straggler)])
        return cls(init, int(updates), float(lr), times, float(jitter), int(seed),
                   tuple(int(n) for n in sizes))

    @property
    def spec(self):
        """The task as plain data, what every rank is given."""
        return (self.init, self.updates, self.lr, tuple(self.mean_times), self.jitter,
                self.seed, tuple(self.sizes), self.batch)

    @classmethod
    def from_spec(cls, spec):
        """The task back from ``spec``; a ``PSTask`` is returned as it is."""
        if isinstance(spec, cls):
            return spec
        init, updates, lr, times, jitter, seed, sizes, batch = spec
        return cls(np.array(init, dtype=np.float64), int(updates), float(lr),
                   tuple(float(t) for t in times), float(jitter), int(seed),
                   tuple(int(n) for n in sizes), int(batch))

    @property
    def workers(self):
        return len(self.mean_times)

    def compute_time(self, worker, k):
        """Seconds rank ``worker`` takes for its k-th gradient: fixed by the seed,
        whatever order the simulation asks in (a log-normal jitter, median 1)."""
        rng = np.random.default_rng((self.seed, 1, worker, k))
        return self.mean_times[worker - 1] * float(np.exp(self.jitter * rng.standard_normal()))

    def gradient(self, params, worker, k):
        """The gradient of the loss at ``params`` on worker's k-th mini-batch."""
        rng = np.random.default_rng((self.seed, 2, worker, k))
        idx = rng.choice(len(self.data.x), self.batch, replace=False)
        self._p.data[:] = params
        self._model.zero_grad()
        _, dlogits = cross_entropy(self._model.forward(self.data.x[idx]), self.data.y[idx])
        self._model.backward(dlogits)
        return self._g.data.copy()

    def work(self, comm, params, k):
        """A worker's k-th gradient: spends its simulated compute time, returns it."""
        comm.compute(self.compute_time(comm.rank, k), "gradient", k=k)
        return self.gradient(params, comm.rank, k)

    def loss(self, params):
        """The loss on the whole data set (to draw convergence; no simulated time)."""
        self._p.data[:] = params
        return cross_entropy(self._model.forward(self.data.x), self.data.y)[0]
