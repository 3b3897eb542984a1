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

``ports="link"`` gives every ordered pair of ranks a wire of its own instead
(one message at a time on each, both directions independent): a rank may then
send to its left and its right neighbour at once, as over point-to-point
NVLink or a torus. ``TwoLevel`` prices messages inside a node and between
nodes differently (``ringlab.cost.interconnects`` has realistic numbers).
"""

from __future__ import annotations


class AlphaBeta:
    """``alpha`` seconds per message plus ``beta`` seconds per byte, on every link."""

    def __init__(self, alpha, beta, ports="rank"):
        if not (alpha >= 0 and beta >= 0):
            raise ValueError(f"AlphaBeta(alpha={alpha!r}, beta={beta!r}): both must be >= 0")
        if ports not in ("rank", "link"):
            raise ValueError(f"AlphaBeta(ports={ports!r}): 'rank' (one send and one receive "
                             f"port per rank) or 'link' (one wire per ordered pair of ranks)")
        self.alpha, self.beta, self.per = float(alpha), float(beta), ports

    @classmethod
    def from_interconnect(cls, link, latency=None, ports="rank"):
        """The model of one row of ``ringlab.cost.interconnects``: alpha its latency
        (or ``latency`` seconds, where the row has none), beta 1 / (its bandwidth
        per direction).

        >>> from ringlab.cost.interconnects import INTERCONNECTS
        >>> AlphaBeta.from_interconnect(INTERCONNECTS["InfiniBand HDR"])
        AlphaBeta(alpha=6e-07, beta=4e-11)
        >>> AlphaBeta.from_interconnect(INTERCONNECTS["NVLink 4"], latency=1e-6).beta * 1e12
        2.2222222222222223
        """
        alpha = link.latency_s if latency is None else latency
        if alpha is None:
            raise ValueError(f"{link.name}: no source gives a latency; pass latency= (seconds)")
        return cls(alpha, 1.0 / link.bytes_per_s, ports)

    def between(self, src, dst):
        """The model that prices a message from ``src`` to ``dst``: this one, everywhere."""
        return self

    def message(self, nbytes):
        """Seconds one message of ``nbytes`` takes on an idle link."""
        return self.alpha + self.beta * nbytes

    # -- as a network model ------------------------------------------------------------
    def ports(self, world_size):
        """The per-run state: when each rank's ports are next free."""
        return Ports(self, world_size, self.per)

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
        more = "" if self.per == "rank" else f", ports={self.per!r}"
        return f"AlphaBeta(alpha={self.alpha!r}, beta={self.beta!r}{more})"


class TwoLevel:
    """Ranks in nodes of ``gpus_per_node`` consecutive ranks: a message inside a
    node costs what ``intra`` says, one between nodes what ``inter`` says. Each
    rank has its own send and receive port (one NIC per GPU, as in a DGX H100).

    >>> net = TwoLevel(AlphaBeta(1e-6, 1e-11), AlphaBeta(5e-6, 1e-10), gpus_per_node=4)
    >>> net.between(0, 3).alpha, net.between(3, 4).alpha
    (1e-06, 5e-06)
    """

    def __init__(self, intra, inter, gpus_per_node):
        g = gpus_per_node
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"TwoLevel(gpus_per_node={gpus_per_node!r}): an int >= 1")
        self.intra, self.inter, self.gpus_per_node = intra, inter, gpus_per_node

    def between(self, src, dst):
        same = src // self.gpus_per_node == dst // self.gpus_per_node
        return self.intra if same else self.inter

    def ports(self, world_size):
        return Ports(self, world_size)

    def __repr__(self):
        return f"TwoLevel({self.intra!r}, {self.inter!r}, gpus_per_node={self.gpus_per_node})"


class Ports:
    """One run's ports: ``transfer`` books a message first come, first served.

    ``per="rank"``: a send port and a receive port per rank; ``per="link"``: a
    port per ordered pair (src, dst), so only messages on the same wire wait."""

    def __init__(self, model, world_size, per="rank"):
        self.model, self.per = model, per
        self.send_free, self.recv_free = {}, {}
        # One AlphaBeta between every pair, ports per rank (the common case, on
        # every message of a run): priced here, without two method calls.
        if (per == "rank" and type(model).between is AlphaBeta.between
                and type(model).message is AlphaBeta.message):
            self.transfer = self._transfer_flat

    def transfer(self, src, dst, nbytes, ready):
        """Book a message posted at ``ready``: returns its ``(start, end)``."""
        out, into = (src, dst) if self.per == "rank" else ((src, dst), (src, dst))
        start = max(ready, self.send_free.get(out, 0.0), self.recv_free.get(into, 0.0))
        end = start + self.model.between(src, dst).message(nbytes)
        self.send_free[out] = self.recv_free[into] = end
        return start, end

    def _transfer_flat(self, src, dst, nbytes, ready):
        """``transfer`` for one AlphaBeta everywhere, ports per rank: the same
        sums in the same order (``max`` keeps the first of equal values)."""
        start, free = ready, self.send_free.get(src, 0.0)
        if free > start:
            start = free
        free = self.recv_free.get(dst, 0.0)
        if free > start:
            start = free
        model = self.model
        end = start + (model.alpha + model.beta * nbytes)
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
