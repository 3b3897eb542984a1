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
from .isolated import Submission, runner

FIELDS = ("notebook", "exercise", "result", "cases_passed", "cases_total", "failed_check", "seed",
          "reason", "cell_errors", "seconds")
# Modules that hold reference answers: a submission that refers to them is not the learner's work.
# ringlab's reference code: a submission may not use it, except the packages its
# grader names in ``ALLOWED_REFERENCES`` (Part 2's exercises build on Part 1's
# collectives: ("collectives",)). In data_parallel, the modules that hold the
# reference answers are banned; helpers such as ps_task are not.
# Part 3's reference answers are all of ringlab.tensor_parallel (its layers are the exercises).
# Part 4's are ringlab.pipeline.schedules (one_f_one_b's answer) and .stages
# (pipeline_stage's); its actions and validate are tools for both.
# Part 5's are all of ringlab.zero (ZeRO-1/2/3 steps, their layouts and units).
# ringlab.collectives.hierarchical is hierarchical_allreduce's answer: banned even
# where Part 1's collectives are allowed (it comes first, so that it, not the
# package, is what matches).
REFERENCE = re.compile(r"^ringlab\.(collectives\.hierarchical|collectives|grading"
                       r"|tensor_parallel|zero"
                       r"|data_parallel\.(?:async_ps|sync_sgd|buckets)"
                       r"|pipeline\.(?:schedules|stages))\b"
                       r"|/ringlab/(collectives/hierarchical|collectives|grading"
                       r"|tensor_parallel|zero"
                       r"|data_parallel/(?:async_ps|sync_sgd|buckets)"
                       r"|pipeline/(?:schedules|stages))")
MAX_SUBMISSION = 50 * 2**20

# The cell the grader adds at the end of the notebook. It runs in the learner's
# kernel, so it can be tampered with; all it can change is which bytes are
# graded, and those are treated as untrusted anyway.
EXPORT = """\
def __ringlab_export(names, folder):
    import json, os, cloudpickle
    found = {}
    for exercise, name in names.items():
        f = globals().get(name)
        if not callable(f):
            found[exercise] = {"missing": True}
            continue
        found[exercise] = {"module": str(getattr(f, "__module__", "")),
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


def reference_in(data, allowed=()):
    """The first reference to ringlab's reference code in pickle ``data``, or None.

    ``pickletools.genops`` only parses the opcodes; it runs nothing. A function
    imported from ringlab is pickled by reference ("ringlab.collectives.allreduce",
    "ring_allreduce"); one of its code pickled by value still carries its module
    name and file. Strings are all we need to look at."""
    try:
        for _, arg, _ in pickletools.genops(data):
            match = REFERENCE.search(arg) if isinstance(arg, str) else None
            if match and (match.group(1) or match.group(2)).replace(".", "/") not in allowed:
                return arg
    except Exception:  # noqa: BLE001 - unreadable bytes: the rank processes will say so
        return None
    return None


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


def run_notebook(nb, path, exercises, folder, *, timeout, memory_mb):
    """Execute the notebook, then the export cell. Returns (problem or None,
    cell errors). Only the files the export cell writes are used afterwards."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbformat.v4 import new_code_cell

    import ringlab
    env = {k: v for k, v in os.environ.items() if k != "RINGLAB_GRADE_LOG"}
    # The kernel imports the same ringlab as the grader.
    root = str(Path(ringlab.__file__).resolve().parents[1])
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


def grade_notebook(path, *, timeout=600, memory_mb=512, kernel_memory_mb=4096, seed=None, override=None,
                   executed=None):
    """Grade one notebook; returns its rows (dicts with ``FIELDS``), one per exercise.

    ``executed``: a file to write the notebook to as it ran here, with its outputs
    (what the learner saw; the grade never reads them)."""
    import nbformat
    from .report import grade_cases
    import importlib

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
    try:
        exercises = exercises_of(nb, path, override)
    except ValueError as e:
        row("", "error", str(e))
        return rows

    with tempfile.TemporaryDirectory(prefix="ringlab-grade-") as folder:
        problem, errors = run_notebook(nb, path, exercises, folder, timeout=timeout, memory_mb=kernel_memory_mb)
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
            elif (str(info.get("module", "")).startswith("ringlab.")
                  or reference_in(data, _allowed(exercise))):
                where = reference_in(data, _allowed(exercise)) or info.get("module")
                row(exercise, "failed", f"submitted ringlab's own reference solution ({where})", **common)
            else:
                module = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
                report = grade_cases(exercise, module, Submission(data, name), seed=seed,
                                     runner=runner(memory_mb, banned_modules(exercise)))
                f = report.failure
                result = "passed" if report.passed else "not implemented" if report.not_implemented else "failed"
                row(exercise, result, "" if f is None else f"{f.case}: {f.what}".split("\n")[0][:300],
                    cases_passed=report.cases_passed, cases_total=report.cases_total,
                    failed_check=f.check if f else "", seed=report.seed, text=str(report), **common)
    return rows


# The same modules, for the runtime check in the rank processes (isolated.py):
# a call into one of them while the program runs fails the grade, however the
# program found it (a name built at run time escapes the scan of the bytes).
REFERENCE_MODULES = {"collectives": "ringlab.collectives",
                     "collectives/hierarchical": "ringlab.collectives.hierarchical",
                     "data_parallel/async_ps": "ringlab.data_parallel.async_ps",
                     "data_parallel/sync_sgd": "ringlab.data_parallel.sync_sgd",
                     "data_parallel/buckets": "ringlab.data_parallel.buckets",
                     "tensor_parallel": "ringlab.tensor_parallel",
                     "zero": "ringlab.zero",
                     "pipeline/schedules": "ringlab.pipeline.schedules",
                     "pipeline/stages": "ringlab.pipeline.stages"}


def banned_modules(exercise):
    """The reference modules ``exercise``'s submissions may not call."""
    allowed = _allowed(exercise)
    # A package named in ALLOWED_REFERENCES is allowed, but not its modules named
    # with a "/" here, unless the grader names that module itself ("pipeline/schedules").
    modules = tuple(m for key, m in REFERENCE_MODULES.items() if key not in allowed
                    and (key.split("/")[0] not in allowed or "/" in key))
    # A grader module that computes right answers (for its diagnoses) names them in
    # ANSWERS: they are banned one by one, since its driver runs in the rank.
    grader = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
    answers = getattr(grader, "ANSWERS", ())
    return modules + ((f"{grader.__name__}:{','.join(answers)}",) if answers else ())


def _allowed(exercise):
    """The reference packages ``exercise``'s grader lets a submission use."""
    import importlib
    module = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
    return tuple(getattr(module, "ALLOWED_REFERENCES", ()))


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
