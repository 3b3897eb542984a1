"""The trusted grading path: isolated runs, and `ringlab grade` against forged notebooks.

Each cheat here was seen in a class. The isolated-run tests are fast (no
kernel); the notebook tests run one `ringlab grade --jobs 2` over a class of
forged notebooks and read its CSV and JSON.
"""

import csv
import json
import subprocess
import sys
from pathlib import Path

import cloudpickle
import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import ringlab
from ringlab.collectives import alltoall, ring_allreduce, tree_broadcast
from ringlab.grading import GRADERS
from ringlab.backends.isolated import RankProcessDied, Submission, run_isolated, runner
from ringlab.grading.kit.loop import grade_cases
from ringlab.grading.trusted import reference_in

ROOT = Path(__file__).resolve().parents[2]
# The rank processes cannot import this test module: send its functions by value,
# as `ringlab grade` sends a notebook's.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def grade_isolated(exercise, program, seed=1):
    import importlib
    module = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
    return grade_cases(exercise, module, program, seed=seed, runner=runner())


def inputs(n=4, length=8):
    return [np.arange(length, dtype=np.float64) * (r + 1) for r in range(n)]


# -- isolated runs give ringlab.run's results -------------------------------------------

@pytest.mark.parametrize("program, xs, args", [
    (ring_allreduce, inputs(5, 11), ()),
    (alltoall, [[np.array([10.0 * r + c]) for c in range(4)] for r in range(4)], ()),
    (tree_broadcast, [np.arange(3.0) if r == 2 else None for r in range(6)], (2,)),
], ids=["ring_allreduce", "alltoall", "tree_broadcast"])
def test_isolated_run_equals_ringlab_run(program, xs, args):
    want = ringlab.run(program, xs, args=args, record_payloads=True)
    got = run_isolated(program, xs, args=args, record_payloads=True)
    assert list(got.trace) == list(want.trace) and got.trace.spans == want.trace.spans
    assert got.payloads.keys() == want.payloads.keys()
    assert all(np.array_equal(got.payloads[k], want.payloads[k]) for k in want.payloads)
    for a, b in zip(got.outputs, want.outputs):
        assert type(a) is type(b) and (np.array_equal(a, b) if isinstance(a, np.ndarray) else
                                       all(np.array_equal(p, q) for p, q in zip(a, b)))


def same_run(got, want):
    """An isolated run's result is ringlab.run's: trace, spans, computes, groups, time, payloads."""
    assert list(got.trace) == list(want.trace) and got.trace.spans == want.trace.spans
    assert got.trace.computes == want.trace.computes and got.time == want.time
    assert got.trace.group_ranks == want.trace.group_ranks
    assert (got.payloads is None) == (want.payloads is None)
    if want.payloads is not None:
        assert got.payloads.keys() == want.payloads.keys()
        assert all(np.array_equal(got.payloads[k], want.payloads[k]) for k in want.payloads)
    assert len(got.outputs) == len(want.outputs)
    for a, b in zip(got.outputs, want.outputs):
        assert type(a) is type(b)
        if isinstance(a, (list, tuple)):
            assert len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b))
        elif a is not None:
            assert np.array_equal(a, b) and a.dtype == b.dtype


def test_compute_groups_split_barrier_and_recv_any_isolated_equal_ringlab_run():
    def prog(comm, x):
        comm.compute(0.5 * (comm.rank + 1), "forward", layer=comm.rank)
        pair = comm.new_group([0, 1], name="pair")
        everyone = comm.new_group(range(comm.world_size))          # a range, no name
        row = comm.split(comm.rank % 2, key=-comm.rank, name="row")
        comm.barrier()
        out = ring_allreduce(row, x)
        if pair is not None:
            with pair.span("pair-sum"):
                out = out + ring_allreduce(pair, x)
        total = ring_allreduce(everyone, x)
        if comm.rank == 0:
            srcs = [comm.recv_any(tag=3)[0] for _ in range(comm.world_size - 1)]
        else:
            comm.compute(0.1 * (comm.world_size - comm.rank), "late")
            comm.send(x[:2], 0, tag=3)
            srcs = []
        # Group labels are as in ringlab.run (a tuple of ranks is hashable), and so is repr.
        labels = {everyone.group.label: 1, row.group.label: 2}
        assert type(everyone.group.label) is tuple and len(labels) == 2 and hash(everyone.group)
        assert repr(row) == f"<Comm rank={row.rank} world_size=2 group={row.group.label!r} step={row.step}>"
        return [out, total, np.array(srcs, dtype=np.int64), np.array([comm.time, comm.step, row.rank])]

    xs = inputs(4, 6)
    for kw in ({}, {"network": ringlab.AlphaBeta(1e-3, 1e-6)}, {"mode": "rendezvous"}):
        want = ringlab.run(prog, xs, record_payloads=True, **kw)
        got = run_isolated(prog, xs, record_payloads=True, **kw)
        same_run(got, want)
    assert {e.group for e in want.trace} >= {"pair", "row[0]", "row[1]", (0, 1, 2, 3), None}
    assert [c.label for c in want.trace.computes].count("late") == 3


