"""The alpha-beta (Hockney) model: a message of n bytes costs ``alpha + n * beta`` seconds.

``alpha`` is the latency paid once per message, ``beta`` the seconds per byte
(1 / bandwidth). One ``AlphaBeta`` serves two purposes:

* as the ``network=`` of a run, it prices every message as it happens.
  Each rank has a **send port** and a **receive port** that each carry one
  message at a time (the one-port model); a message starts when the sender
  posts it and both ports are free, and ports serve messages first come,
  first served::

      >>> import numpy as np, ringlab
      >>> from ringlab.collectives import ring_allreduce
      >>> net = AlphaBeta(alpha=1e-5, beta=1e-9)
      >>> res = ringlab.run(ring_allreduce, [np.ones(4000)] * 4, network=net)
      >>> round(res.time * 1e6, 3)            # 6 steps of (alpha + 8000 bytes * beta), in us
      108.0

* as a time model for a trace recorded without one (``times(trace)``,
  ``lockstep_time(trace)``), it prices the trace's steps one after another.
"""

from __future__ import annotations


class AlphaBeta:
    """``alpha`` seconds per message plus ``beta`` seconds per byte, on every link."""

    def __init__(self, alpha, beta):
        if not (alpha >= 0 and beta >= 0):
            raise ValueError(f"AlphaBeta(alpha={alpha!r}, beta={beta!r}): both must be >= 0")
        self.alpha, self.beta = float(alpha), float(beta)

    def message(self, nbytes):
        """Seconds one message of ``nbytes`` takes on an idle link."""
        return self.alpha + self.beta * nbytes

    # -- as a network model ------------------------------------------------------------
    def ports(self, world_size):
        """The per-run state: when each rank's ports are next free."""
        return Ports(self, world_size)

    # -- as a time model of an untimed trace ---------------------------------------------------
    def lockstep_time(self, trace):
        """Every step that has messages costs ``alpha + beta * b``, with ``b`` the
        largest message of that step; steps run one after another. For a ring
        AllReduce of ``n`` bytes (divisible by N): ``2(N-1) alpha + 2(N-1)/N n beta``."""
        return sum(self.message(b) for b in step_bytes(trace).values())

    def times(self, trace):
        """``(start, duration)`` of every event, steps one after another (see ``lockstep_time``)."""
        busiest = step_bytes(trace)
        start, t = {}, 0.0
        for s in range(1, trace.steps + 1):
            start[s] = t
            if s in busiest:                  # a step without messages costs nothing
                t += self.message(busiest[s])
        return [(start[e.step], self.message(e.nbytes)) for e in trace]

    def __repr__(self):
        return f"AlphaBeta(alpha={self.alpha!r}, beta={self.beta!r})"


class Ports:
    """One run's ports: ``transfer`` books a message first come, first served."""

    def __init__(self, model, world_size):
        self.model = model
        self.send_free = [0.0] * world_size
        self.recv_free = [0.0] * world_size

    def transfer(self, src, dst, nbytes, ready):
        """Book a message posted at ``ready``: returns its ``(start, end)``."""
        start = max(ready, self.send_free[src], self.recv_free[dst])
        end = start + self.model.message(nbytes)
        self.send_free[src] = self.recv_free[dst] = end
        return start, end


def step_bytes(trace):
    """``{step: bytes}``: per step, the most bytes one rank sends or receives in
    it (its port is busy that long)."""
    out = {}
    for s, events in trace.by_step().items():
        sent, received = {}, {}
        for e in events:
            sent[e.src] = sent.get(e.src, 0) + e.nbytes
            received[e.dst] = received.get(e.dst, 0) + e.nbytes
        out[s] = max(max(sent.values()), max(received.values()))
    return out
