"""Exercise notebooks are generated from solutions, with their metadata, and grade from the CLI
(each notebook's whole path, unsolved and solved: tests/book/test_learner_path.py)."""

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from ringlab import cli
from ringlab.authoring import make_exercises, strip_solution
from ringlab.grading import GRADERS
from ringlab.grading.trusted import exercises_of

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").rglob("[0-9]*.ipynb"))


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
        ex = (ROOT / "exercises" / sol.relative_to(ROOT / "solutions")).read_text()
        assert "BEGIN SOLUTION" not in ex and "NotImplementedError" in ex


def test_every_notebook_says_which_exercises_it_holds():
    """A renamed notebook (alice_hw7.ipynb) is graded by its metadata, never by its name."""
    notebooks = SOLUTIONS + sorted((ROOT / "exercises").rglob("[0-9]*.ipynb"))
    assert len(notebooks) == 3 * len(SOLUTIONS)          # each exercise and its Chinese twin
    lacking = [p.relative_to(ROOT).as_posix() for p in notebooks
               if not nbformat.read(p, as_version=4).metadata.get("ringlab", {}).get("exercises")]
    assert lacking == []
    graded = {e for p in SOLUTIONS for e in nbformat.read(p, as_version=4).metadata.ringlab.exercises}
    assert graded == set(GRADERS), "every exercise id has a notebook, and only those"


def _solution(tmp_path, metadata):
    (tmp_path / "solutions").mkdir()
    nb = new_notebook(cells=[new_code_cell("import ringlab\n\ndef f(comm, x):\n    # BEGIN SOLUTION\n"
                                           "    return x\n    # END SOLUTION"),
                             new_code_cell('ringlab.grade("ring_allreduce", f)')],
                      metadata=metadata)
    nbformat.write(nb, tmp_path / "solutions" / "01_mine.ipynb")


def test_make_exercises_copies_the_metadata(tmp_path):
    _solution(tmp_path, {"ringlab": {"exercises": {"ring_allreduce": "f"}}})
    assert sorted(make_exercises(tmp_path)) == sorted([       # the exercise, its twin, its catalog
        tmp_path / "exercises" / "01_mine.ipynb", tmp_path / "exercises" / "zh" / "01_mine.ipynb",
        tmp_path / "locales" / "zh_CN" / "LC_MESSAGES" / "exercises" / "01_mine.po"])
    ex = nbformat.read(tmp_path / "exercises" / "01_mine.ipynb", as_version=4)
    assert ex.metadata.ringlab == {"exercises": {"ring_allreduce": "f"}}
    assert exercises_of(ex, "renamed.ipynb") == {"ring_allreduce": "f"}


@pytest.mark.parametrize("metadata, message", [
    ({}, "has no ringlab metadata"),
    ({"ringlab": {"exercises": {}}}, "has no ringlab metadata"),
    ({"ringlab": {"exercises": {"ring_allreduse": "f"}}}, "'ring_allreduse', which is no exercise id"),
    ({"ringlab": {"exercises": {"ring_allreduce": "g"}}}, "function 'g', which no cell defines"),
    ({"ringlab": {"exercises": {"ring_allgather": "f"}}}, "no cell grades f as 'ring_allgather'"),
])
def test_make_exercises_refuses_a_solution_without_right_metadata(tmp_path, metadata, message, capsys):
    _solution(tmp_path, metadata)
    with pytest.raises(ValueError, match=message):
        make_exercises(tmp_path)
    assert not (tmp_path / "exercises").exists(), "nothing written"
    assert cli.main(["make-exercises", "--root", str(tmp_path)]) == 2     # the command: one line, no traceback
    assert message in capsys.readouterr().err


# Chinese twins whose statements are not translated yet: each reads English. A twin
# leaves this list when every one of its cells has its Chinese.
UNTRANSLATED_EXERCISES: set[str] = set()


