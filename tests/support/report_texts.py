"""The English texts the graders write into reports, read from their source: the
templates ``ringlab/grading/kit/zh_CN.json`` must translate.

A text is a string literal or f-string given to ``Failure`` (case, check, what,
expected, got, hint), to ``Case`` as its label, or bound to a name ending in ``HINT``;
an f-string's replacement fields become ``{}`` and its literal braces ``{{ }}``, as in
the catalog. Texts made elsewhere and passed in by name are not found here: the
grader tests' reports check those (tests/programs/reports.py).
"""

import ast
from pathlib import Path

import ringlab.grading

GRADING = Path(ringlab.grading.__file__).parent
FIELDS = ("case", "check", "what", "expected", "got", "hint")


def template(node):
    """The catalog template of a string node, or None if it is not a plain string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if isinstance(node, ast.JoinedStr):
        return "".join(template(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        return None if left is None or right is None else left + right
    return None


def worth_translating(text):
    """A template with words in it: not only fields, numbers and punctuation."""
    fixed = "".join(ch for ch in text.replace("{}", "") if ch.isalpha())
    return len(fixed) >= 3


def texts():
    """{template: "file:line"} of every report text in the graders' source."""
    found = {}

    def add(node, where):
        nodes = [node.body, node.orelse] if isinstance(node, ast.IfExp) else [node]
        for n in nodes:
            t = template(n)
            if t is not None and worth_translating(t):
                found.setdefault(t, where)

    for path in sorted(GRADING.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            where = f"{path.relative_to(GRADING)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name == "Failure":
                    for arg in [*node.args, *(k.value for k in node.keywords if k.arg in FIELDS)]:
                        add(arg, where)
                elif name == "Case":
                    for arg in [*node.args[2:3], *(k.value for k in node.keywords if k.arg == "label")]:
                        add(arg, where)
            elif isinstance(node, ast.Assign) and any(
                    getattr(t, "id", "").endswith("HINT") for t in node.targets):
                add(node.value, where)
    return found
