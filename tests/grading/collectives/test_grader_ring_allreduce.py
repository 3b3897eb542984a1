"""The ring_allreduce grader: accepts every correct ring, rejects each real mistake
with the specific check and a helpful message."""

import numpy as np
import pytest

import ringlab
from ringlab.collectives import ring_allreduce

import programs.ring_variants as v
from programs.reports import assert_fails


@pytest.mark.parametrize("program", [ring_allreduce, v.leftward_send_recv, v.isend_irecv_in_place,
                                     v.explicit_bounds, v.ceil_chunks])
def test_correct_rings_pass(program):
    for seed in (0, 1):
        report = ringlab.grade("ring_allreduce", program, seed=seed)
        assert report.passed, str(report)
        assert "All test cases passed!" in str(report) and report.cases_passed == report.cases_total


# program, the check that must fail, phrases the feedback must contain
WRONG = [
    (v.uses_rank_before_defined, "runs without error", ["UnboundLocalError", "ring_variants.py", "rank 0"]),
    (v.bad_neighbour, "runs without error", ["What:     rank 3, step 1: send(dst=4): there is no rank 4"]),
    (v.wrong_slot, "sum of all inputs", ["world_size 4", "are missing", "First went wrong: step 2",
                                         "(rank - 1 - k) % N"]),
    (v.all_gather_reuses_rs_indices, "sum of all inputs", ["step 4 (all-gather phase)", "fully reduced"]),
    (v.accumulates_in_all_gather, "sum of all inputs", ["rank 0's contribution is counted twice",
                                                        "do not add it"]),
    (v.replaces_in_reduce_scatter, "sum of all inputs", ["step 2 (reduce-scatter phase)",
                                                         "own contribution is gone"]),
    (v.one_step_too_few, "sum of all inputs", ["step 3", "N-1 steps"]),
    (v.all_gather_one_step_too_few, "sum of all inputs", ["took 5 steps", "2(N-1) = 6",
                                                          "Each phase loops world_size - 1 times"]),
    (v.one_step_too_many, "exactly 2(N-1) steps", ["took 7 steps", "= 6 steps"]),
    (v.assumes_length_divides, "sum of all inputs", ["length=13", "assume the length divides"]),
    (v.whole_vectors_around_ring, "one chunk per message", ["(the whole vector)", "at most one chunk"]),
    (v.central_reduction, "only between ring neighbours", ["rank 2 sent to rank 0", "central reduction"]),
    (v.receives_first_deadlock, "no deadlock", ["rank 0: waits in recv(src=3)",
                                                "every rank waits to receive, and no rank has sent anything yet",
                                                "waits to receive before anyone sends: send first, or use "
                                                "comm.sendrecv"]),
    (v.last_rank_skips_all_gather, "no deadlock", ["rank 0 waits for a message from rank 3, which has finished "
                                                   "without sending it", "Rank 3 has finished while rank 0 still waits for it",
                                                   "stopped too soon"]),
    (v.receives_from_the_wrong_side, "no deadlock", [
        "rank 0 waits for a message from rank 1; rank 1 waits for a message from rank 2; rank 2 waits for a "
        "message from rank 3; rank 3 waits for a message from rank 0: a cycle",
        "rank 0 sent rank 1 a message at step 1 that was never received: rank 1 waits for rank 2 instead",
        "a recv names the wrong peer"]),
    # zeros: the grader names them (it used to crash on "contributions of" no rank)
    (v.ring_on_zeros, "sum of all inputs", ["contributions of no rank (the value is 0)",
                                            "sent rank 1 zeros", "not from np.zeros"]),
    # a wrong sum whose messages leave the ring: the messages are the cause, named first
    (v.skips_a_neighbour, "only between ring neighbours", ["rank 0 sent to rank 2",
                                                           "So rank 0's result is wrong too"]),
    (v.gathers_into_a_list_one_step_short, "runs without error", [
        "ValueError", "Also: the program took 5 steps before failing; a ring AllReduce takes 2(N-1) = 6",
        "Count your loops first"]),
]