# -- comm.start: works run in the rank's process, on a thread of their own -----------------

def overlapped(comm, x):
    work = comm.start(ring_allreduce, x)               # on the communication stream
    comm.compute(1e-2, "backward")
    assert not work.is_completed() or comm.time >= 1e-2
    return work.wait()


def several_in_order(comm, x):
    w1 = comm.start(ring_allreduce, x)
    w2 = comm.start(ring_allreduce, 2 * x)
    # The program's own messages (same tag as the works') never mix with theirs.
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    got = comm.sendrecv(x + 100, right, left)
    polls = 0
    while not w2.is_completed():
        polls += 1
    return [w1.wait(), w2.wait(), got, np.array([polls >= 0])]


def buckets(comm, x):
    """DDP-style: a bucket's all-reduce starts as soon as backward has made it."""
    grads, works = np.zeros_like(x), []
    for b, piece in enumerate(np.array_split(np.arange(x.size), 3)):
        comm.compute(1e-3, "backward", bucket=b)
        grads[piece] = x[piece] * (b + 1)
        works.append(comm.start(ring_allreduce, grads[piece]))
    return [w.wait() for w in works]


def buffer_as_it_was(comm, x):
    buf, peer = np.zeros(2), (comm.rank + 1) % 2
    work = comm.start(lambda c: c.sendrecv(buf, peer, peer))   # sends before the buffer is written
    comm.compute(1.0, "backward")
    buf[...] = x[:2]
    return work.wait()


