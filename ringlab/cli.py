"""The ``ringlab`` command.

    ringlab grade NOTEBOOK...     run notebooks headless and grade them, trusting none of
                                  their output (see ringlab/grading/trusted.py); --csv FILE,
                                  --json FILE: one row per notebook and exercise, for a class;
                                  --executed DIR: the notebooks as they ran, with their outputs
    ringlab make-exercises        regenerate exercises/ from solutions/ (--check: only compare)
    ringlab analyze               bytes, times, bubble, memory and MFU of one training step
                                  (ringlab/analysis); --json for the whole report

``grade`` exits 0 only if every exercise of every notebook passed.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .grading.kit.language import LANGUAGES
from .grading.trusted import FIELDS


def _write(args, rows):
    """CSV and JSON rewritten after every notebook: a long class run keeps what it has done."""
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    if args.json:
        Path(args.json).write_text(json.dumps([{k: r.get(k) for k in FIELDS} for r in rows], indent=1))


def _executed(args, path):
    """Where --executed DIR puts the notebook ``path`` as it ran: its path under DIR
    (relative to here, or from the root), so that every student's hw.ipynb has its own."""
    if not args.executed:
        return None
    path = Path(os.path.abspath(path))
    try:
        rel = path.relative_to(Path.cwd())
    except ValueError:
        rel = path.relative_to(path.anchor)
    return Path(args.executed) / rel


def _grade_here(args, path):
    from .grading.trusted import grade_notebook
    try:
        return grade_notebook(path, timeout=args.timeout, memory_mb=args.memory_mb, seed=args.seed,
                              override=_override(args), executed=_executed(args, path), lang=args.lang)
    except Exception as e:  # noqa: BLE001 - one notebook never stops the class run
        return [{"notebook": str(path), "exercise": "", "result": "error",
                 "reason": f"the grader failed: {type(e).__name__}: {e}"}]


def _grade_apart(args, path):
    """--jobs: each notebook in a grader process of its own, so that one that
    brings its grader down costs only its own row."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "ringlab.cli", "grade", str(path), "--json", str(out), "--quiet",
               "--timeout", str(args.timeout), "--memory-mb", str(args.memory_mb)]
        cmd += ["--seed", str(args.seed)] if args.seed is not None else []
        cmd += ["--executed", args.executed] if args.executed else []   # same cwd: same place
        cmd += ["--lang", args.lang] if args.lang else []
        cmd += [a for e in args.exercise or [] for a in ("--exercise", e)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        try:
            return json.loads(out.read_text())
        except (OSError, ValueError):
            return [{"notebook": str(path), "exercise": "", "result": "error",
                     "reason": f"the grader process failed (exit code {proc.returncode}): {proc.stderr[-300:]}"}]


def _override(args):
    if not args.exercise:
        return None
    pairs = [e.partition("=") for e in args.exercise]
    return {ex: fn or ex for ex, _, fn in pairs}


def _print_notebook(path, rows, quiet):
    if quiet:
        return
    seconds = max((r.get("seconds") or 0 for r in rows), default=0)
    print(f"== {path} ({seconds:.1f} s)")
    for r in rows:
        print(r.get("text") or f"{r.get('exercise') or '-'}: {r['result']}: {r.get('reason', '')}")
        if r.get("cell_errors"):
            print(f"   (cells that raised: {r['cell_errors']})")


def _columns(text):
    """Terminal columns ``text`` takes: a CJK character (a Chinese file name) takes two.

    >>> _columns("错的.ipynb"), len("错的.ipynb")
    (10, 8)
    """
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _summary(rows):
    print("\nSummary")
    width = max([_columns(str(r["notebook"])) for r in rows] + [8])
    print(f"{'notebook':<{width}}  {'exercise':<20} {'result':<16} cases   reason")
    for r in rows:
        cases = f"{r.get('cases_passed')}/{r.get('cases_total')}" if r.get("cases_total") else "-"
        name = str(r["notebook"])
        print(f"{name}{' ' * (width - _columns(name))}  {r.get('exercise') or '-':<20} "
              f"{r['result']:<16} {cases:<7} {(r.get('reason') or '')[:70]}")


def _grade(args):
    rows_by_index = {}

    def done(i, path, rows):
        rows_by_index[i] = rows
        _print_notebook(path, rows, args.quiet)
        _write(args, [r for k in sorted(rows_by_index) for r in rows_by_index[k]])

    if args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(_grade_apart, args, p): (i, p) for i, p in enumerate(args.notebooks)}
            for future in as_completed(futures):
                done(*futures[future], future.result())
    else:
        for i, path in enumerate(args.notebooks):
            done(i, path, _grade_here(args, path))
    rows = [r for k in sorted(rows_by_index) for r in rows_by_index[k]]
    ok = bool(rows) and all(r["result"] == "passed" for r in rows)
    if not args.quiet:
        _summary(rows)
        print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


def _make_exercises(args):
    from .authoring import make_exercises
    try:
        changed = make_exercises(args.root, check=args.check)
    except ValueError as e:            # a solution notebook without its metadata: nothing written
        print(f"ringlab make-exercises: {e}", file=sys.stderr)
        return 2
    for p in changed:
        print(("would change " if args.check else "wrote ") + str(p))
    return 1 if (args.check and changed) else 0


def _analyze(args):
    from .analysis.command import run_analyze
    return run_analyze(args)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ringlab", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="run notebooks headless and print their grades")
    g.add_argument("notebooks", nargs="+")
    g.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    g.add_argument("--memory-mb", type=int, default=512, help="memory per rank process, MiB")
    g.add_argument("--seed", type=int, help="fix the graders' random data")
    g.add_argument("--exercise", action="append", metavar="ID[=FUNCTION]",
                   help="grade this exercise (function FUNCTION, default ID) whatever the notebook says")
    g.add_argument("--jobs", type=int, default=1, help="grade this many notebooks at once")
    g.add_argument("--csv", metavar="FILE", help="also write one row per notebook and exercise to FILE")
    g.add_argument("--json", metavar="FILE", help="the same rows as JSON")
    g.add_argument("--executed", metavar="DIR",
                   help="also write each notebook as it ran, with its outputs, under DIR "
                        "(at its own path: DIR/submissions/alice/hw.ipynb)")
    g.add_argument("--lang", choices=LANGUAGES,
                   help="the reports' language (default: $RINGLAB_LANG, else en); "
                        "the CSV's reason and check columns stay English")
    g.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    g.set_defaults(func=_grade)
    m = sub.add_parser("make-exercises", help="regenerate exercises/ from solutions/")
    m.add_argument("--root", default=".")
    m.add_argument("--check", action="store_true", help="only report notebooks that would change")
    m.set_defaults(func=_make_exercises)
    from .analysis.command import add_arguments
    a = sub.add_parser("analyze", help="analyze one training step of a parallel layout")
    add_arguments(a)
    a.set_defaults(func=_analyze)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