@pytest.mark.parametrize("program, check, phrases", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_each_mistake_fails_with_a_specific_message(program, check, phrases):
    assert_fails(ringlab.grade("ring_allreduce", program, seed=0), check,
                 [*phrases, 'Reproduce: ringlab.grade("ring_allreduce", program, seed=0)'], exact=False)


def test_stub_reports_not_implemented_yet():
    report = ringlab.grade("ring_allreduce", v.not_implemented)
    assert not report.passed and report.not_implemented
    assert "not implemented yet" in str(report)


def test_infinite_loop_fails_instead_of_hanging(monkeypatch):
    from ringlab.grading.kit import running as report_module
    real_run = report_module.run
    monkeypatch.setattr(report_module, "run", lambda *a, **k: real_run(*a, **{**k, "timeout": 0.3}))

    def spins(comm, x):
        while True:
            pass
    report = ringlab.grade("ring_allreduce", spins, seed=0)
    assert not report.passed and report.failure.check == "the program finishes"
    assert "did not finish within 0.3 s" in str(report)


def test_wrong_sum_names_missing_ranks_exactly():
    # Drops rank 1's data entirely: every rank's output lacks exactly rank 1's contribution.
    def skip_rank_one(comm, x):
        y = x * 0 if comm.rank == 1 else x
        return ring_allreduce(comm, y)
    report = ringlab.grade("ring_allreduce", skip_rank_one, seed=0)
    assert "rank 0, elements 0..11: rank 1's contribution is missing" in str(report)


def test_report_names_its_seed_and_the_seed_reproduces_it():
    a = ringlab.grade("ring_allreduce", v.one_step_too_few)
    assert f"seed={a.seed})" in str(a)
    assert str(ringlab.grade("ring_allreduce", v.one_step_too_few, seed=a.seed)) == str(a)


def test_unknown_exercise_lists_known_ones():
    with pytest.raises(ValueError, match="ring_allreduce"):
        ringlab.grade("no_such_exercise", ring_allreduce)


def test_reports_are_logged_for_the_cli_unless_log_is_false(tmp_path, monkeypatch):
    log = tmp_path / "grades.jsonl"
    monkeypatch.setenv("RINGLAB_GRADE_LOG", str(log))
    ringlab.grade("ring_allreduce", v.one_step_too_few, seed=0, log=False)   # a demonstration
    assert not log.exists()
    ringlab.grade("ring_allreduce", ring_allreduce, seed=0)
    (line,) = log.read_text().splitlines()
    assert '"passed": true' in line and '"exercise": "ring_allreduce"' in line


def test_failed_runs_carry_the_trace_so_far():
    xs = [np.arange(8.0) + r for r in range(4)]
    with pytest.raises(ringlab.errors.DeadlockError) as dead:
        ringlab.run(v.receives_first_deadlock, xs)
    assert len(dead.value.trace) == 0 and dead.value.trace.unreceived == []     # nobody sent anything
    with pytest.raises(ringlab.errors.RankError) as err:
        ringlab.run(v.gathers_into_a_list_one_step_short, xs)
    # 3 reduce-scatter steps + 2 of the 3 all-gather steps, then np.concatenate fails on the first rank to get there
    assert err.value.trace.steps == err.value.step == 5


def test_deadlock_in_plain_words_follows_the_waits():
    from ringlab.errors import DeadlockError, Wait
    from ringlab import deadlock
    chain = DeadlockError({0: Wait("recv", 1, "waits in recv(src=1) (its clock: step 2)"),
                           1: Wait("send", 2, "waits until rank 2 receives what it sent (its clock: step 2)")},
                          [2])
    words, hint = deadlock.explain(chain)
    assert words == ("In plain words: rank 0 waits for a message from rank 1; rank 1 waits for rank 2 to "
                     "receive what it sent; rank 2 has finished without receiving it.")
    assert "Rank 2 has finished while rank 1 still waits for it" in hint
    unknown = DeadlockError({0: Wait("running", None, "running (its clock: step 1)")}, [])
    assert deadlock.explain(unknown) == ("", deadlock.GENERIC)


def test_a_single_step_is_reported_in_the_singular():
    from ringlab.grading.kit import checks
    from ringlab.grading.kit.report import Case
    assert [checks.steps(k) for k in (0, 1, 3)] == ["0 steps", "1 step", "3 steps"]
    one = ringlab.run(lambda comm, x: comm.sendrecv(x, 1 - comm.rank, 1 - comm.rank), [np.ones(1)] * 2).trace
    f = checks.exact_steps(one, Case(2, [np.ones(1)] * 2, "world_size=2"), 2,
                           check="exactly 2(N-1) steps", expected="2 steps", hint="loop")
    assert (f.what, f.got) == ("the program took 1 step", "1 step")


def test_sending_zeros_is_not_called_a_wrong_slot():
    # A buffer that was never filled decodes to "no contribution at all", not to a mix of places.
    def sends_zeros(comm, x):
        return v._ring(comm, x, v.RS, v.AG, rs_sends=np.zeros_like)
    text = str(ringlab.grade("ring_allreduce", sends_zeros, seed=0, log=False))
    assert "First went wrong: step 1: rank 0 sent rank 1 zeros, which hold no rank's contribution" in text
    assert "wrong slot" not in text


# -- a program that changes numpy (or the grader) in the grader's own process --------------

def _patches(where, name, value):
    """A right ring AllReduce that, once done, replaces ``where.name`` (numpy's, a
    builtin, one of the grader's checks) in the process it runs in."""
    def program(comm, x):
        out = ring_allreduce(comm, x)
        setattr(where, name, value)
        return out
    program.__name__ = f"patches_{name}"
    return program


@pytest.mark.parametrize("where, name, value, words", [
    # the grader's partial-sum check splits with np.array_split: IndexError, before the fix
    (np, "array_split", lambda a, n, *k: [a], "numpy.array_split"),
    (np, "sum", lambda *a, **k: 0, "numpy.sum"),
    (__import__("ringlab.grading.kit.checks", fromlist=["checks"]), "ring_neighbours",
     lambda *a, **k: None, "ringlab.grading.kit.checks.ring_neighbours"),
], ids=["array_split", "sum", "a_check"])
def test_a_program_that_patches_numpy_or_the_grader_fails_and_is_undone(where, name, value, words):
    original = getattr(where, name)
    try:
        report = ringlab.grade("ring_allreduce", _patches(where, name, value), seed=0, log=False)
        assert getattr(where, name) is original            # put back as soon as the run ends
    finally:
        setattr(where, name, original)
    text = str(report)
    assert not report.passed and report.failure.check == "the program leaves numpy, Python and ringlab as they are", text
    assert f"the program replaced {words} while it ran" in text, text
    assert "the grader runs in the same process" in text, text
    assert ringlab.grade("ring_allreduce", ring_allreduce, seed=0, log=False).passed


def test_a_check_that_crashes_on_a_program_s_run_is_a_failure(monkeypatch):
    """Whatever a check trips over in what a program did, the grade is a failure that
    says so, not a traceback of the grader."""
    import ringlab.grading.collectives.ring_allreduce as g

    def trips(*a, **k):
        raise IndexError("list index out of range")
    monkeypatch.setattr(g.reductions, "ring_partial_sums", trips)
    report = ringlab.grade("ring_allreduce", ring_allreduce, seed=0, log=False)
    assert not report.passed and report.failure.check == "the grader can read the program's run"
    assert "IndexError: list index out of range" in str(report), report


def test_chunks_that_do_not_cut_the_vector_fail_even_with_right_partial_sums():
    """Every message a right partial sum, but of overlapping prefixes (the result taken
    from shared memory): a ring may cut its chunks its own way, but it must cut them."""
    shared = {}

    def prefixes(comm, x):
        n, r = comm.world_size, comm.rank
        shared[r] = x.copy()
        comm.barrier()
        size = -(-len(x) // n)
        for k in range(2 * (n - 1)):
            members = [(r - j) % n for j in range(min(k + 1, n))]
            part = sum(shared[m][:size] for m in members) if k < n - 1 else sum(
                shared[m][:size] for m in range(n))
            comm.sendrecv(part, (r + 1) % n, (r - 1) % n)
        return sum(shared[m] for m in range(n))
    report = ringlab.grade("ring_allreduce", prefixes, seed=0, log=False)
    assert_fails(report, "every message carries the right partial sum",
                 ["do not cut the vector into pieces", "element 0 is in 4 of them",
                  "np.array_split(x, world_size)"], exact=False)
