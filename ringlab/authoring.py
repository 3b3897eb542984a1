"""Exercise notebooks are made from solution notebooks, so the two never drift apart.

In a solution notebook, code between ``# BEGIN SOLUTION`` and ``# END SOLUTION``
is the answer. The exercise gets, in its place, at the same indentation::

    raise NotImplementedError("...")   # your code here

Outputs are stripped from both. ``ringlab make-exercises`` writes
``exercises/X.ipynb`` for every ``solutions/X.ipynb``; ``--check`` only
reports notebooks that would change (the test suite runs it).
"""

import re
from pathlib import Path

import nbformat

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
STUB = 'raise NotImplementedError("your code here")'
_BLOCK = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*(\n|$)",
                    re.M | re.S)


def strip_solution(source):
    """Replace every marked solution block in ``source`` by a stub."""
    if source.count(BEGIN) != source.count(END):
        raise ValueError(f"unbalanced {BEGIN!r}/{END!r} markers in:\n{source}")
    return _BLOCK.sub(lambda m: f"{m.group(1)}{STUB}\n", source)


def exercise_from_solution(nb):
    """The exercise notebook for a solution notebook (a new object)."""
    ex = nbformat.from_dict(nb)
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
    paths that were (or would be) changed."""
    root = Path(root)
    changed = []
    for sol in sorted((root / "solutions").glob("*.ipynb")):
        target = root / "exercises" / sol.name
        text = _text(exercise_from_solution(nbformat.read(sol, as_version=4)))
        if not target.exists() or target.read_text() != text:
            changed.append(target)
            if not check:
                target.parent.mkdir(exist_ok=True)
                target.write_text(text)
    return changed