def on_two_groups(comm, x):
    rows, cols = comm.split(comm.rank // 2, name="row"), comm.split(comm.rank % 2, name="col")
    works = [rows.start(ring_allreduce, x), cols.start(ring_allreduce, x + 1)]   # two streams at once
    return [works[1].wait(), works[0].wait()]


def not_waited(comm, x):
    comm.start(ring_allreduce, x)                      # the run still waits for it, as ringlab.run does
    return x


@pytest.mark.parametrize("program", [overlapped, several_in_order, buckets, buffer_as_it_was,
                                     on_two_groups, not_waited])
@pytest.mark.parametrize("kw", [{}, {"network": ringlab.AlphaBeta(1e-4, 1e-8)}, {"mode": "rendezvous"}],
                         ids=["buffered", "network", "rendezvous"])
def test_works_in_isolated_runs_equal_ringlab_run(program, kw):
    xs = inputs(4 if program is not buffer_as_it_was else 2, 9)
    want = ringlab.run(program, xs, record_payloads=True, **kw)
    got = run_isolated(program, xs, record_payloads=True, **kw)
    same_run(got, want)
    assert {e.stream for e in want.trace} >= {1}


def test_a_work_result_stays_in_the_rank_process():
    def prog(comm, x):
        work = comm.start(lambda c: {"sum": ring_allreduce(c, x), "fn": len})   # cannot cross the pipe
        return work.wait()["sum"]
    same_run(run_isolated(prog, inputs()), ringlab.run(prog, inputs()))


def test_spans_travel_with_the_next_message_and_arrive_as_in_ringlab_run():
    """A rank's spans go to the grader with its next message, not as calls of
    their own (rank._Link.spans): spans left with no call after them (an
    error's, the program's last), nested, and a work's arrive all the same."""
    def prog(comm, x):
        with comm.span("outer"):
            with comm.span("empty"):           # no message inside, none after until the next
                pass
            with comm.span("inner"):
                x = ring_allreduce(comm, x)
            work = comm.start(lambda c: (c.span("in-work").__enter__(), ring_allreduce(c, x))[1])
            x = work.wait()
        if comm.rank == 1:
            with comm.span("failing"):
                raise ValueError("late")
        with comm.span("last"):                # left only in the "done" message
            return x + 1
    with pytest.raises(ringlab.RankError) as want:
        ringlab.run(prog, inputs(3))
    with pytest.raises(ringlab.RankError) as got:
        run_isolated(prog, inputs(3))
    assert str(got.value.exc) == "late"
    # Every rank's: the failing rank's come with its error; the others', cut short
    # (ringlab.run unwinds their ``with`` blocks; their processes are killed), end
    # where the grader's actors for them stand.
    spans = [sorted(e.value.trace.spans, key=repr) for e in (got, want)]
    assert spans[0] == spans[1]
    assert {"outer", "outer/empty", "outer/inner/ring_allreduce", "failing"} <= {
        s.path for s in spans[0] if s.rank == 1}
    assert {(0, "outer"), (2, "outer")} <= {(s.rank, s.path) for s in spans[0]}

    def fine(comm, x):
        with comm.span("outer"):
            with comm.span("inner"):
                pass
        with comm.span("last"):
            return ring_allreduce(comm, x)
    same_run(run_isolated(fine, inputs(3), record_payloads=True),
             ringlab.run(fine, inputs(3), record_payloads=True))


def _deadlocks_in_spans(comm, x):
    with comm.span("a"):
        x = ring_allreduce(comm, x)
        with comm.span("b"):
            return comm.recv(src=(comm.rank + 1) % comm.world_size)    # nobody sends


def _deadlocks_in_a_work(comm, x):
    def work(c):
        with c.span("w1"), c.span("w2"):
            return c.recv(src=(c.rank + 1) % c.world_size)
    with comm.span("main"):
        w = comm.start(work)
        comm.compute(1.0)
        return w.wait()


@pytest.mark.parametrize("program", [_deadlocks_in_spans, _deadlocks_in_a_work])
def test_a_deadlock_leaves_the_spans_ringlab_run_leaves(program):
    """Every rank is cut short: the spans open in the program and in its works end
    where each rank waits, innermost first, as ringlab.run records them."""
    with pytest.raises(ringlab.DeadlockError) as want:
        ringlab.run(program, inputs(3))
    with pytest.raises(ringlab.DeadlockError) as got:
        run_isolated(program, inputs(3))
    spans = [sorted(e.value.trace.spans, key=repr) for e in (got, want)]
    assert spans[0] == spans[1] and len(spans[0]) >= 9


def test_a_span_the_rank_did_not_open_is_refused():
    """The grader believes no span the rank's process sends: closing one it never
    opened ends the run with a clear error, not a hang or a grader traceback."""
    def forged(comm, x):
        comm._world.span_exit(comm, 12345)
        return ring_allreduce(comm, x)
    with pytest.raises(ringlab.RankError) as e:
        run_isolated(forged, inputs(2))
    assert isinstance(e.value.exc, RankProcessDied) and "a span it did not open" in str(e.value)


def test_a_work_that_raises_is_that_ranks_error():
    def bucket_sync(c, x):
        ring_allreduce(c, x)
        if c.rank == 2:
            raise ValueError("bad bucket")
        return x

    def prog(comm, x):
        work = comm.start(bucket_sync, x)
        comm.compute(1.0)
        return work.wait()
    with pytest.raises(ringlab.RankError) as want:
        ringlab.run(prog, inputs())
    with pytest.raises(ringlab.RankError) as got:
        run_isolated(prog, inputs())
    assert (got.value.rank, got.value.step) == (want.value.rank, want.value.step) == (2, 6)
    assert type(got.value.exc) is ValueError and str(got.value.exc) == "bad bucket"
    assert "in bucket_sync" in got.value.program_traceback and "isolated.py" not in got.value.program_traceback
    assert list(got.value.trace) == list(want.value.trace)

    def bad_call(comm, x):                 # a CommError inside a work, from the simulator
        return comm.start(lambda c: c.recv(c.world_size)).wait()
    with pytest.raises(ringlab.RankError, match="there is no rank 4"):
        run_isolated(bad_call, inputs())


def test_a_work_that_deadlocks_or_never_ends_is_diagnosed():
    def lonely(c, x):
        return c.recv((c.rank + 1) % c.world_size)       # nobody sends on the stream

    def waits(comm, x):
        return comm.start(lonely, x).wait()

    def returns_early(comm, x):
        comm.start(lonely, x)
        return x
    for prog, says in ((waits, "rank 0: waits in work.wait() for lonely on the communication stream"),
                       (returns_early, "rank 0: waits in recv(src=1) (on the communication stream)")):
        with pytest.raises(ringlab.DeadlockError) as want:
            ringlab.run(prog, inputs())
        with pytest.raises(ringlab.DeadlockError) as got:
            run_isolated(prog, inputs(), timeout=20)
        assert got.value.waiting == want.value.waiting and got.value.finished == want.value.finished
        assert str(got.value) == str(want.value) and says in str(got.value)
        assert list(got.value.trace) == list(want.value.trace)

    def spins(c, x):
        while True:
            pass

    def sleeps(c, x):
        import time
        time.sleep(60)

    for fn in (spins, sleeps):
        def prog(comm, x, fn=fn):
            return comm.start(fn, x).wait()
        with pytest.raises(ringlab.ProgramTimeout) as e:
            run_isolated(prog, inputs(2), timeout=1.0)
        assert e.value.rank == 0


def test_communication_from_a_thread_of_the_programs_own_is_refused():
    def prog(comm, x):
        import threading
        box = []
        t = threading.Thread(target=lambda: box.append(_try(lambda: comm.barrier())))
        t.start()
        t.join()
        comm.barrier()
        return np.array(["not from a thread it started" in box[0]])

    def _try(f):
        try:
            f()
            return "ran"
        except ringlab.CommError as e:
            return str(e)
    assert all(y[0] for y in run_isolated(prog, inputs(2)).outputs)


def test_right_solution_passes_isolated():
    namespace = {}
    exec(MINE, namespace)        # a learner's ring AllReduce (the notebooks' below), sent by value
    assert grade_isolated("ring_allreduce", namespace["ring_allreduce"]).passed


def test_errors_deadlocks_and_comm_errors_are_diagnosed_as_in_process():
    def bad_peer(comm, x):
        return comm.recv(comm.world_size)
    with pytest.raises(ringlab.RankError, match="there is no rank 4"):
        run_isolated(bad_peer, inputs())
    with pytest.raises(ringlab.DeadlockError, match="recv"):
        run_isolated(lambda comm, x: comm.recv((comm.rank + 1) % comm.world_size), inputs())
    report = grade_isolated("ring_allreduce", lambda comm, x: (_ for _ in ()).throw(NotImplementedError()))
    assert report.not_implemented


# -- limits: a crash, os._exit, an endless loop, a memory hog, a wrong result type --------

def test_os_exit_and_timeout_and_memory_become_diagnoses():
    import os

    def leave(comm, x):
        os._exit(1)
    with pytest.raises(ringlab.RankError) as e:
        run_isolated(leave, inputs())
    assert isinstance(e.value.exc, RankProcessDied) and "exit code 1" in str(e.value)

    def spin(comm, x):
        while True:
            pass
    with pytest.raises(ringlab.ProgramTimeout):
        run_isolated(spin, inputs(2), timeout=1.0)

    def hog(comm, x):
        return np.ones(2**31)      # 16 GiB
    with pytest.raises(ringlab.RankError, match="MemoryError|ended before"):
        run_isolated(hog, inputs(2), memory_mb=256)


@pytest.mark.parametrize("result", [{"a": 1}, np.array([object()])],
                         ids=["dict", "object-array"])
def test_only_plain_arrays_come_back(result):
    with pytest.raises(ringlab.RankError, match="wrong result type"):
        run_isolated(lambda comm, x: result, inputs(2))


def test_an_array_subclass_comes_back_by_name_and_is_graded_as_in_one_process():
    """A learner's ndarray subclass travels as its name (no code of it runs in the
    grader): the graders' checks name it as they do in one process."""
    got = run_isolated(lambda comm, x: np.ma.masked_array(x), inputs(2)).outputs[0]
    assert isinstance(got, np.ndarray) and type(got).__name__ == "MaskedArray"
    assert type(got) is not np.ma.MaskedArray

    def masked(comm, x):
        return np.ma.masked_array(ring_allreduce(comm, x))
    one = ringlab.grade("ring_allreduce", masked, seed=3)
    apart = grade_isolated("ring_allreduce", masked, seed=3)
    assert not one.passed and not apart.passed
    assert (one.failure.check, one.failure.what) == (apart.failure.check, apart.failure.what)
    assert "MaskedArray, a subclass of numpy.ndarray" in one.failure.what


# -- cheats through the shared process have no effect ------------------------------------

def test_module_level_and_default_argument_state_is_not_shared():
    def via_module(comm, x):
        store = np.__dict__.setdefault("_stash", {})
        store[comm.rank] = x
        comm.barrier()
        return sum(store.values())

    def via_default(comm, x, _seen={}):       # noqa: B006 - that is the cheat
        _seen[comm.rank] = x
        comm.barrier()
        return sum(_seen.values())

    for cheat in (via_module, via_default):
        xs = inputs()
        # Isolated first: a run here fills the default dict, which would then travel with the function.
        assert np.array_equal(run_isolated(cheat, xs).outputs[0], xs[0])      # sees only its own
        assert not grade_isolated("ring_allreduce", cheat).passed
        assert np.array_equal(ringlab.run(cheat, xs).outputs[0], sum(xs))     # works in one process


def test_frames_and_gc_show_no_other_rank():
    def peek_frames(comm, x):
        frame, found = sys._getframe(), None
        while frame is not None and found is None:
            found = frame.f_locals.get("inputs")
            frame = frame.f_back
        return x if found is None else np.sum(found, axis=0)

    def peek_gc(comm, x):
        import gc
        found = next((o for o in gc.get_objects() if isinstance(o, list) and len(o) == comm.world_size
                      and all(isinstance(a, np.ndarray) for a in o) and any(a is x for a in o)), None)
        return x if found is None else np.sum(found, axis=0)
    xs = inputs()
    assert np.array_equal(ringlab.run(peek_gc, xs).outputs[1], sum(xs))
    assert np.array_equal(run_isolated(peek_frames, xs).outputs[1], xs[1])
    # gc's view of every object would reach the rank's guard: asking for it fails the rank
    with pytest.raises(ringlab.RankError, match=r"the program used gc.get_objects \(a way"):
        run_isolated(peek_gc, xs)
    # and the self-check gives the instructor's verdict
    report = ringlab.grade("ring_allreduce", peek_gc, seed=1)
    assert not report.passed and "NotAllowed" in str(report) and "gc.get_objects" in str(report)


def test_rewriting_the_event_list_and_patching_numpy_or_the_grader_have_no_effect():
    def forge(comm, x):
        import sys
        import ringlab.grading.kit.checks as checks
        for module in list(sys.modules.values()):               # no World in a rank's process
            world = getattr(module, "World", None)
            if isinstance(getattr(world, "events", None), list):
                world.events.clear()
        np.array_equal = lambda *a, **k: True                    # every comparison "equal"
        for name in dir(checks):                                 # every trace check "fine"
            if callable(getattr(checks, name)):
                setattr(checks, name, lambda *a, **k: None)
        comm.send(x, (comm.rank + 1) % comm.world_size)
        return comm.recv((comm.rank - 1) % comm.world_size)
    original = np.array_equal
    got = run_isolated(forge, inputs())
    assert np.array_equal is original and len(got.trace) == 4
    assert not grade_isolated("ring_allreduce", forge).passed


def test_the_reference_is_recognised_in_the_pickled_bytes():
    assert "answer to ring_allreduce (ringlab.collectives" in reference_in(
        cloudpickle.dumps(ring_allreduce))

    def wraps(comm, x):
        return ring_allreduce(comm, x)
    assert reference_in(cloudpickle.dumps(wraps))
    assert reference_in(cloudpickle.dumps(lambda comm, x: x)) is None
    assert reference_in(b"not a pickle") is None


# -- `ringlab grade` on a class of forged notebooks --------------------------------------

MINE = '''\
import numpy as np
def ring_allreduce(comm, x):
    n, rank = comm.world_size, comm.rank
    out = x.copy()
    chunks = np.array_split(out, n)
    for k in range(n - 1):
        s, r = (rank - k) % n, (rank - k - 1) % n
        chunks[r] += comm.sendrecv(chunks[s], (rank + 1) % n, (rank - 1) % n)
    for k in range(n - 1):
        s, r = (rank + 1 - k) % n, (rank - k) % n
        chunks[r][...] = comm.sendrecv(chunks[s], (rank + 1) % n, (rank - 1) % n)
    return out
'''
STUB = "def ring_allreduce(comm, x):\n    raise NotImplementedError\n"
WRONG = "def ring_allreduce(comm, x):\n    return x\n"

CLASS = {
    "good": [MINE, 'import ringlab\nringlab.grade("ring_allreduce", ring_allreduce)'],
    "log_line": [STUB, 'import os, json\nopen(os.environ.get("RINGLAB_GRADE_LOG", "/dev/null"), "a").write('
                 'json.dumps({"exercise": "ring_allreduce", "passed": True}) + "\\n")'],
    "grade_replaced": [WRONG, "import ringlab\nfrom ringlab.collectives import ring_allreduce as ref\n"
                       "real = ringlab.grade\nringlab.grade = lambda ex, p, **k: real(ex, ref, **k)\n"
                       'ringlab.grade("ring_allreduce", ring_allreduce)'],
    "log_false": [WRONG, "import ringlab\nfrom ringlab.collectives import ring_allreduce as ref\n"
                  'ringlab.grade("ring_allreduce", ref, log=False)'],
    "other_exercise": ["import ringlab\nfrom ringlab.collectives import ring_allgather\n"
                       'ringlab.grade("ring_allgather", ring_allgather)'],
    "reference": ["from ringlab.collectives import ring_allreduce"],
    "kernel_dies": [MINE, "import os\nos._exit(1)"],
    "cell_timeout": [MINE, "import time\ntime.sleep(60)"],
    "memory_hog": ["import numpy as np\ndef ring_allreduce(comm, x):\n    return np.ones(2**31) + x.sum()"],
}


def notebook(cells, exercise="ring_allreduce"):
    return new_notebook(cells=[new_code_cell(c) for c in cells],
                        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"},
                                  "ringlab": {"exercises": {exercise: exercise}}})


