"""The learner's path, for every exercise notebook, as a learner and an instructor meet it.

Each notebook is copied to ``student.ipynb`` (a learner renames files; the grader
must know the exercise from the notebook's metadata) and graded once by
``ringlab grade student.ipynb --executed DIR``: that runs it top to bottom in a
kernel with nbclient, as nbval does, and writes it with its outputs. One run
gives the grade, what the learner reads, and nbval's check (every cell runs and
none raises: `make test` runs no nbval of its own):

* unsolved (``exercises/``): graded ``not implemented``; every Try-it cell prints
  exactly "not implemented yet", every grading cell the report's "not implemented
  yet" line, and nothing prints an error;
* solved (``solutions/``): graded ``passed``, exit code 0; every grading cell
  prints "All test cases passed!", and every Try-it cell prints what its text says
  it shows: the values in ``TRY_IT`` below, worked out here from the inputs the
  cell states, and differences within the tolerance its text states.
"""

import ast
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook
from traitlets.config import Config

from ringlab import cli
from ringlab.authoring import STUB
from ringlab.grading import Report

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").rglob("[0-9]*.ipynb"))
STEMS = sorted(s.stem for s in SOLUTIONS)
PART = {s.stem: s.parent.name for s in SOLUTIONS}      # the part's folder of each notebook
NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?")
ERRORS = ("Traceback", "Error", "error:")


# -- running a notebook as a learner's ---------------------------------------------------------

@pytest.fixture
def grade_renamed(tmp_path, monkeypatch, capsys):
    """``ringlab grade student.ipynb`` on a copy of a notebook: (exit code, what it
    printed, its rows, the notebook as it ran). The command's own ``main``, in this
    process: the code of ``python -m ringlab.cli`` without a Python start per notebook
    (test_notebooks.py runs the command itself)."""
    def grade(notebook):
        shutil.copy(notebook, tmp_path / "student.ipynb")
        monkeypatch.chdir(tmp_path)
        exit_code = cli.main(["grade", "student.ipynb", "--json", "rows.json", "--executed", "ran"])
        printed = capsys.readouterr().out
        rows = json.loads((tmp_path / "rows.json").read_text())
        return exit_code, printed, rows, nbformat.read(tmp_path / "ran" / "student.ipynb", as_version=4)
    return grade


