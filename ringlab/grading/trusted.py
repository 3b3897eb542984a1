"""Trusted grading of notebooks: what ``ringlab grade NOTEBOOK...`` does.

Nothing a notebook prints, logs or claims is believed. For each notebook:

1. Which exercises it is for comes from the notebook's ``ringlab`` metadata
   (``{"exercises": {exercise id: function name}}``, which the solution
   notebooks carry and ``ringlab make-exercises`` copies), else from its file
   name (``01_ring_allreduce.ipynb``), or from the instructor (``--exercise``);
   never from what its cells do.
2. The notebook runs in a kernel of its own (a separate process, with a time
   limit per cell and a memory limit), as the learner ran it.
3. One more cell, added by the grader, serializes each exercise's function
   *by value* with cloudpickle into a folder the grader chose. The bytes are
   untrusted: the grading process never unpickles them.
4. The grader looks at the bytes for ringlab's own reference code, then
   grades them here with ``run_isolated`` (one process per rank).

Whatever goes wrong (no such file, a corrupt notebook, a cell that never
ends, a kernel that dies), the notebook gets one row per exercise saying why.
"""

from __future__ import annotations

import importlib
import json
import os
import pickletools
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

from . import GRADERS
from ..backends.isolated import Submission, runner

FIELDS = ("notebook", "exercise", "result", "cases_passed", "cases_total", "failed_check", "seed",
          "reason", "cell_errors", "seconds")
MAX_SUBMISSION = 50 * 2**20

# The cell the grader adds at the end of the notebook. It runs in the learner's
# kernel, so it can be tampered with; all it can change is which bytes are
# graded, and those are treated as untrusted anyway.
EXPORT = """\
def __ringlab_export(names, folder):
    import json, os, sys, cloudpickle
    # Modules of the notebook's own folder (a helper the learner wrote next to
    # it) travel with the function, by value: the ranks run elsewhere.
    here = os.path.abspath(os.getcwd()) + os.sep
    for module in list(sys.modules.values()):
        path = os.path.abspath(getattr(module, "__file__", None) or "/")
        if path.startswith(here) and getattr(module, "__name__", "") != "__main__":
            try:
                cloudpickle.register_pickle_by_value(module)
            except Exception:
                pass
    found = {}
    for exercise, name in names.items():
        f = globals().get(name)
        if not callable(f):
            found[exercise] = {"missing": True}
            continue
        found[exercise] = {"module": str(getattr(f, "__module__", "")),
                           "name": str(getattr(f, "__qualname__", "")),
                           "file": str(getattr(getattr(f, "__code__", None), "co_filename", ""))}
        try:
            data = cloudpickle.dumps(f)
        except Exception as e:
            found[exercise]["error"] = f"{type(e).__name__}: {e}"
            continue
        with open(os.path.join(folder, exercise + ".pkl"), "wb") as out:
            out.write(data)
    with open(os.path.join(folder, "found.json"), "w") as out:
        json.dump(found, out)
__ringlab_export(%r, %r)
del __ringlab_export
"""


def exercises_of(nb, path, override=None):
    """``{exercise id: function name}`` for a notebook; ValueError if unknown."""
    if override:
        return dict(override)
    meta = nb.metadata.get("ringlab", {}).get("exercises") if isinstance(nb.metadata.get("ringlab"), dict) else None
    if isinstance(meta, dict) and meta:
        bad = [e for e in meta if e not in GRADERS]
        if bad or not all(isinstance(v, str) and v.isidentifier() for v in meta.values()):
            raise ValueError(f"the notebook's ringlab metadata names unknown exercises {bad}")
        return dict(meta)
    stem = re.sub(r"^\d+_", "", Path(path).stem)
    if stem in GRADERS:
        return {stem: stem}
    raise ValueError("cannot tell which exercise this notebook is for (no ringlab metadata, and its "
                     "file name is no exercise id); pass --exercise ID")


def reference_in(data, banned=None):
    """What in pickle ``data`` is not the learner's own: words naming the first
    of ringlab's ``banned`` answers (``module:qualname``; None: every answer)
    or of the grader's functions that the bytes refer to, or None.

    ``pickletools.genops`` only parses the opcodes; it runs nothing. A function
    imported from ringlab is pickled by reference: its module and name, pushed
    as two strings before a ``STACK_GLOBAL`` (or in one ``GLOBAL``). Helpers
    (``ringlab.zero.sharding.padded_size``) are allowed; answers are not. What
    the bytes cannot show (a name built at run time) the rank processes catch."""
    from .. import answers
    if banned is None:
        _import_every_answer()
    named = set(answers.forbidden(None) if banned is None else banned)
    recent, memo = [None, None], {}     # the last two values pushed (strings, else None)
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):    # store, push nothing
                memo[len(memo) if name == "MEMOIZE" else arg] = recent[-1]
                continue
            if name in ("GET", "BINGET", "LONG_BINGET"):
                recent = [recent[-1], memo.get(arg)]
                continue
            if name == "GLOBAL" and isinstance(arg, str):
                module, _, name = arg.partition(" ")
            elif name == "STACK_GLOBAL" and None not in recent:
                module, name = recent
            else:
                recent = [recent[-1], arg if isinstance(arg, str) else None]
                continue
            recent = [recent[-1], None]
            if f"{module}:{name}" in named:
                exercises = ", ".join(answers.answers_of(_resolve(module, name)))
                return f"submitted ringlab's own answer to {exercises} ({module}.{name})"
            if module == __package__ or module.startswith(__package__ + "."):
                return (f"the program refers to ringlab's grader ({module}.{name}), which a "
                        f"submission may not use")
    except Exception:  # noqa: BLE001 - unreadable bytes: the rank processes will say so
        return None
    return None