def test_every_exercise_has_a_chinese_twin():
    """exercises/<part>/zh/X.ipynb (ringlab/authoring.py): the English code cells after
    one that asks for Chinese reports, "lang": "zh" in its metadata, and every statement
    in Chinese from its catalog (no cell left English, none fuzzy)."""
    from babel.messages.pofile import read_po

    from ringlab.authoring import CHINESE_SETUP
    untranslated = set()
    for sol in SOLUTIONS:
        where = sol.relative_to(ROOT / "solutions")
        ex = nbformat.read(ROOT / "exercises" / where, as_version=4)
        zh = nbformat.read(ROOT / "exercises" / where.parent / "zh" / where.name, as_version=4)
        assert zh.metadata.ringlab == {**ex.metadata.ringlab, "lang": "zh"}
        assert zh.cells[0].source == CHINESE_SETUP
        assert [c.source for c in zh.cells[1:] if c.cell_type == "code"] == \
            [c.source for c in ex.cells if c.cell_type == "code"]
        english = [c.source for c in ex.cells if c.cell_type == "markdown"]
        chinese = [c.source for c in zh.cells if c.cell_type == "markdown"]
        assert len(english) == len(chinese)
        po = ROOT / "locales/zh_CN/LC_MESSAGES/exercises" / where.with_suffix(".po")
        with open(po, "rb") as f:
            assert not [m.id for m in read_po(f) if m.id and m.fuzzy], f"{po}: fuzzy messages"
        if any(e == c for e, c in zip(english, chinese)):
            untranslated.add(where.stem)
    assert untranslated == UNTRANSLATED_EXERCISES, (
        f"left English: {sorted(untranslated - UNTRANSLATED_EXERCISES)}; translated now, "
        f"remove them from UNTRANSLATED_EXERCISES: {sorted(UNTRANSLATED_EXERCISES - untranslated)}")


def test_a_changed_statement_turns_fuzzy_and_reads_english(tmp_path):
    """make-exercises keeps a catalog in step with its notebook: a translation whose
    English cell changed is kept for the translator, marked fuzzy, and not used."""
    _solution(tmp_path, {"ringlab": {"exercises": {"ring_allreduce": "f"}}})
    sol = tmp_path / "solutions" / "01_mine.ipynb"
    nb = nbformat.read(sol, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# Exercise 1: the **ring**"))
    nbformat.write(nb, sol)
    make_exercises(tmp_path)
    po = tmp_path / "locales/zh_CN/LC_MESSAGES/exercises/01_mine.po"
    po.write_text(po.read_text("utf-8").replace('msgstr ""', 'msgstr "# 练习 1：**环**"', 1), "utf-8")
    make_exercises(tmp_path)
    twin = tmp_path / "exercises/zh/01_mine.ipynb"
    assert nbformat.read(twin, as_version=4).cells[1].source == "# 练习 1：**环**"
    nb.cells[0].source = "# Exercise 1: the **ring** AllReduce"
    nbformat.write(nb, sol)
    assert sorted(make_exercises(tmp_path, check=True)) == sorted(
        [po, tmp_path / "exercises/01_mine.ipynb", twin])
    make_exercises(tmp_path)
    assert "#, fuzzy" in po.read_text("utf-8") and "练习 1" in po.read_text("utf-8")
    assert nbformat.read(twin, as_version=4).cells[1].source == "# Exercise 1: the **ring** AllReduce"


def test_cli_exit_codes_csv_and_executed_notebooks(tmp_path):
    """A class run: one row per notebook, exit 1 unless all passed, and --executed keeps each
    notebook as it ran at its own path (two students' hw.ipynb never collide). The exit 0 of
    a passing notebook: tests/book/test_learner_path.py."""
    unsolved = ROOT / "exercises" / "collectives" / "01_ring_allreduce.ipynb"
    bad = tmp_path / "ring_allreduce.ipynb"      # the file name says which exercise
    nbformat.write(new_notebook(cells=[new_code_cell("import ringlab\n1/0")],
                                metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}), bad)
    table, ran = tmp_path / "grades.csv", tmp_path / "ran"
    failed = subprocess.run([sys.executable, "-m", "ringlab.cli", "grade", unsolved, bad, "--csv", table,
                             "--executed", ran, "--jobs", "2"], capture_output=True, text=True, cwd=ROOT)
    assert failed.returncode == 1 and "FAILED" in failed.stdout
    rows = list(csv.DictReader(table.open()))
    assert [(r["exercise"], r["result"]) for r in rows] == [("ring_allreduce", "not implemented"),
                                                            ("ring_allreduce", "failed")]
    assert "ZeroDivisionError" in rows[1]["cell_errors"] and "no function ring_allreduce" in rows[1]["reason"]
    # relative to the working directory, or from the root
    outputs = nbformat.read(ran / unsolved.relative_to(ROOT), as_version=4).cells
    assert any("not implemented yet" in o.get("text", "") for c in outputs for o in c.get("outputs", []))
    crashed = nbformat.read(ran / bad.relative_to(bad.anchor), as_version=4).cells[0].outputs
    assert [o.ename for o in crashed if o.output_type == "error"] == ["ZeroDivisionError"]