def text_of(cell):
    """What a code cell printed or showed as text, errors included."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback) + f"\n{out.ename}: {out.evalue}")
        else:
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts).strip()


def sections(nb, title):
    """[(the heading's markdown, [its code cells])] for every heading that says ``title``."""
    found, current = [], None
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            current = (cell.source, []) if title in cell.source.splitlines()[0] else None
            if current:
                found.append(current)
        elif cell.cell_type == "code" and current:
            current[1].append(cell)
    return found


def graded_exercise(cells):
    """The exercise id a grading section grades (its ``ringlab.grade("id", ...)``)."""
    ids = re.findall(r"ringlab\.grade\(\s*[\"'](\w+)[\"']", "\n".join(c.source for c in cells))
    assert len(ids) == 1, f"a grading section grades one exercise, not {ids}"
    return ids[0]


def common_checks(nb, rows, expected_result):
    exercises = nb.metadata.ringlab.exercises
    assert [(r["exercise"], r["result"]) for r in rows] == [(e, expected_result) for e in exercises], rows
    assert all(not r["cell_errors"] for r in rows), rows
    code = [c for c in nb.cells if c.cell_type == "code"]
    # what nbval --nbval-lax checks (`make notebooks`; `make test` runs each notebook here only):
    # every code cell ran, in order, and none raised
    ran = [c.execution_count for c in code if c.source.strip()]
    assert None not in ran and ran == sorted(ran), "a cell did not run"
    assert all(o.output_type != "error" for c in code for o in c.outputs), "a cell raised"
    try_it, grading = sections(nb, "Try it"), sections(nb, "Grade it")
    assert len(try_it) == len(grading) == len(exercises), "one Try-it and one grading section per exercise"
    assert sorted(graded_exercise(cells) for _, cells in grading) == sorted(exercises)
    assert all(cells for _, cells in try_it), "a Try-it section without code"
    return code, try_it, grading


# -- unsolved -------------------------------------------------------------------------------------

@pytest.mark.parametrize("stem", STEMS)
def test_unsolved_notebook_says_not_implemented_and_nothing_else(stem, grade_renamed):
    exit_code, printed, rows, nb = grade_renamed(ROOT / "exercises" / PART[stem] / f"{stem}.ipynb")
    assert exit_code == 1 and printed.rstrip().endswith("FAILED"), printed
    code, try_it, grading = common_checks(nb, rows, "not implemented")
    for _, cells in try_it:
        assert [text_of(c) for c in cells if text_of(c)] == ["not implemented yet"]
    report_lines = set()
    for _, cells in grading:
        line = str(Report(graded_exercise(cells), passed=False, seed=0, not_implemented=True))
        assert [text_of(c) for c in cells if text_of(c)] == [line]
        report_lines.add(line)
    for cell in code:            # the report's line names `raise NotImplementedError`: only it may
        text = text_of(cell)
        if text not in report_lines:
            assert not any(word in text for word in ERRORS), text


# -- solved ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("stem", STEMS)
def test_solved_notebook_prints_its_numbers_and_passes(stem, grade_renamed):
    exit_code, printed, rows, nb = grade_renamed(ROOT / "solutions" / PART[stem] / f"{stem}.ipynb")
    assert exit_code == 0 and printed.rstrip().endswith("PASSED"), printed
    code, try_it, grading = common_checks(nb, rows, "passed")
    for cell in code:
        assert not any(word in text_of(cell) for word in ERRORS), text_of(cell)
    for _, cells in grading:
        assert text_of(cells[-1]).startswith(f"{graded_exercise(cells)} results: All test cases passed!")
    checks = TRY_IT[stem]
    assert len(checks) == len(try_it)
    for (heading, cells), check in zip(try_it, checks):
        text = "\n".join(text_of(c) for c in cells)
        assert text and "not implemented" not in text
        within_stated_tolerance(heading, text)
        check(text)


def within_stated_tolerance(heading, text):
    """Every "largest difference ...: d" the cell prints is below the tolerance its text
    states ("below 1e-10"); a cell that prints differences states one."""
    stated = re.findall(r"below (\d(?:\.\d+)?e-\d+)", heading)
    differences = [float(v) for v in re.findall(r"^largest difference[^:]*:\s*(\S+)$", text, re.M)]
    assert bool(stated) == bool(differences), (heading, text)
    if differences:
        assert len(stated) == 1 and max(differences) <= float(stated[0]), (stated, differences)


# -- what each Try-it cell must show --------------------------------------------------------------

def rank_lines(text):
    """{rank: the numbers on its line} from ``try_run``'s "rank r: ..." lines."""
    return {int(r): [float(v) for v in NUMBER.findall(rest)]
            for r, rest in re.findall(r"^rank (\d+): (.*)$", text, re.M)}


def after(label, text):
    """What follows "label:" on its line."""
    found = re.findall(rf"^{re.escape(label)}:\s*(.*)$", text, re.M)
    assert len(found) == 1, f"no single line {label!r} in:\n{text}"
    return found[0]


def message_sizes(text):
    """{step: [nbytes of each message]} from the trace table ``try_run`` prints."""
    sizes = {}
    for step, nbytes in re.findall(r"^\s*(\d+)\s+\d+\s+\d+\s+\S+\s+\S+\s+(\d+)\s*$", text, re.M):
        sizes.setdefault(int(step), []).append(int(nbytes))
    return sizes


def all_of(*checks):
    def check(text):
        for c in checks:
            c(text)
    return check


def ranks_hold(want):
    def check(text):
        assert rank_lines(text) == {r: [float(v) for v in vs] for r, vs in want.items()}, text
    return check


def says(*lines):
    def check(text):
        for line in lines:
            assert re.search(rf"^{re.escape(line)}$", text, re.M), f"{line!r} not in:\n{text}"
    return check


def is_true(label):
    return says(f"{label}: True")


def bytes_per_rank(want):
    def check(text):
        assert ast.literal_eval(after("bytes sent per rank", text)) == want, text
    return check


def first_collectives(want):
    """The list of span names the ZeRO cells print: rank 0's first collectives."""
    def check(text):
        assert ast.literal_eval(text.splitlines()[-1]) == want, text
    return check


def ring_alltoall_sizes(text):
    # step k forwards the 4 - k blocks still travelling, 8 bytes each
    assert message_sizes(text) == {k: [8 * (4 - k)] * 4 for k in (1, 2, 3)}


def buckets_overlap(text):
    mine, flat = map(float, re.findall(r"([\d.]+) us", after("step", text)))
    assert mine < flat, text        # the buckets' AllReduces run under backward


def staleness_bound(text):
    assert "12 gradients applied" in text
    assert len(ast.literal_eval(after("staleness per update", text))) == 12
    assert int(after("largest clock gap", text)) <= 1, text       # s = 1


def one_f_one_b_picture(text):
    rows = re.findall(r"^rank (\d): (.*)$", text, re.M)
    assert len(rows) == 4
    for _, row in rows:            # every microbatch forward and backward, once each
        assert sorted(row.split()) == sorted(["."] * row.split().count(".")
                                             + [f"{k}{i}" for k in "FB" for i in range(8)])
    assert ast.literal_eval(after("microbatches held at once, per rank", text)) == [4 - r for r in range(4)]


def sync_sgd_bytes(text):
    # 20 steps of one AllReduce of the [4, 16, 2] MLP's 4*16+16 + 16*2+2 = 114 gradients
    assert sum(ast.literal_eval(after("bytes sent per rank", text))) == 20 * sum(allreduce_bytes(4, 114))


def hierarchical_bytes(text):
    # 2(M-1)/M x n/G x 8 = 16 bytes across nodes from every GPU
    assert ast.literal_eval(after("bytes each GPU sent to other nodes", text)) == [16] * 8, text


def hierarchical_time(text):
    took, closed = map(float, re.findall(r"([\d.]+) us", after("time", text)))
    assert abs(took - closed) <= 1e-4, text


def moe_dispatch_bytes(text):
    # 4 ranks, 8 experts, top-2, 6 tokens each, capacity 2 per expert and rank; d = 3:
    # each rank sends 3 messages of 2 counts (16 bytes), then 3 x 8 = 24 bytes per row
    per_expert = ast.literal_eval(after("tokens per expert", text))
    kept, total = map(int, re.fullmatch(r"(\d+) of (\d+)", after("assignments kept", text)).groups())
    assert len(per_expert) == 8 and max(per_expert) <= 4 * 2 and sum(per_expert) == kept <= total == 48
    assert ast.literal_eval(after("count messages per rank", text)) == [3] * 4
    rows = ast.literal_eval(after("rows sent per rank (tokens out, outputs back)", text))
    assert sum(rows) % 2 == 0 and sum(rows) <= 2 * kept      # each row out once, back once
    assert ast.literal_eval(after("bytes sent per rank", text)) == [3 * 16 + 24 * r for r in rows]
def hsdp_across_nodes(text):
    # [4, 8, 8, 2]: units of 4*8+8, 8*8+8, 8*2+2 = 40, 72, 18 numbers; 2 nodes x 2 ranks
    R, S, N, units = 2, 2, 4, [40, 72, 18]
    psi = sum(-(-u // S) * S for u in units)                   # 130
    psi_all = sum(-(-u // N) * N for u in units)               # 132, padded for ZeRO-3
    assert int(after("bytes across nodes per step", text)) == 2 * (R - 1) * psi * 8
    assert int(after("ZeRO-3 on all 4 ranks, bytes across nodes per step", text)) == \
        3 * R * (N - 1) * psi_all * 8 // N


def allreduce_bytes(t, elements, count=1):
    """Bytes each rank sends in ``count`` ring AllReduces of ``elements`` float64 over t ranks."""
    return [round(count * 2 * (t - 1) / t * elements * 8)] * t


# One list per notebook, one check per Try-it section, from the inputs each cell states.
TRY_IT = {
    "01_ring_allreduce": [all_of(ranks_hold({r: [6] * 6 for r in range(4)}),
                                 says("24 messages in 6 steps:"))],
    "02_ring_allgather": [all_of(ranks_hold({r: [0, 1, 10, 11, 20, 21, 30, 31] for r in range(4)}),
                                 says("12 messages in 3 steps:"))],
    "03_ring_reduce_scatter": [all_of(ranks_hold({r: [20 * r, 20 * r + 10] for r in range(4)}),
                                      says("12 messages in 3 steps:"))],
    "04_tree_broadcast": [all_of(ranks_hold({r: [0, 1, 2, 3] for r in range(6)}),
                                 says("5 messages in 3 steps:")),
                          all_of(ranks_hold({r: [0, 1, 2, 3] for r in range(8)}),
                                 says("7 messages in 3 steps:"))],
    "05_alltoall": [all_of(ranks_hold({c: [c, 10 + c, 20 + c, 30 + c] for c in range(4)}),
                           says("12 messages in 3 steps:")),
                    all_of(ranks_hold({c: [c, 10 + c, 20 + c, 30 + c] for c in range(4)}),
                           ring_alltoall_sizes)],
    "06_fix_ring_allgather": [all_of(ranks_hold({r: [0, 1, 10, 11, 20, 21] for r in range(3)}),
                                     says("6 messages in 2 steps:"))],
    "07_sync_sgd_step": [all_of(is_true("replicas identical"), sync_sgd_bytes)],
    "08_bucketed_grad_sync": [all_of(is_true("same gradients"), buckets_overlap)],
    "09_async_ps": [staleness_bound],
    # one AllReduce of dX (2 x 3 x 6) backward; of Y (2 x 3 x 6) forward; of both (2 x 3 x 4)
    "10_column_parallel_linear": [bytes_per_rank(allreduce_bytes(4, 36))],
    "11_row_parallel_linear": [bytes_per_rank(allreduce_bytes(4, 36))],
    "12_megatron_mlp": [bytes_per_rank(allreduce_bytes(4, 24, count=2))],
    "13_tp_attention": [bytes_per_rank(allreduce_bytes(2, 48, count=2))],
    "14_one_f_one_b": [all_of(says("valid"), one_f_one_b_picture)],
    # 4 microbatches, each sent forward and back across the 2 boundaries of 3 stages
    "15_pipeline_stage": [says("messages: 16")],
    "16_zero1_step": [all_of(is_true("same as data parallelism"),
                             first_collectives(["ring_reduce_scatter", "ring_allgather"] * 2))],
    "17_zero2_step": [all_of(is_true("same as data parallelism"),     # two buckets
                             first_collectives(["ring_reduce_scatter"] * 2 + ["ring_allgather"] * 2))],
    "18_zero3_step": [all_of(is_true("same as data parallelism"),     # three units
                             first_collectives(["ring_allgather"] * 3
                                               + ["ring_allgather", "ring_reduce_scatter"] * 3))],
    "19_hierarchical_allreduce": [all_of(is_true("the sum on every rank"), hierarchical_bytes,
                                         hierarchical_time)],
    # c = 4 ranks pass on the K and V of c - 1 blocks, (b, h, n, d) = (1, 2, 4, 8), 8 bytes each
    "20_ring_attention": [all_of(bytes_per_rank([2 * (4 - 1) * 1 * 2 * 4 * 8 * 8] * 4),
                                 says("messages per rank: [3, 3, 3, 3]"))],
    "21_moe_dispatch_combine": [moe_dispatch_bytes],
    "22_hsdp_step": [hsdp_across_nodes],
}


def test_every_notebook_has_its_try_it_expectations():
    assert sorted(TRY_IT) == STEMS


# -- a wrong program ------------------------------------------------------------------------------

def test_a_wrong_program_fails_its_try_it_cell_visibly(tmp_path):
    """A Try-it cell catches only the stub's NotImplementedError: a learner's bug raises (the
    learner, and nbval, see an error), never printed as if it were the cell's output.

    Every exercise notebook, its stubs raising ValueError instead, up to its last Try-it cell
    (no grading cells), in one kernel (``%reset -f`` between notebooks)."""
    cells, watched = [], []
    for stem in STEMS:
        nb = nbformat.read(ROOT / "exercises" / PART[stem] / f"{stem}.ipynb", as_version=4)
        try_it = [id(c) for _, section in sections(nb, "Try it") for c in section]
        grading = {id(c) for _, section in sections(nb, "Grade it") for c in section}
        code = [c for c in nb.cells if c.cell_type == "code" and id(c) not in grading]
        last = max(i for i, c in enumerate(code) if id(c) in try_it)
        cells.append(new_code_cell("%reset -f"))
        for c in code[:last + 1]:
            cells.append(new_code_cell(c.source.replace(STUB, 'raise ValueError("a learner\'s bug")')))
            if id(c) in try_it:
                watched.append((stem, cells[-1]))
    run = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    # A kernel on local sockets, as the book's (book/_ext/ipc_kernels.py): no TCP port to lose.
    config = Config({"KernelManager": {"transport": "ipc", "ip": str(tmp_path / "kernel")}})
    NotebookClient(run, timeout=120, allow_errors=True, config=config,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    exercises = [e for s in SOLUTIONS for e in nbformat.read(s, as_version=4).metadata.ringlab.exercises]
    assert len(watched) == len(exercises), "one Try-it section per exercise"
    quiet = [(stem, text_of(cell)) for stem, cell in watched
             if not any(o.output_type == "error" and "a learner's bug" in o.evalue for o in cell.outputs)]
    assert quiet == [], "Try-it cells that did not raise the program's error"
