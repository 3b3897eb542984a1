"""Exercise notebooks are made from solution notebooks, so the two never drift apart.

In a solution notebook, code between ``# BEGIN SOLUTION`` and ``# END SOLUTION``
is the answer. The exercise gets, in its place, at the same indentation::

    raise NotImplementedError("...")   # your code here

Outputs are stripped from both. ``ringlab make-exercises`` writes
``exercises/<part>/X.ipynb`` for every ``solutions/<part>/X.ipynb``; ``--check`` only
reports notebooks that would change (the test suite runs it).

Every solution notebook says which exercises it holds, in its metadata:
``{"ringlab": {"exercises": {exercise id: function name}}}``. The exercise
gets the same metadata, so ``ringlab grade`` knows what a learner's notebook is
for even after the learner renamed it (``alice_hw7.ipynb``). A solution
without it, or whose metadata names a function it does not define or grade,
is refused.
"""

import re
from pathlib import Path

import nbformat

from .grading import GRADERS

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
STUB = 'raise NotImplementedError("your code here")'
_BLOCK = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*(\n|$)",
                    re.M | re.S)


def strip_solution(source):
    """Replace every marked solution block in ``source`` by a stub."""
    if source.count(BEGIN) != source.count(END):
        raise ValueError(f"unbalanced {BEGIN!r}/{END!r} markers in:\n{source}")
    return _BLOCK.sub(lambda m: f"{m.group(1)}{STUB}\n", source)


def exercises_in(nb, name="the notebook"):
    """The solution notebook's ``{exercise id: function name}``, checked against its
    cells: every function is defined and graded (``ringlab.grade("id", name)``)."""
    meta = nb.metadata.get("ringlab")
    exercises = meta.get("exercises") if isinstance(meta, dict) else None
    example = '"ringlab": {"exercises": {"ring_allreduce": "ring_allreduce"}}'
    if not isinstance(exercises, dict) or not exercises:
        raise ValueError(f"{name} has no ringlab metadata: add {{{example}}} (exercise id: "
                         "function name) to its notebook metadata, one entry per exercise")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for exercise, function in exercises.items():
        if exercise not in GRADERS:
            raise ValueError(f"{name}: its ringlab metadata names {exercise!r}, which is no "
                             f"exercise id (known: {', '.join(sorted(GRADERS))})")
        if not re.search(rf"^def {re.escape(str(function))}\(", code, re.M):
            raise ValueError(f"{name}: its ringlab metadata says exercise {exercise!r} is "
                             f"function {function!r}, which no cell defines")
        call = rf"ringlab\.grade\(\s*[\"']{re.escape(exercise)}[\"']\s*,\s*{re.escape(function)}\s*\)"
        if not re.search(call, code):
            raise ValueError(f"{name}: no cell grades {function} as {exercise!r} "
                             f"(ringlab.grade(\"{exercise}\", {function}))")
    return dict(exercises)


def exercise_from_solution(nb, name="the notebook"):
    """The exercise notebook for a solution notebook (a new object), with the same
    ``ringlab`` metadata (ValueError if the solution has none: see ``exercises_in``)."""
    exercises = exercises_in(nb, name)
    ex = nbformat.from_dict(nb)
    ex.metadata["ringlab"] = {"exercises": exercises}   # what `ringlab grade` reads
    for cell in ex.cells:
        if cell.cell_type == "code":
            cell.source = strip_solution(cell.source)
            cell.outputs, cell.execution_count = [], None
        if "solution-only" in cell.get("metadata", {}).get("tags", []):
            cell.source = ""
    ex.cells = [c for c in ex.cells if c.source != "" or c.cell_type != "markdown"]
    return ex


def _text(nb):
    return nbformat.writes(nb) + "\n"


def make_exercises(root=".", check=False):
    """Write (or with ``check``, compare) every exercise notebook. Returns the
    paths that were (or would be) changed. ValueError, and nothing written, if a
    solution notebook lacks its ``ringlab`` metadata."""
    root = Path(root)
    texts = {}   # every solution first: one without metadata stops the run before any write
    for sol in sorted((root / "solutions").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in sol.parts:
            continue
        ex = exercise_from_solution(nbformat.read(sol, as_version=4), str(sol))
        texts[root / "exercises" / sol.relative_to(root / "solutions")] = _text(ex)
    changed = [target for target, text in texts.items()
               if not target.exists() or target.read_text() != text]
    if not check:
        for target in changed:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(texts[target])
    return changed
