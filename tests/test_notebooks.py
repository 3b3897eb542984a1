"""Exercise notebooks are generated from solutions, run cleanly unsolved, and grade from the CLI."""

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from ringlab.authoring import make_exercises, strip_solution
from ringlab.cli import grade_notebook

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def test_strip_solution_keeps_indentation_and_surrounding_code():
    src = "def f(x):\n    y = 1\n    # BEGIN SOLUTION\n    return x + y\n    # END SOLUTION\n\nprint(f)"
    assert strip_solution(src) == ('def f(x):\n    y = 1\n    raise NotImplementedError("your code here")\n'
                                   "\nprint(f)")


def test_strip_solution_rejects_unbalanced_markers():
    with pytest.raises(ValueError, match="unbalanced"):
        strip_solution("# BEGIN SOLUTION\nx = 1\n")


def test_exercises_are_exactly_what_the_solutions_generate():
    assert SOLUTIONS, "no solution notebooks found"
    assert make_exercises(ROOT, check=True) == [], "run `ringlab make-exercises` and commit the result"
    for sol in SOLUTIONS:
        ex = (ROOT / "exercises" / sol.name).read_text()
        assert "BEGIN SOLUTION" not in ex and "NotImplementedError" in ex


@pytest.mark.parametrize("sol", SOLUTIONS, ids=[s.stem for s in SOLUTIONS])
def test_solution_passes_and_exercise_reports_not_implemented(sol):
    reports, errors = grade_notebook(sol)
    assert not errors and reports and all(r["passed"] for r in reports), (errors, reports)
    reports, errors = grade_notebook(ROOT / "exercises" / sol.name)
    assert not errors, errors
    assert reports and all(r["not_implemented"] for r in reports), reports


def test_cli_exit_codes(tmp_path):
    good = ROOT / "solutions" / "01_ring_allreduce.ipynb"
    bad = tmp_path / "bad.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("import ringlab\n1/0")],
                                metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}), bad)
    run = lambda *a: subprocess.run([sys.executable, "-m", "ringlab.cli", "grade", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, cwd=ROOT)
    ok = run(good)
    assert ok.returncode == 0 and "All test cases passed!" in ok.stdout and "PASSED" in ok.stdout
    failed = run(bad)
    assert failed.returncode == 1
    assert "cell 1 raised ZeroDivisionError" in failed.stdout and "no grader ran" in failed.stdout

    # An instructor's summary of a class: one row per grader run and notebook.
    unsolved = ROOT / "exercises" / "01_ring_allreduce.ipynb"
    wrong = tmp_path / "wrong.ipynb"      # returns its input: no sum at all
    nbformat.write(new_notebook(cells=[new_code_cell(
        'import ringlab\nringlab.grade("ring_allreduce", lambda comm, x: x, seed=3)')],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}), wrong)
    table = tmp_path / "grades.csv"
    both = run(good, unsolved, wrong, bad, "--csv", table)
    assert both.returncode == 1
    rows = list(csv.DictReader(table.open()))
    assert [(r["notebook"], r["exercise"], r["result"]) for r in rows] == [
        (str(good), "ring_allreduce", "passed"),
        (str(unsolved), "ring_allreduce", "not implemented"),
        (str(wrong), "ring_allreduce", "failed"),
        (str(bad), "", "no grader ran")]
    assert rows[2]["seed"] == "3" and rows[2]["failed_check"] != "" and rows[2]["cell_errors"] == ""
    assert rows[0]["cases_passed"] == rows[0]["cases_total"] != "0" and rows[0]["seed"] != ""
    assert "ZeroDivisionError" in rows[3]["cell_errors"] and rows[0]["cell_errors"] == ""
