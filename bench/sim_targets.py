"""Issue 26's simulator rows, each with its target, measured in one run.

* **ring AllReduce ÷ numpy floor**: ``ringlab.run(ring_allreduce, xs)`` with
  2^20 float64 per rank, trace on, against summing the N vectors into one
  accumulator in place (each input read once). Targets: <= 3x at N = 64,
  <= 4x at N = 256. The median of warm runs (the first pays for fresh memory).
* **messages per CPU second**: a ring AllReduce over 512 ranks of 512 float64
  (one per chunk: 32-byte messages, the per-message cost alone) on
  ``AlphaBeta``. Target: >= 300,000.
* **topology, N = 1024, 4:1 contention**: ``bench/topology.py``'s contended
  fat tree (every ring hop crosses the spines). Target: < 30 s. The longest
  row by far; ``--no-topology`` leaves it out.

Times are CPU seconds of this process (``time.process_time``): the machine is
shared, and CPU time is what the run itself used. Ratios are of two times
measured in the same run.

    python bench/sim_targets.py [--sizes 64 256] [--no-topology]
"""

import argparse
import statistics
import time

import numpy as np

import ringlab
from ringlab.collectives import ring_allreduce

LENGTH = 2 ** 20


def cpu(fn):
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def floor(xs):
    acc = np.zeros_like(xs[0])
    return cpu(lambda: [np.add(acc, x, out=acc) for x in xs])[0]


def verdict(ok):
    return "ok" if ok else "MISSED"


def row(measure, value, target, ok):
    print(f"{measure:<58} {value:>22} {target:>12}  {verdict(ok)}", flush=True)


def allreduce_rows(sizes, repeat):
    for n, target in sizes:
        rng = np.random.default_rng(n)
        xs = [rng.standard_normal(LENGTH) for _ in range(n)]
        run = lambda: ringlab.run(ring_allreduce, xs, timeout=None)
        cpu(run)                                       # cold: fresh memory
        warm = statistics.median(cpu(run)[0] for _ in range(repeat))
        base = statistics.median(floor(xs) for _ in range(repeat))
        ratio = warm / base
        row(f"ring AllReduce 2^20 float64, N = {n}, ÷ numpy floor", f"{ratio:.1f}x ({warm:.2f} s)",
            f"<= {target}x", ratio <= target)
        del xs


def messages_row(n=512):
    xs = [np.ones(n) for _ in range(n)]
    elapsed, res = cpu(lambda: ringlab.run(ring_allreduce, xs, timeout=None,
                                           network=ringlab.AlphaBeta(1e-6, 1e-10)))
    rate = len(res.trace) / elapsed
    row(f"messages per CPU second, {n}-rank ring of tiny vectors", f"{rate:,.0f}", ">= 300,000",
        rate >= 300_000)


def topology_row(n=1024):
    from ringlab.cost.topology import Topology, fat_tree, gpus
    scale = 2 ** 26 / (8 * n)
    leaves = max(1, n // 64)
    thin = fat_tree(n // 8, 8, leaves, 8, oversubscription=4)
    per_leaf = n // leaves
    dealt = [gpus(thin)[(i % leaves) * per_leaf + i // leaves] for i in range(n)]
    xs = [np.ones(n) for _ in range(n)]
    elapsed, _ = cpu(lambda: ringlab.run(ring_allreduce, xs, timeout=None,
                                         network=Topology(thin, dealt, scale=scale)))
    row(f"bench/topology.py N = {n}, 4:1 contention", f"{elapsed:.1f} s", "< 30 s", elapsed < 30)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-topology", action="store_true")
    args = p.parse_args()
    targets = {64: 3, 256: 4}
    print(f"{'measure':<58} {'now':>22} {'target':>12}")
    allreduce_rows([(n, targets.get(n, 4)) for n in args.sizes], args.repeat)
    messages_row()
    if not args.no_topology:
        topology_row()


if __name__ == "__main__":
    main()
