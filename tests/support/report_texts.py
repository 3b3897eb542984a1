"""The English texts the graders write into reports, read from their source: the
templates ``ringlab/grading/kit/zh_CN.json`` must translate.

A text is a string literal or f-string that reaches a report field (case, check, what,
expected, got, hint):

* an argument of that name to any call: ``Failure``, or a kit helper that passes it on
  (``checks.exact_steps(..., check=..., hint=...)``, ``dict(check=..., hint=...)``);
* a positional argument of a graders' function whose parameter has such a name, or
  ends in ``hint`` (``report_problem(check, what, hint)``, ``steps_before_failure(...,
  hint)``), or the default of such a parameter; a Case object's ``case`` is no text;
* ``Case``'s label, or a value bound to a name ending in ``HINT``.

A module's string constant given so (``hint=RECV_ANY``, ``"..." + RECV_ANY``, one
imported from another grader module) counts by its value. An f-string's replacement
fields become ``{}`` and its literal braces ``{{ }}``, as in the catalog; ``a if c
else b`` gives both, inside a ``+`` too. Texts joined with another value (``tr.p.hint +
" ..."``), or made elsewhere and passed in by a local name, are not found here: the
grader tests' reports check those (tests/programs/reports.py).
"""

import ast
from pathlib import Path

import ringlab.grading

GRADING = Path(ringlab.grading.__file__).parent
FIELDS = ("case", "check", "what", "expected", "got", "hint")
# Parameters of the graders' own functions that take a report text, besides FIELDS.
TEXT_PARAMS = ("check_name", "hub_text")


def is_text_param(name):
    return name in FIELDS or name in TEXT_PARAMS or name.endswith("hint")


def template(node, constants=None):
    """The catalog templates of a string expression (two for ``a if c else b``), or
    None if it is not made only of strings and the module's string ``constants``."""
    constants = constants or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value.replace("{", "{{").replace("}", "}}")]
    if isinstance(node, ast.JoinedStr):
        return ["".join(template(v)[0] if isinstance(v, ast.Constant) else "{}"
                        for v in node.values)]
    if isinstance(node, ast.Name) and node.id in constants:
        return template(constants[node.id])
    if isinstance(node, ast.IfExp):
        found = [t for n in (node.body, node.orelse) for t in template(n, constants) or []]
        return found or None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left, constants), template(node.right, constants)
        return None if left is None or right is None else [a + b for a in left for b in right]
    return None


def worth_translating(text):
    """A template with words in it: not only fields, numbers and punctuation."""
    fixed = "".join(ch for ch in text.replace("{}", "") if ch.isalpha())
    return len(fixed) >= 3


def _constants(tree):
    """A module's string constants: {name: value node} of its top-level assignments."""
    return {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)
            and template(node.value) is not None}


def _functions(tree):
    """{name: [parameter names, self left out]} of a module's functions and methods."""
    return {node.name: [a.arg for a in node.args.posonlyargs + node.args.args
                        if a.arg != "self"]
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def _imports(path, tree):
    """{name: (module path, its name there, or None for the module itself)} of what a
    module imports from the graders' other modules (relative imports)."""
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = path.parents[node.level - 1] / (node.module or "").replace(".", "/")
        if GRADING not in (base, *base.parents):
            continue
        for a in node.names:
            module, there = base / f"{a.name}.py", base.with_suffix(".py")
            if module.exists():
                found[a.asname or a.name] = (module, None)
            else:
                found[a.asname or a.name] = (there if there.exists() else base / "__init__.py",
                                             a.name)
    return found


def texts():
    """{template: "file:line"} of every report text in the graders' source."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8"))
             for path in sorted(GRADING.rglob("*.py"))}
    functions = {path: _functions(tree) for path, tree in trees.items()}
    module_constants = {path: _constants(tree) for path, tree in trees.items()}
    found = {}

    def add(node, where, constants):
        for t in template(node, constants) or []:
            if worth_translating(t):
                found.setdefault(t, where)

    for path, tree in trees.items():
        imports = _imports(path, tree)
        # Its own constants, and those it imports from another grader module.
        constants = {alias: module_constants[m][name] for alias, (m, name) in imports.items()
                     if name is not None and name in module_constants.get(m, {})}
        constants.update(module_constants[path])

        def signature(func):
            """The parameter names of the graders' function ``func`` calls, or None:
            one of this module's (``self.fail`` too), or one imported, or one of an
            imported module's (``checks.exact_steps``)."""
            if isinstance(func, ast.Name):
                if func.id in functions[path]:
                    return functions[path][func.id]
                module, name = imports.get(func.id, (None, None))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if func.value.id == "self":
                    return functions[path].get(func.attr)
                module, whole = imports.get(func.value.id, (None, "not a module"))
                name = func.attr if whole is None else None
            else:
                return None
            return functions.get(module, {}).get(name)

        for node in ast.walk(tree):
            where = f"{path.relative_to(GRADING)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                keywords = ("label",) if name == "Case" else FIELDS
                for k in node.keywords:
                    if k.arg in keywords:
                        add(k.value, where, constants)
                params = (FIELDS if name == "Failure" else (None, None, "label") if name == "Case"
                          else [p if p != "case" else None for p in signature(node.func) or ()])
                for param, arg in zip(params, node.args):
                    if param == "label" or param is not None and is_text_param(param):
                        add(arg, where, constants)
            elif isinstance(node, ast.FunctionDef):
                a = node.args
                positional = a.posonlyargs + a.args
                for param, default in [*zip(positional[len(positional) - len(a.defaults):],
                                            a.defaults),
                                       *zip(a.kwonlyargs, a.kw_defaults)]:
                    if default is not None and is_text_param(param.arg):
                        add(default, where, constants)
            elif isinstance(node, ast.Assign) and any(
                    getattr(t, "id", "").endswith("HINT") for t in node.targets):
                add(node.value, where, constants)
    return found
