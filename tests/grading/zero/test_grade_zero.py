"""The ZeRO graders (Part 5): right programs pass; the issue's mistakes fail with
the check that names them (programs in tests/programs/zero.py)."""

import cloudpickle
import numpy as np
import pytest

import ringlab
from ringlab import zero
from ringlab.grading.kit import measured as memory, sharded as common
from ringlab.grading.kit.loop import grade_cases
from ringlab.grading.trusted import banned_answers, reference_in

import programs.zero as Z
from support.cases import made_once

RIGHT = {
    "zero1_step": [zero.zero1_step, Z.z1_solution, Z.z1_left_ring_sum_then_divide],
    "zero2_step": [zero.zero2_step, Z.z2_solution, Z.z2_left_ring_sum_then_divide],
    "zero3_step": [Z.z3_solution, Z.z3_left_ring_sum_then_divide, Z.z3_prefetch],
}
COLLECTIVES = "collectives: which, how many, what size"
WRONG = {
    "zero1_step": [
        (Z.z1_allreduce, COLLECTIVES, ["the gradients went round twice, an AllReduce",
                                       "ZeRO never all-reduces"]),
        (Z.z1_whole_model_adam, "the state you were handed stays ZeRO-1's",
         ["stepped 0 time(s) in 1 training step(s)", "Adam on the whole model on every rank"]),
        (Z.z1_whole_model_adam_rs_ag, COLLECTIVES,
         ["6 message(s) of the weighted gradients", "AllGather of the gradients"]),
        (Z.z1_no_allgather, "parameters are identical on every rank",
         ["sent only N-1 = 3 message(s) per step", "no AllGather", "AllGather the updated"]),
        (Z.z1_master_view_of_full_copy, "the state you were handed stays ZeRO-1's",
         ["opt.params['param'] was replaced", "keeps the whole master on every rank"]),
        (Z.z1_full_master_kept, "memory: what a rank keeps between steps",
         ["memory measured", "flat copies of the model", "no full master copy"]),
        (Z.z1_front_padding, "parameters equal data-parallel Adam",
         ["the padding put at the front", "Pad at the END"]),
        (Z.z1_no_padding, "the program runs without error",
         ["could not be broadcast", "padded with zeros at the end to a multiple of N"]),
        (Z.z1_equal_weights, "parameters equal data-parallel Adam",
         ["weighted equally (1/N)", "len(x) / batch_size"]),
        (Z.z1_rank0_skips_allgather, "no deadlock",
         ["rank 1 waits for a message from rank 0, which has finished"]),
    ],
    "zero2_step": [
        (Z.z2_whole_model_adam, "the state you were handed stays ZeRO-2's",
         ["stepped 0 time(s) in 1 training step(s)", "Adam on the whole model on every rank"]),
        (Z.z2_allreduce, COLLECTIVES, ["bucket 0's weighted gradients",
                                       "the gradients went round twice, an AllReduce"]),
        (Z.z2_whole_flat_reduce_scatter, "parameters equal data-parallel Adam",
         ["ZeRO changes who stores what"]),
        (Z.z2_after_backward, "ReduceScatters run on the communication stream",
         ["from the program itself", "comm.start"]),
        (Z.z2_waits_in_backward, "backward never waits for the network",
         ["backward started", "collect the works and wait after it"]),
        (Z.z2_forward_order, "one ReduceScatter per bucket, in order, then the AllGathers",
         ["ReduceScatter(bucket 1), ReduceScatter(bucket 0), AllGather(bucket 0)"]),
        (Z.z2_no_allgather, "parameters are identical on every rank", ["no AllGather"]),
        # one AllGather of the whole master shard: not a padding problem
        (Z.z2_one_allgather_of_the_shard, COLLECTIVES,
         ["rank 0's whole shard of the parameters, its pieces of all 2 buckets in one message",
          "one AllGather of the whole shard, not one per bucket",
          "AllGather each bucket's piece on its own"]),
        (Z.z2_full_master_kept, "memory: what a rank keeps between steps",
         ["flat copies of the model", "no full master copy"]),
    ],
    "zero3_step": [
        (Z.z3_allreduce, COLLECTIVES, ["unit 0's weighted gradients",
                                       "the gradients went round twice, an AllReduce"]),
        (Z.z3_gather_once, COLLECTIVES,
         ["gathered once per step, for forward only, and kept for backward", "FULL_SHARD"]),
        (Z.z3_gather_all_up_front, "memory: peak per rank within ZeRO-3's bound",
         ["25 units, memory measured", "times its largest unit", "8 full units"]),
        (Z.z3_reduce_scatter_before_second_gather,
         "an AllGather before each unit's forward and backward",
         ["ReduceScatter(unit 4), AllGather(unit 4)", "each unit's after its second AllGather"]),
        (Z.z3_freed_before_backward, "the program runs without error",
         ["'NoneType' object has no attribute 'T'", "gathered again before the unit's backward"]),
        (Z.z3_whole_model_adam, "the state you were handed stays ZeRO-3's",
         ["stepped 0 time(s)", "Adam on your 1/N only"]),
        (Z.z3_keeps_params, "every unit is resharded after the step",
         ["still holds its full weight, bias", "set them back to None"]),
        (Z.z3_front_padding, "parameters equal data-parallel Adam",
         ["the padding put at the front", "Pad at the END"]),
        (Z.z3_equal_weights, "parameters equal data-parallel Adam", ["weighted equally (1/N)"]),
    ],
}
CASES = [(ex, f) for ex, fs in RIGHT.items() for f in fs]
FAILS = [(ex, *w) for ex, ws in WRONG.items() for w in ws]