def _resolve(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _kernel_manager(tmp, memory_mb):
    """A kernel over local sockets (IPC), not TCP: no open port, and no
    "Kernel is running over TCP without encryption" warning per notebook.
    Its command is wrapped so the kernel process starts with a memory limit."""
    from jupyter_client import AsyncKernelManager

    class Limited(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            return [sys.executable, "-m", "ringlab.grading.trusted", "--limit-mb", str(memory_mb), "--", *cmd]

    return Limited(kernel_name="python3", transport="ipc", ip=str(Path(tmp) / "kernel"))


def run_notebook(nb, path, exercises, folder, *, timeout, memory_mb, lang="en"):
    """Execute the notebook, then the export cell. Returns (problem or None,
    cell errors). Only the files the export cell writes are used afterwards.
    ``lang``: the language of the reports its grading cells show."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbformat.v4 import new_code_cell

    env = {k: v for k, v in os.environ.items() if k != "RINGLAB_GRADE_LOG"}
    env["RINGLAB_LANG"] = lang
    # The kernel imports the same ringlab as the grader: the folder that holds it.
    root = str(Path(__file__).resolve().parents[len(__package__.split("."))])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    client = NotebookClient(nb, km=_kernel_manager(folder, memory_mb), timeout=timeout,
                            allow_errors=True, shutdown_kernel="immediate", resources={"metadata": {"path": str(Path(path).parent)}})
    index, problem = 0, None
    try:
        with client.setup_kernel(env=env, cleanup_kc=True):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type == "code":
                    client.execute_cell(cell, index)
            index = len(nb.cells)
            nb.cells.append(new_code_cell(EXPORT % (exercises, str(folder)), metadata={"ringlab_export": True}))
            client.execute_cell(nb.cells[index], index)
    except CellTimeoutError:
        problem = f"cell {index + 1} did not finish within {timeout} s"
    except DeadKernelError:
        problem = f"the kernel died in cell {index + 1} (os._exit? out of memory?)"
    except Exception as e:  # noqa: BLE001 - any failure to run is a row, not a crash
        problem = f"the notebook could not be run: {type(e).__name__}: {e}"
    export_cell = len(nb.cells) > 0 and nb.cells[-1].metadata.get("ringlab_export")
    if export_cell:
        nb.cells.pop()     # the grader's cell is no part of the learner's notebook
    errors = [f"cell {i + 1} raised {o.get('ename')}: {o.get('evalue')}"
              for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if problem and export_cell:
        problem = problem.replace(f"cell {index + 1}", "the grader's export cell")
    return problem, errors


def prepare():
    """Before a learner's notebook runs: every module of ringlab imported here
    (the graders, their kit, the answers), and the ranks' forkserver started
    with them loaded. A notebook's code runs with the grader's rights; were a
    module first imported after it, the notebook could have rewritten its file
    (a red team made a grader's check() return None that way)."""
    from ..backends.isolated import server, start_forkserver
    for name in server._every_module():
        importlib.import_module(name)
    start_forkserver()


def grade_notebook(path, *, timeout=600, memory_mb=512, kernel_memory_mb=4096, seed=None, override=None,
                   executed=None, lang=None):
    """Grade one notebook; returns its rows (dicts with ``FIELDS``), one per exercise.

    ``executed``: a file to write the notebook to as it ran here, with its outputs
    (what the learner saw; the grade never reads them). ``lang``: the language of
    each row's ``text`` and of the reports in the notebook (``kit/language.py``;
    default: the notebook's ``ringlab`` metadata ``lang``, else ``$RINGLAB_LANG``);
    ``reason`` and ``failed_check`` stay English, for an instructor's tables."""
    import nbformat
    from .kit.language import LANGUAGES, language

    prepare()
    start = time.monotonic()
    rows = []

    def row(exercise, result, reason="", **more):
        rows.append({"notebook": str(path), "exercise": exercise, "result": result, "reason": reason,
                     "seconds": round(time.monotonic() - start, 2), **more})

    try:
        nb = nbformat.read(path, as_version=4)
    except FileNotFoundError:
        row("", "error", "no such file")
        return rows
    except Exception as e:  # noqa: BLE001 - truncated JSON, not a notebook, ...
        row("", "error", f"not a readable notebook: {type(e).__name__}: {str(e)[:200]}")
        return rows
    # --lang, else the notebook's own (a Chinese exercise notebook says "zh"), else $RINGLAB_LANG
    meta = nb.metadata.get("ringlab") if isinstance(nb.metadata.get("ringlab"), dict) else {}
    lang = language(lang or (meta.get("lang") if meta.get("lang") in LANGUAGES else None))
    try:
        exercises = exercises_of(nb, path, override)
    except ValueError as e:
        row("", "error", str(e))
        return rows

    with tempfile.TemporaryDirectory(prefix="ringlab-grade-") as folder:
        problem, errors = run_notebook(nb, path, exercises, folder, timeout=timeout, memory_mb=kernel_memory_mb,
                                       lang=lang)
        if executed:
            Path(executed).parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, executed)
        found = _read_json(Path(folder) / "found.json")
        for exercise, name in exercises.items():
            info = found.get(exercise) if isinstance(found.get(exercise), dict) else {}
            blob = Path(folder) / f"{exercise}.pkl"
            data = blob.read_bytes() if blob.is_file() and blob.stat().st_size <= MAX_SUBMISSION else None
            common = {"cell_errors": " | ".join(errors)}
            if problem:
                row(exercise, "error", problem, **common)
            elif data is None:
                why = info.get("error") or f"the notebook defines no function {name}(comm, ...)"
                row(exercise, "failed", why, **common)
            elif not_their_own(info, data, exercise):
                row(exercise, "failed", not_their_own(info, data, exercise), **common)
            else:
                row(exercise, **_graded(exercise, Submission(data, name), seed, memory_mb, lang),
                    **common)
    return rows


def _graded(exercise, submission, seed, memory_mb, lang):
    """A row's ``result``, ``reason`` and report fields for one submission, graded in
    processes of its own."""
    from .kit.loop import grade_cases
    report = grade_cases(exercise, grader_module(exercise), submission, seed=seed,
                         runner=runner(memory_mb, banned_answers(exercise)))
    report.lang = lang
    f = report.failure
    result = ("passed" if report.passed else "not implemented" if report.not_implemented
              else "failed")
    reason = "" if f is None else f"{f.case}: {f.what}".split("\n")[0][:300]
    return dict(result=result, reason=reason, cases_passed=report.cases_passed,
                cases_total=report.cases_total, failed_check=f.check if f else "",
                seed=report.seed, text=str(report))


def banned_answers(exercise):
    """The answers a submission for ``exercise`` may not call (``module:qualname``):
    all but those of the exercises its grader ``USES`` (an exercise id, or a
    part: all of its exercises), and its own. See ``ringlab.answers``."""
    from .. import answers
    _import_every_answer()
    uses = set()
    for u in getattr(grader_module(exercise), "USES", ()):
        uses |= {u} if u in GRADERS else {e for e, m in GRADERS.items() if m.split(".")[0] == u}
    return answers.forbidden(exercise, uses)


def _import_every_answer():
    """Import every module that holds answers: the registry holds what was imported."""
    from .. import collectives, data_parallel, pipeline, tensor_parallel, zero  # noqa: F401
    from ..data_parallel import async_ps  # noqa: F401
    from ..frontier import blockwise, expert_parallel, hsdp, ring_attention  # noqa: F401
    from ..pipeline import schedules, stages  # noqa: F401
    from ..zero import zero1, zero2, zero3  # noqa: F401
    for exercise in GRADERS:            # a grader may hold answers of its own
        grader_module(exercise)


def grader_module(exercise):
    return importlib.import_module(f"{__package__}.{GRADERS[exercise]}")


def not_their_own(info, data, exercise):
    """Why the function exported for ``exercise`` is not the learner's own
    (words for the report), or None."""
    banned = banned_answers(exercise)
    module = str(info.get("module", ""))
    if module.startswith("ringlab.") and info.get("name"):
        if f"{module}:{info['name']}" in banned:
            return reference_in(data, banned) or f"submitted ringlab's own answer ({module})"
        return f"submitted ringlab's function {module}.{info['name']}, not a function of your own"
    return reference_in(data, banned)


def _read_json(path):
    try:
        value = json.loads(path.read_text()[:1_000_000])
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _limited_exec(argv):
    """``python -m ringlab.grading.trusted --limit-mb MB -- CMD...``: run CMD
    with at most MB of address space (the kernel, for a memory hog in a cell)."""
    mb, cmd = int(argv[1]), argv[3:]
    limit = mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    _limited_exec(sys.argv[1:])
