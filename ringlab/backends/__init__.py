"""Run the same ringlab program on real processes (``torch.distributed``).

    >>> res = ringlab.run(ring_allreduce, inputs, backend="torch")   # doctest: +SKIP
    >>> res.trace == ringlab.run(ring_allreduce, inputs).trace       # doctest: +SKIP
    True

Backends:

* ``"torch"`` (also ``"gloo"``): one CPU process per rank, talking over the
  gloo library through TCP on this machine;
* ``"nccl"`` (also ``"torch-nccl"``): one process per rank, one GPU each
  (needs as many CUDA GPUs as ranks). Arrays are copied to the GPU to travel.
  Not tested on GPUs by this project's CI (it has none). An NCCL send may
  wait until its receive is posted, as in the simulator's
  ``mode="rendezvous"``: check a program there first. ``sendrecv`` is sent
  as one NCCL group, so rings of ``sendrecv`` are safe.

The program gets the same ``comm`` as in the simulator; ``send``/``recv``
become ``torch.distributed.isend``/``recv`` (see ``protocol.py`` for what goes
over the wire). Outputs and trace come back to the calling process, and for a
deterministic program the trace equals the simulator's event for event.
Errors are the simulator's too: ``RankError``, ``DeadlockError``,
``ProgramTimeout``, ``UnreceivedMessagesError``.

Modules, parent side (no torch): ``supervisor`` (one run: dispatch, watch,
errors), ``pool`` (the worker processes), ``status`` (shared memory in which
each rank says what it is doing), ``outcome`` (what a rank reports).
Rank side: ``worker`` (a worker process), ``protocol`` (one rank's ``comm``),
``wire`` (how a message travels), and ``timing`` (AllReduce timings).
For several machines use ``python -m ringlab.launch`` under ``torchrun``.
Importing ``ringlab`` never imports torch; only a run with these backends does.
"""

import importlib.util

BACKENDS = {"torch": "gloo", "gloo": "gloo", "torch-gloo": "gloo", "nccl": "nccl", "torch-nccl": "nccl"}


def available(backend="torch"):
    """Whether ``backend`` can run here (torch installed; for NCCL, enough GPUs is
    checked only at run time)."""
    return backend in BACKENDS and importlib.util.find_spec("torch") is not None


def run(backend, program, inputs, *, args=(), kwargs=None, timeout=10.0, check_unreceived=True,
        record_payloads=False):
    """``ringlab.run(..., backend=...)`` for every backend but the simulator."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: 'sim', {', '.join(map(repr, BACKENDS))}")
    if importlib.util.find_spec("torch") is None:
        raise ImportError(f"backend={backend!r} needs PyTorch: pip install 'ringlab[torch]'")
    from .torch import supervisor
    return supervisor.run(BACKENDS[backend], program, inputs, args=args, kwargs=kwargs, timeout=timeout,
                          check_unreceived=check_unreceived, record_payloads=record_payloads)


def shutdown():
    """Stop the worker processes kept for the next run (also done at exit)."""
    from .torch import pool
    pool.shutdown()


__all__ = ["BACKENDS", "available", "run", "shutdown"]