def test_a_class_with_forgeries_is_graded_row_by_row(tmp_path):
    paths = []
    for name, cells in CLASS.items():
        nbformat.write(notebook(cells), tmp_path / f"{name}.ipynb")
        paths.append(tmp_path / f"{name}.ipynb")
    truncated = tmp_path / "truncated.ipynb"
    truncated.write_text((tmp_path / "good.ipynb").read_text()[:200])
    paths += [truncated, tmp_path / "missing.ipynb"]
    table, js = tmp_path / "grades.csv", tmp_path / "grades.json"
    proc = subprocess.run([sys.executable, "-m", "ringlab.cli", "grade", *map(str, paths), "--jobs", "2",
                           "--timeout", "5", "--csv", str(table), "--json", str(js)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "without encryption" not in proc.stdout + proc.stderr
    rows = {Path(r["notebook"]).stem: r for r in csv.DictReader(table.open())}
    assert json.loads(js.read_text()) and len(json.loads(js.read_text())) == len(rows) == len(paths)
    result = {k: (r["result"], r["reason"]) for k, r in rows.items()}

    assert result["good"][0] == "passed" and rows["good"]["cases_passed"] == rows["good"]["cases_total"] == "18"
    assert result["log_line"][0] == "not implemented"
    assert result["grade_replaced"][0] == "failed" and result["log_false"][0] == "failed"
    assert result["other_exercise"] == ("failed", "the notebook defines no function ring_allreduce(comm, ...)")
    assert result["reference"][0] == "failed" and "own answer" in result["reference"][1]
    assert result["kernel_dies"][0] == "error" and "kernel died" in result["kernel_dies"][1]
    assert result["cell_timeout"][0] == "error" and "did not finish within 5 s" in result["cell_timeout"][1]
    assert result["memory_hog"][0] == "failed" and "MemoryError" in result["memory_hog"][1]
    assert result["truncated"][0] == "error" and "not a readable notebook" in result["truncated"][1]
    assert result["missing"] == ("error", "no such file")
    assert all(r["exercise"] == "ring_allreduce" for k, r in rows.items() if k not in ("truncated", "missing"))
    assert "Summary" in proc.stdout and "FAILED" in proc.stdout
