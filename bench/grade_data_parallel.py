"""How long one grade of each data-parallel exercise takes (target: under 2 s).

Grades the reference solutions of ``sync_sgd_step``, ``bucketed_grad_sync``
and ``async_ps`` with ``ringlab.grade`` (in-process simulator, the notebooks' path) and prints
the median of ``--repeat`` runs, with the number of cases.

    python bench/grade_data_parallel.py [--repeat 5]

Measured on this project's 2-core machine (median of 5, max in brackets):
sync_sgd_step 0.15 s (0.16 s), 10 cases on 1-8 ranks; bucketed_grad_sync
0.11 s (0.13 s), 7 cases on 2-8 ranks; async_ps 0.11 s (0.13 s), 7 cases. Every run records
the payloads, which the content checks read. Under ``ringlab grade`` (one
process per rank) a grade of sync_sgd_step takes about 5 s.
"""

import argparse
import statistics
import time

import ringlab
from ringlab.data_parallel import ddp_sync, sync_sgd_step
from ringlab.data_parallel.async_ps import async_ps


def bucketed_grad_sync(comm, params, backward, cap_bytes):
    return ddp_sync(comm, params, backward, cap_bytes, cap_bytes)


SOLUTIONS = {"sync_sgd_step": sync_sgd_step, "bucketed_grad_sync": bucketed_grad_sync,
             "async_ps": async_ps}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for exercise, program in SOLUTIONS.items():
        times = []
        for seed in range(args.repeat):
            t = time.perf_counter()
            report = ringlab.grade(exercise, program, seed=seed, log=False)
            times.append(time.perf_counter() - t)
            assert report.passed, str(report)
        print(f"{exercise:20} {statistics.median(times):6.3f} s median of {args.repeat} "
              f"({report.cases_total} cases), max {max(times):.3f} s; target < 2 s")


if __name__ == "__main__":
    main()
