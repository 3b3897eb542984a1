"""How fast is the simulated ring AllReduce, relative to the work it cannot avoid?

For N ranks with 2^20 float64 each, it times ``ringlab.run(ring_allreduce, ...)``
(trace on) and a floor measured in the same run: adding the N input vectors
into one accumulator with numpy, in place (each input read once). It prints
wall time and the ratio. Targets (issue 2): N=64 within 10x of the floor;
N=256 under 5 s.

The first run of each N pays for first-touching fresh memory (the outputs
alone are N x 8 MiB), so it is shown separately; the ratio uses the median
of the warm runs.

    python bench/ring_allreduce.py [--sizes 8 64 256] [--repeat 3]
"""

import argparse
import statistics
import time

import numpy as np

import ringlab
from ringlab.collectives import ring_allreduce

LENGTH = 2 ** 20


def floor_time(xs):
    acc = np.zeros_like(xs[0])
    t = time.perf_counter()
    for x in xs:
        np.add(acc, x, out=acc)
    return time.perf_counter() - t


def run_time(xs):
    t = time.perf_counter()
    res = ringlab.run(ring_allreduce, xs, timeout=None)
    elapsed = time.perf_counter() - t
    assert len(res.trace) == 2 * len(xs) * (len(xs) - 1)
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print(f"{'N':>5} {'cold run':>10} {'warm median':>12} {'floor':>9} {'ratio':>7}")
    for n in args.sizes:
        rng = np.random.default_rng(n)
        xs = [rng.standard_normal(LENGTH) for _ in range(n)]
        cold = run_time(xs)
        warm = statistics.median(run_time(xs) for _ in range(args.repeat))
        floor = statistics.median(floor_time(xs) for _ in range(args.repeat))
        print(f"{n:>5} {cold:>9.3f}s {warm:>11.3f}s {floor:>8.4f}s {warm / floor:>6.1f}x", flush=True)
        del xs


if __name__ == "__main__":
    main()
