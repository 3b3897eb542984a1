"""The ZeRO and HSDP graders' reports on every program of tests/programs/zero.py and
hsdp.py (seed 0, the self-check), for diffing two setups: a change that must keep
verdicts and report texts (a faster grader, a test setting) is run with and without.

    PYTHONPATH=$PWD python bench/sharded_reports.py > after.txt     # [exercise|program]
    diff before.txt after.txt

What differs between two runs of the same code: tracemalloc's byte counts in a
memory failure (Python's own objects, a few hundred bytes), where a hanging
program was stopped, and file paths when the two trees are in different places.
"""

import inspect
import os
import sys


def programs():
    """(exercise, name, program, its module) for each program, sorted."""
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import programs.hsdp as H
    import programs.zero as Z
    stage = {"z1_": "zero1_step", "z2_": "zero2_step", "z3_": "zero3_step"}
    found = [(stage[name[:3]], name, f, Z) for name, f in vars(Z).items()
             if inspect.isfunction(f) and f.__module__ == Z.__name__ and name[:3] in stage]
    found += [("hsdp_step", name, f, H) for name, f in vars(H).items()
              if inspect.isfunction(f) and f.__module__ == H.__name__
              and not name.startswith("_")
              and list(inspect.signature(f).parameters)[:2] == ["comm", "mesh"]]
    return sorted(found, key=lambda p: p[:2])


def main(which=""):
    import ringlab
    for exercise, name, program, module in programs():
        if which and which not in (exercise, name):
            continue
        for state in ("SHARED", "KEPT", "_PRELOADED"):      # what the cheats leave behind
            getattr(module, state, {}).clear()
        report = ringlab.grade(exercise, program, seed=0, log=False)
        print(f"=== {exercise} {name} passed={report.passed}\n{report}\n", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
