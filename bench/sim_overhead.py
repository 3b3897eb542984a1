"""What simulated time costs: the simulator now vs before it had time, and with a network vs without.

Three timings of ``ringlab.run(ring_allreduce, xs)`` in the same run:

* **before**: the simulator as it was before simulated time, groups and the
  one-port receive rule (git revision ``BEFORE``, unpacked into a temporary
  folder and run in a subprocess from there);
* **now**: today's simulator, no ``network=``;
* **alpha-beta**: today's simulator with ``network=ringlab.AlphaBeta(...)``.

It prints the medians and the ratios now/before (target: 1.0 or less) and
alpha-beta/now (target: within 1.5). Two shapes: N = 256 ranks with 2^20
float64 each (the bench's standard size: the copying of chunks dominates),
and N = 256 with 2^10 each (messages of 32 bytes: the per-message overhead
dominates, the worst case for the scheduler).

    python bench/sim_overhead.py [--repeat 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

BEFORE = "dc0565b"      # the last revision of the step-only simulator

PROGRAM = r"""
import sys, time, statistics, numpy as np
sys.path.insert(0, sys.argv[1])
import ringlab
from ringlab.collectives import ring_allreduce
n, length, repeat, net = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
xs = [np.random.default_rng(r).standard_normal(length) for r in range(n)]
kw = {"network": ringlab.AlphaBeta(1e-6, 1e-10)} if net == "net" else {}
times = []
for _ in range(repeat + 1):                     # the first run pays for fresh memory
    t = time.perf_counter()
    ringlab.run(ring_allreduce, xs, timeout=None, **kw)
    times.append(time.perf_counter() - t)
print(statistics.median(times[1:]))
"""


def timed(root, n, length, repeat, net=""):
    out = subprocess.run([sys.executable, "-c", PROGRAM, root, str(n), str(length), str(repeat),
                          net or "-"], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "-C", here, "archive", BEFORE, "ringlab"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        print(f"{'N':>4} {'length':>8} {'before':>8} {'now':>8} {'alpha-beta':>10} "
              f"{'now/before':>10} {'ab/now':>7}")
        for n, length in ((256, 2 ** 20), (256, 2 ** 10)):
            before = timed(old, n, length, args.repeat)
            now = timed(here, n, length, args.repeat)
            ab = timed(here, n, length, args.repeat, "net")
            print(f"{n:>4} {length:>8} {before:>7.3f}s {now:>7.3f}s {ab:>9.3f}s "
                  f"{now / before:>10.2f} {ab / now:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