@pytest.fixture(autouse=True, scope="module")
def cases_made_once():
    """Each ZeRO grader's cases for seed 0, made once for this file (tests/support/cases.py)."""
    with made_once(["zero1_step", "zero2_step", "zero3_step"]):
        yield


def grade(exercise, program):
    return ringlab.grade(exercise, program, seed=0, log=False)


@pytest.mark.parametrize("exercise, program", CASES,
                         ids=[f"{e}-{f.__module__.split('.')[-1]}.{f.__name__}" for e, f in CASES])
def test_right_programs_pass(exercise, program):
    report = grade(exercise, program)
    assert report.passed, str(report)
    assert report.world_sizes[0] == 1 and report.world_sizes[-1] == 8


@pytest.mark.parametrize("exercise, program, check, phrases", FAILS,
                         ids=[f"{w[0]}-{w[1].__name__}" for w in FAILS])
def test_wrong_programs_fail(exercise, program, check, phrases):
    report = grade(exercise, program)
    text = str(report)
    assert not report.passed and report.failure.check == check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    assert "np.float64(" not in text


def test_each_grader_has_six_wrong_and_three_right_programs():
    for exercise in ("zero1_step", "zero2_step", "zero3_step"):
        assert len(WRONG[exercise]) >= 6 and len(RIGHT[exercise]) >= 3


def test_cases_are_hidden_and_hard(monkeypatch):
    """World sizes 1..8, parameter counts that do not divide by N, unequal shards,
    a seed that changes the models."""
    from ringlab.grading.zero import zero1_step, zero2_step, zero3_step
    for grader in (zero1_step, zero2_step, zero3_step):
        cases = list(grader.cases(np.random.default_rng(0)))
        assert {c.world_size for c in cases} >= {1, 2, 4, 8}
        assert any(c.info["numel"] % c.world_size for c in cases)
        assert any("unequal shards" in c.label for c in cases)
        assert sum(c.info["measure"] for c in cases) == 1
    # Seed 1's models only: its reference training (seconds, drawing nothing from
    # the generator) is not what is compared. The grader's own cases (not the
    # store of made_once, which must not keep these).
    monkeypatch.setattr(common, "reference", lambda info, n: None)
    for grader in (zero1_step, zero2_step, zero3_step):
        cases = list(grader.cases(np.random.default_rng(0)))
        other = list(grader.cases.real(np.random.default_rng(1)))
        assert [c.info["seed"] for c in cases] != [c.info["seed"] for c in other]


def test_the_reference_is_data_parallel_adam():
    """The grader's reference equals ringlab.zero.data_parallel_adam, run for real."""
    from ringlab.grading.zero import zero1_step
    case = list(zero1_step.cases(np.random.default_rng(0)))[0]
    info = case.info
    res = ringlab.run(zero.data_parallel_adam, [info["batches"]] * case.world_size,
                      kwargs=dict(sizes=info["sizes"], seed=info["seed"], lr=info["lr"]))
    want = common.final_vector(info, info["ref"])
    assert np.allclose(res.outputs[0][1], want, rtol=0, atol=1e-12)


