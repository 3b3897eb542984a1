"""The ``ringlab`` command.

    ringlab grade NOTEBOOK...     run notebooks headless and print their grades
                                  (--csv FILE: one row per grader and notebook, for a class)
    ringlab make-exercises        regenerate exercises/ from solutions/ (--check: only compare)

``grade`` exits 0 only if every notebook ran without a failing cell and every
grader in it passed.
"""

import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path


def grade_notebook(path, timeout=600):
    """Execute one notebook; return (reports, errors) where reports are the dicts
    ``ringlab.grade`` logged and errors describe cells that raised."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "grades.jsonl"
        old = os.environ.get("RINGLAB_GRADE_LOG")
        os.environ["RINGLAB_GRADE_LOG"] = str(log)   # the kernel inherits it
        try:
            client = NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                                    resources={"metadata": {"path": str(Path(path).parent)}})
            client.execute()
        finally:
            if old is None:
                os.environ.pop("RINGLAB_GRADE_LOG")
            else:
                os.environ["RINGLAB_GRADE_LOG"] = old
        reports = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    errors = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(f"cell {i + 1} raised {out['ename']}: {out['evalue']}")
    return reports, errors


CSV_FIELDS = ("notebook", "exercise", "result", "cases_passed", "cases_total", "failed_check", "seed",
              "cell_errors")


def _rows(path, reports, errors):
    """The CSV rows of one notebook: one per grader run, or one saying none ran."""
    base = {"notebook": str(path), "cell_errors": " | ".join(errors)}
    if not reports:
        return [{**base, "result": "no grader ran"}]
    return [{**base, "exercise": r["exercise"], "seed": r.get("seed"),
             "result": "passed" if r["passed"] else "not implemented" if r["not_implemented"] else "failed",
             "cases_passed": r.get("cases_passed"), "cases_total": r.get("cases_total"),
             "failed_check": r.get("check") or ""} for r in reports]


def _grade(args):
    ok, rows = True, []
    for path in args.notebooks:
        print(f"== {path}")
        reports, errors = grade_notebook(path, timeout=args.timeout)
        for e in errors:
            print(f"ERROR: {e}")
        for r in reports:
            print(r["text"])
        if not reports:
            print("no grader ran in this notebook (is there a ringlab.grade(...) cell?)")
        ok = ok and not errors and bool(reports) and all(r["passed"] for r in reports)
        rows += _rows(path, reports, errors)
        if args.csv:       # written after every notebook: a long class run keeps what it has done
            with open(args.csv, "w", newline="") as f:
                writer = csv.DictWriter(f, CSV_FIELDS)
                writer.writeheader()
                writer.writerows(rows)
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


def _make_exercises(args):
    from .authoring import make_exercises
    changed = make_exercises(args.root, check=args.check)
    for p in changed:
        print(("would change " if args.check else "wrote ") + str(p))
    return 1 if (args.check and changed) else 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ringlab", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="run notebooks headless and print their grades")
    g.add_argument("notebooks", nargs="+")
    g.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    g.add_argument("--csv", metavar="FILE", help="also write one row per grader and notebook to FILE")
    g.set_defaults(func=_grade)
    m = sub.add_parser("make-exercises", help="regenerate exercises/ from solutions/")
    m.add_argument("--root", default=".")
    m.add_argument("--check", action="store_true", help="only report notebooks that would change")
    m.set_defaults(func=_make_exercises)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
