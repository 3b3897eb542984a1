"""How fast is the topology-aware network model, relative to the alpha-beta one?

A ring AllReduce over N ranks on a leaf/spine fat tree (8 GPUs per server, 64
GPUs per leaf, 8 spines), three runs in the same process:

* **alpha-beta**: ``network=AlphaBeta(...)``, the baseline (ports, no sharing);
* **no contention**: ``Topology(fat_tree(..., oversubscription=1))``, ranks in
  leaf order: every flow has its links to itself (the model's fast path);
* **contention**: oversubscribed 4:1 and ranks dealt round-robin over the
  leaves, so every ring hop crosses the spines and about 8 flows share each
  uplink (max-min re-sharing on every send and every end).

Each rank holds N float64 (one per chunk: the per-message cost dominates, the
worst case for the simulator) and the topology runs use ``scale`` so that
messages are priced as a 64 MiB AllReduce (sizes, not data). It prints wall
and CPU time (the machine is shared: CPU time is what the run itself used),
messages (events) per CPU second, the ratio of CPU times to the alpha-beta
baseline of the same run, and the simulated times. Targets (issue 16): N = 256
under 10 s and N = 1024 under 60 s on a fat tree.

    python bench/topology.py [--sizes 256 1024]
"""

import argparse
import time

import numpy as np

import ringlab
from ringlab.collectives import ring_allreduce
from ringlab.cost.topology import Topology, fat_tree, gpus

BYTES = 2 ** 26          # the AllReduce being priced: 64 MiB per rank


def timed(xs, network):
    t, cpu = time.perf_counter(), time.process_time()
    res = ringlab.run(ring_allreduce, xs, timeout=None, network=network)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    assert len(res.trace) == 2 * len(xs) * (len(xs) - 1)
    return wall, cpu, res.time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    args = p.parse_args()
    print(f"{'N':>5} {'network':<14} {'wall':>8} {'cpu':>8} {'events/s':>9} {'vs ab':>6} "
          f"{'simulated':>10}")
    for n in args.sizes:
        xs = [np.ones(n) for _ in range(n)]
        scale = BYTES / (8 * n)
        leaves = max(1, n // 64)
        flat = fat_tree(n // 8, 8, leaves, 8, oversubscription=1)
        thin = fat_tree(n // 8, 8, leaves, 8, oversubscription=4)
        per_leaf = n // leaves
        dealt = [gpus(thin)[(i % leaves) * per_leaf + i // leaves] for i in range(n)]
        runs = [("alpha-beta", ringlab.AlphaBeta(alpha=2e-6, beta=scale / 50e9)),
                ("no contention", Topology(flat, scale=scale)),
                ("contention", Topology(thin, dealt, scale=scale))]
        events = 2 * n * (n - 1)
        base = None
        for name, net in runs:
            wall, cpu, sim = timed(xs, net)
            base = base or cpu
            print(f"{n:>5} {name:<14} {wall:>7.2f}s {cpu:>7.2f}s {events / cpu:>9.0f} "
                  f"{cpu / base:>5.2f}x {sim * 1e3:>8.3f}ms", flush=True)


if __name__ == "__main__":
    main()