def test_memory_probe_charges_each_rank_its_own_bytes():
    """Rank 1 keeps a 40 kB array, rank 0 nothing; both free 400 kB of temporaries."""
    import tracemalloc

    def step(comm, x):
        ledger = memory.Ledger()
        probe = memory.MemoryProbe(comm, ledger)
        ledger.step_begin()
        big = np.ones(50_000)
        probe.barrier()                 # the other rank runs in between
        del big
        keep = np.ones(5_000) if comm.rank == 1 else None
        got = probe.sendrecv(x, 1 - comm.rank, 1 - comm.rank)
        del got
        peak, kept = ledger.step_end()
        return np.array([peak, kept, 0.0 if keep is None else keep.sum()])
    was = tracemalloc.is_tracing()
    res = ringlab.run(step, [np.ones(10)] * 2)
    if not was:
        tracemalloc.stop()
    (p0, k0, _), (p1, k1, _) = res.outputs
    assert 400_000 <= p0 < 410_000 and 400_000 <= p1 < 440_000
    assert abs(k0) < 2_000 and 40_000 <= k1 < 42_000


def test_ringlab_grade_bans_ringlab_zero_s_answers_not_its_helpers():
    from ringlab.zero.sharding import padded_size
    from ringlab.data_parallel.sync_sgd import local_gradient
    for exercise in RIGHT:
        banned = banned_answers(exercise)
        assert {"ringlab.zero.zero1:zero1_step", "ringlab.zero.zero3:zero3_step"} <= set(banned)
        assert "answer to zero1_step" in reference_in(cloudpickle.dumps(zero.zero1_step), banned)
        # helpers the chapters use are allowed (the two examples)
        assert reference_in(cloudpickle.dumps(padded_size), banned) is None
        assert reference_in(cloudpickle.dumps(local_gradient), banned) is None
    assert "ringlab.data_parallel.buckets:ddp_sync" not in banned_answers("zero2_step")
    assert "ringlab.data_parallel.buckets:ddp_sync" in banned_answers("zero1_step")


@pytest.mark.parametrize("exercise, program, passes", [
    ("zero1_step", Z.z1_solution, True),
    ("zero1_step", Z.z1_full_master_kept, False),
    ("zero3_step", Z.z3_prefetch, True),
    ("zero3_step", Z.z3_gather_all_up_front, False),
])
def test_isolated_rank_processes_measure_memory_too(exercise, program, passes):
    """Under `ringlab grade` each rank is a process: memory is measured there
    (the case that measures it only, to keep this test short)."""
    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import runner
    import importlib
    import types
    grader = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
    module = types.SimpleNamespace(
        check=grader.check,
        cases=lambda rng: [c for c in grader.cases(rng) if c.info["measure"]])
    cloudpickle.register_pickle_by_value(Z)
    try:
        report = grade_cases(exercise, module, program, seed=0,
                             runner=runner(512, banned_answers(exercise)))
    finally:
        cloudpickle.unregister_pickle_by_value(Z)
    assert report.passed == passes, str(report)
    if not passes:
        assert report.failure.check.startswith("memory"), str(report)


@pytest.mark.parametrize("exercise, program, preload", [
    ("zero3_step", "z3_gather_all_blinded", 0),
    ("zero3_step", "z3_into_a_preloaded_array", 1),
    ("zero1_step", "z1_full_master_kept_blinded", 0),
])
def test_isolated_memory_cannot_be_forged(exercise, program, preload):
    """The tracemalloc ledger runs in the rank's process, so under ringlab grade
    a program can blind it, or fill an array that came with it when it was
    loaded: the grader's reading of each process's resident memory, from
    outside, still fails it."""
    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import runner
    import importlib
    import types
    grader = importlib.import_module(f"ringlab.grading.{GRADERS[exercise]}")
    measured = [c for c in grader.cases(np.random.default_rng(0)) if c.info["measure"]]
    module = types.SimpleNamespace(check=grader.check, cases=lambda rng: measured)
    if preload:
        Z._PRELOADED["store"] = np.ones(sum(measured[0].info["pads"]))   # touched: resident
    cloudpickle.register_pickle_by_value(Z)
    try:
        report = grade_cases(exercise, module, getattr(Z, program), seed=0,
                             runner=runner(512, banned_answers(exercise)))
    finally:
        cloudpickle.unregister_pickle_by_value(Z)
        Z._PRELOADED.clear()
    assert not report.passed, str(report)
    assert report.failure.check == "memory: the rank's process, read from outside", str(report)
    # In one process the blinded ledger fools the self-check: it is the learner's own.
    if not preload:
        assert grade_cases(exercise, module, getattr(Z, program), seed=0).passed
