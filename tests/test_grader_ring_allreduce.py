"""The ring_allreduce grader: accepts every correct ring, rejects each real mistake
with the specific check and a helpful message."""

import pytest

import ringlab
from ringlab.collectives import ring_allreduce

import ring_variants as v


@pytest.mark.parametrize("program", [ring_allreduce, v.leftward_send_recv, v.isend_irecv_in_place,
                                     v.explicit_bounds])
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
    (v.receives_first_deadlock, "no deadlock", ["rank 0: waits in recv(src=3)"]),
]


@pytest.mark.parametrize("program, check, phrases", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_each_mistake_fails_with_a_specific_message(program, check, phrases):
    report = ringlab.grade("ring_allreduce", program, seed=0)
    text = str(report)
    assert not report.passed and not report.not_implemented
    assert check in report.failure.check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    assert "Reproduce: ringlab.grade(\"ring_allreduce\", program, seed=0)" in text


def test_stub_reports_not_implemented_yet():
    report = ringlab.grade("ring_allreduce", v.not_implemented)
    assert not report.passed and report.not_implemented
    assert "not implemented yet" in str(report)


def test_infinite_loop_fails_instead_of_hanging(monkeypatch):
    from ringlab.grading import report as report_module
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
