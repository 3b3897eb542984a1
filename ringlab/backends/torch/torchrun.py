"""Run a ringlab program with one process per rank, on one or many machines.

``python -m ringlab.launch`` is what each process runs under ``torchrun``
(or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``). One machine, 4 ranks::

    torchrun --standalone --nproc-per-node 4 -m ringlab.launch \\
        ringlab.collectives:ring_allreduce --inputs random:1000 --compare-sim

Two machines with 4 ranks each (run on both; ``--node-rank 1`` on the second)::

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank 0 \\
        --master-addr HOST0 --master-port 29500 \\
        -m ringlab.launch mymodule:my_allreduce --inputs mymodule:make_inputs --out results/

``PROGRAM`` is ``module:function`` (or ``path/to/file.py:function``).
``--inputs`` is ``random:LENGTH`` (whole-number float64 vectors, seeded by
``--seed`` and the rank) or ``module:function``, called as
``function(world_size)`` on every rank; it must return the same list
everywhere, and each rank takes its own entry. Rank 0 collects every rank's
outputs and trace, prints a summary, and with ``--out DIR`` writes
``outputs.pkl`` and ``trace.json`` there; ``--compare-sim`` also runs the
simulator and checks outputs and trace are identical.

Faults: a rank that raises prints ``rank R raised ...`` with its traceback
and exits, and torchrun stops the other ranks. ``--timeout`` seconds after
the start, a rank that has not finished prints what it waits for and exits.
``--backend nccl`` puts rank r on GPU ``LOCAL_RANK``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import pickle
import sys
import threading
import time

import numpy as np


def load(spec):
    """``module:function`` or ``file.py:function`` -> the function."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise SystemExit(f"ringlab.launch: expected module:function, got {spec!r}")
    if where.endswith(".py"):
        mod_spec = importlib.util.spec_from_file_location(os.path.basename(where)[:-3], where)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def make_inputs(spec, world_size, seed):
    """The list of every rank's input, from an ``--inputs`` spec."""
    kind, _, rest = spec.partition(":")
    if kind == "random":
        length = int(rest)
        return [np.random.default_rng([seed, r]).integers(-1000, 1000, length).astype(np.float64)
                for r in range(world_size)]
    inputs = list(load(spec)(world_size))
    if len(inputs) != world_size:
        raise SystemExit(f"ringlab.launch: {spec} returned {len(inputs)} inputs for {world_size} ranks")
    return inputs


def _watchdog(seconds, rank, status, finished):
    # A rank blocked in dist.recv can't be interrupted; say what it waits for and leave.
    from .status import describe
    if not finished.wait(seconds):
        print(f"ringlab.launch: rank {rank} did not finish within {seconds:g} s; it "
              f"{describe(status.words)}", file=sys.stderr, flush=True)
        os._exit(3)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ringlab.launch", description=__doc__.split("\n")[0])
    ap.add_argument("program", help="module:function or file.py:function")
    ap.add_argument("--inputs", required=True, help="random:LENGTH or module:function")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--args", default="[]", help="JSON list of extra positional arguments")
    ap.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", help="directory for outputs.pkl and trace.json (rank 0)")
    ap.add_argument("--compare-sim", action="store_true", help="check against the simulator (rank 0)")
    opt = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from . import status as st
    from .outcome import drain_plan, format_traceback, merged_trace, peer_gone
    from .world import run_rank
    from ...errors import RankError, UnreceivedMessagesError

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    status, finished = st.Status.dummy(), threading.Event()
    threading.Thread(target=_watchdog, args=(opt.timeout, rank, status, finished), daemon=True).start()
    program = load(opt.program)
    inputs = make_inputs(opt.inputs, world_size, opt.seed)
    args, kwargs = tuple(json.loads(opt.args)), json.loads(opt.kwargs)
    device = None
    if opt.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(opt.backend, timeout=datetime.timedelta(seconds=opt.timeout))

    t0 = time.perf_counter()
    world, outcome = run_rank(program, inputs[rank], args, kwargs, rank, world_size, device, status)
    seconds = time.perf_counter() - t0
    if outcome.error is not None:
        if peer_gone(outcome.error):
            print(f"ringlab.launch: rank {rank} stopped at step {outcome.step}: another rank's process "
                  f"ended (its own message says why)", file=sys.stderr, flush=True)
        else:
            err = RankError(rank, outcome.step, outcome.error, format_traceback(outcome, program))
            print(f"ringlab.launch: {err}", file=sys.stderr, flush=True)
        os._exit(1)                  # torchrun sees the failure and stops the other ranks

    # Rank 0 collects everyone's outcome, then tells each rank what is left to do.
    outcomes = [None] * world_size if rank == 0 else None
    dist.gather_object(outcome, outcomes, dst=0)
    decision = [None]
    if rank == 0:
        trace = merged_trace(outcomes)          # also what _report shows at the end
        decision = [{"left": len(trace.unreceived), "drain": drain_plan(outcomes)}]
    dist.broadcast_object_list(decision, src=0)
    if decision[0]["left"]:
        if rank == 0:
            print(f"ringlab.launch: {UnreceivedMessagesError(trace.unreceived)}", file=sys.stderr, flush=True)
        os._exit(2)                  # those sends can never complete: don't wait for them
    world.finish(decision[0]["drain"].get(rank))
    dist.barrier()
    finished.set()
    if rank == 0:
        code = _report(opt, program, inputs, args, kwargs, outcomes, trace, seconds)
    dist.destroy_process_group()
    sys.exit(code if rank == 0 else 0)


def _report(opt, program, inputs, args, kwargs, outcomes, trace, seconds):
    """Rank 0: print the summary, write files, compare with the simulator."""
    results = [o.result for o in outcomes]
    for o in outcomes:
        sys.stdout.write(o.printed)
    print(f"{opt.program} on {trace.world_size} ranks ({opt.backend}): {trace.steps} steps, "
          f"{len(trace)} messages, {trace.total_bytes} bytes, {seconds:.3f} s on rank 0")
    print(trace.table(limit=24))
    if opt.out:
        os.makedirs(opt.out, exist_ok=True)
        with open(os.path.join(opt.out, "outputs.pkl"), "wb") as f:
            pickle.dump(results, f)
        with open(os.path.join(opt.out, "trace.json"), "w") as f:
            f.write(trace.to_json())
        print(f"wrote {opt.out}/outputs.pkl and {opt.out}/trace.json; to look at the trace in a notebook:\n"
              f"    ringlab.Trace.from_json(open({os.path.join(opt.out, 'trace.json')!r}).read()).show()")
    if not opt.compare_sim:
        return 0
    from ...sim import run as simulate
    sim = simulate(program, inputs, args=args, kwargs=kwargs, timeout=opt.timeout)
    same_out = all(_equal(a, b) for a, b in zip(sim.outputs, results))
    same_trace = sim.trace == trace and sim.trace.spans == trace.spans
    print(f"same outputs as the simulator: {same_out}; same trace: {same_trace}")
    if not same_trace:
        print(sim.trace.diff(trace))
    return 0 if same_out and same_trace else 1


def _equal(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


if __name__ == "__main__":
    main()
