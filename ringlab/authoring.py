"""Exercise notebooks are made from solution notebooks, so the two never drift apart.

In a solution notebook, code between ``# BEGIN SOLUTION`` and ``# END SOLUTION``
is the answer. The exercise gets, in its place, at the same indentation::

    raise NotImplementedError("...")   # your code here

Outputs are stripped from both. ``ringlab make-exercises`` writes
``exercises/<part>/X.ipynb`` for every ``solutions/<part>/X.ipynb`` (and its Chinese
twin and catalog, below); ``--check`` only
reports notebooks that would change (the test suite runs it).

Each exercise has a Chinese twin, ``exercises/<part>/zh/X.ipynb``: the same cells, its
statements (the markdown cells) from the catalog
``locales/zh_CN/LC_MESSAGES/exercises/<part>/X.po`` (one message per cell, which
``make-exercises`` keeps in step with the English: a changed cell turns fuzzy, and
reads English until its Chinese is brought up to date), and a first cell that asks
for reports in Chinese.

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


def chinese_twin(exercise):
    """Where the Chinese twin of the exercise notebook at ``exercise`` lives."""
    exercise = Path(exercise)
    return exercise.parent / "zh" / exercise.name


# The Chinese twin's first cell: ringlab.grade writes its reports in Chinese.
CHINESE_SETUP = 'import os\n\nos.environ["RINGLAB_LANG"] = "zh"   # 评分报告使用中文'


def chinese_exercise(ex, translations):
    """The Chinese twin of the exercise notebook ``ex`` (a new object): each markdown
    cell replaced by its Chinese from ``translations`` ({English cell: Chinese}; a
    cell without one stays English), ``CHINESE_SETUP`` first, ``"lang": "zh"`` in its
    ``ringlab`` metadata. Code cells stay as they are."""
    zh = nbformat.from_dict(ex)
    zh.metadata["ringlab"] = {**ex.metadata["ringlab"], "lang": "zh"}
    for cell in zh.cells:
        if cell.cell_type == "markdown" and translations.get(cell.source):
            cell.source = translations[cell.source]
    zh.cells.insert(0, nbformat.v4.new_code_cell(CHINESE_SETUP))
    zh.cells[0].id = "zh-setup"             # a fixed id: the same text at every run
    return zh


def _catalog_text(ex, old):
    """The catalog of the exercise ``ex``'s markdown cells, as .po text: the
    translations of ``old`` (a catalog's text, or None) carried over, a changed cell's
    marked fuzzy (babel's merge), no header (so that the text changes only with the
    cells). Returns (text, {English cell: Chinese} of the current, not fuzzy, ones)."""
    from io import BytesIO

    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po, write_po
    template = Catalog(locale="zh_CN")
    for cell in ex.cells:
        if cell.cell_type == "markdown" and cell.source.strip():
            template.add(cell.source)
    catalog = read_po(BytesIO(old.encode())) if old else Catalog(locale="zh_CN")
    catalog.update(template)
    out = BytesIO()
    write_po(out, catalog, width=76, omit_header=True, ignore_obsolete=False)
    done = {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}
    return out.getvalue().decode(), done


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
        where = sol.relative_to(root / "solutions")
        texts[root / "exercises" / where] = _text(ex)
        po = root / "locales" / "zh_CN" / "LC_MESSAGES" / "exercises" / where.with_suffix(".po")
        texts[po], chinese = _catalog_text(ex, po.read_text("utf-8") if po.exists() else None)
        texts[chinese_twin(root / "exercises" / where)] = _text(chinese_exercise(ex, chinese))
    changed = [target for target, text in texts.items()
               if not target.exists() or target.read_text("utf-8") != text]
    if not check:
        for target in changed:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(texts[target], "utf-8")
    return changed
