"""The ``hsdp_step`` grader (Part 7): right programs pass, in one process and in
isolated rank processes; each wrong one fails with the check that names its
mistake; cheats fail; its closed form is what the library's reference sends
(programs in tests/programs/hsdp.py)."""

import types

import cloudpickle
import numpy as np
import pytest

import ringlab
from ringlab.frontier.hsdp import hsdp_adam, hsdp_bytes
from ringlab.grading.frontier import hsdp_step as G
from ringlab.grading.kit.loop import grade_cases
from ringlab.grading.trusted import banned_answers, reference_in
from ringlab.grading.kit import sharded as common
from ringlab.zero import data_parallel_adam

import programs.hsdp as P

ID = "hsdp_step"
CASES = list(G.cases(np.random.default_rng(0)))
FIRST, SMALL, MEASURED = CASES[0], CASES[1], CASES[-1]


def only(*cases):
    """The grader with some of its cases (each grade of all 8 takes seconds)."""
    return types.SimpleNamespace(check=G.check, cases=lambda rng: list(cases),
                                 causality_case=G.causality_case,
                                 DEPENDS_ON_ALL=G.DEPENDS_ON_ALL)


def grade(program, module=None, **kw):
    if module is None:
        return ringlab.grade(ID, program, seed=0, log=False)
    return grade_cases(ID, module, program, seed=0, **kw)


def test_the_solution_passes_every_case():
    report = grade(P.solution)
    assert report.passed, str(report)
    assert report.cases_total == 8 and report.world_sizes == (1, 4, 6, 8)


@pytest.mark.parametrize("program", [P.prefetch, P.sum_then_divide, P.replicas_deferred],
                         ids=lambda p: p.__name__)
def test_other_right_programs_pass(program):
    report = grade(program, only(*CASES[:6]))
    assert report.passed, str(report)


GROUPS = "every message stays in a shard group or a replicate group"
PARAMS = "parameters equal data-parallel Adam"
WRONG = [
    (P.allreduce_world, GROUPS,
     ["rank 2 (replica 0, shard 2) sent rank 3 (replica 1, shard 0)", "on the world comm",
      "no collective over all ranks"]),
    (P.groups_swapped, "the program runs without error",
     ["could not broadcast input array from shape (52,) into shape (35,)",
      "a ReduceScatter over mesh.group('replicate') (R ranks)"]),
    (P.allreduce_first, "only 1/S of the gradient crosses the replicate group",
     ["a piece of a unit's WHOLE gradient", "1/S = 1/3 shard"]),
    (P.no_replica_allreduce, PARAMS,
     ["summed over replica 0's own shard group only", "no AllReduce across the replicas"]),
    (P.divided_by_replicas, PARAMS, ["averaged over the replicas as well (divided by R"]),
    (P.replica_batch_weight, PARAMS, ["the share of one replica's rows (times R)"]),
    (P.equal_weights, PARAMS, ["weighted equally (1/N)"]),
    (P.gather_once, "bytes per group: HSDP's closed form",
     ["sent 2160 bytes of AllGather messages in its shard group",
      "gathered once per step, for forward only", "= 4320 bytes per rank"]),
]


@pytest.mark.parametrize("program, check, phrases", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_programs_fail_with_the_mistake_named(program, check, phrases):
    report = grade(program, only(FIRST))
    text = str(report)
    assert not report.passed and report.failure.check == check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    assert "np.float64(" not in text and "hsdp_step.py" not in text


def test_memory_is_measured():
    P.KEPT.clear()
    report = grade(P.gather_all_up_front, only(MEASURED))
    P.KEPT.clear()
    check = "memory: peak per rank within HSDP's bound"
    assert not report.passed and report.failure.check == check, str(report)
    assert "times its largest unit" in str(report) and "25 units, memory measured" in str(report)


# The two cheats of tests/grading/test_grader_cheats.py for this grader (its
# CHEATS_GRADED_THERE), graded once, here, by the whole grader as a learner's
# self-check grades them: the first case that fails is the one named.
CHEATS = [
    (P.zeros_and_shared_memory, "every message carries parameters or gradients",
     ["Got:      [0, 0, 0, 0, ...]", "in its shard group: neither one rank's shard"]),
    (P.full_params_kept, "memory: what a rank keeps between steps",
     ["copies of the whole model", "25 units, memory measured",
      "keeps only its shards and its 1/S"]),
]


@pytest.mark.parametrize("program, check, phrases", CHEATS, ids=[c[0].__name__ for c in CHEATS])
def test_cheats_fail_on_what_the_messages_carry_and_the_memory_kept(program, check, phrases):
    P.SHARED.clear()
    P.KEPT.clear()
    report = grade(program)
    P.SHARED.clear()
    P.KEPT.clear()
    text = str(report)
    assert not report.passed and report.failure.check == check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    assert "np.float64(" not in text


def test_an_allgather_that_sends_its_own_shard_again_and_again_fails():
    """Real parameters, the right sizes and counts, but each message the sender's
    own shard: the others' shards came outside the messages."""
    P.SHARED.clear()
    report = grade(P.own_shard_repeated, only(FIRST))
    P.SHARED.clear()
    assert report.failure.check == "each AllGather delivers every other shard once", str(report)
    assert "received shards 2 x4" in str(report) and "shards 1 x2, 2 x2" in str(report)


def test_trusted_grading_bans_the_reference_and_zero3_but_not_part1():
    banned = banned_answers(ID)
    assert {"ringlab.frontier.hsdp:hsdp_step", "ringlab.zero.zero3:zero3_step"} <= set(banned)
    assert "ringlab.collectives.allreduce:ring_allreduce" not in banned
    cloudpickle.register_pickle_by_value(P)      # as `ringlab grade` sends a notebook's
    try:
        found = {f.__name__: reference_in(cloudpickle.dumps(f), banned)
                 for f in (P.calls_the_reference, P.calls_zero3, P.solution)}
    finally:
        cloudpickle.unregister_pickle_by_value(P)
    assert "answer to hsdp_step" in found["calls_the_reference"]
    assert "answer to zero3_step" in found["calls_zero3"]
    assert found["solution"] is None


def test_isolated_rank_processes_pass_the_solution_and_stop_the_cheats():
    """`ringlab grade`'s runner: a process per rank, the answers banned (on the 2 x 2
    mesh, the smallest with both groups: a process per rank costs)."""
    from ringlab.backends.isolated import runner
    cloudpickle.register_pickle_by_value(P)
    try:
        run = runner(512, banned_answers(ID))
        report = grade(P.solution, only(SMALL), runner=run)
        assert report.passed, str(report)
        # a wrong program: the same verdict as in one process
        report = grade(P.allreduce_world, only(SMALL), runner=runner(512, banned_answers(ID)))
        assert report.failure.check == GROUPS, str(report)
        for cheat, words in ((P.calls_the_reference, "own answer to hsdp_step"),
                             (P.calls_zero3, "answer to zero3_step")):
            report = grade(cheat, only(SMALL), runner=runner(512, banned_answers(ID)))
            assert not report.passed and words in str(report), str(report)
    finally:
        cloudpickle.unregister_pickle_by_value(P)


@pytest.mark.parametrize("R, S", [(2, 2), (2, 3), (3, 2), (1, 4), (4, 1), (2, 4)])
def test_the_reference_sends_the_closed_form_and_equals_data_parallel_adam(R, S):
    """Counted on the library reference's own trace, by endpoints: inside a row
    (a shard group) and inside a column (a replicate group), nothing else."""
    data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=4, out=2)
    batches = [b for _, b in zip(range(2), data.batches(10))]
    kw = dict(sizes=[4, 9, 2], seed=1, lr=0.01)
    res = ringlab.run(hsdp_adam, [batches] * (R * S), kwargs=dict(kw, shape=(R, S)))
    ref = ringlab.run(data_parallel_adam, [batches] * (R * S), kwargs=kw)
    assert np.allclose(res.outputs[0][1], ref.outputs[0][1], rtol=0, atol=1e-12)
    events = [e for e in res.trace if "full_parameters" not in e.span]
    closed = hsdp_bytes([4 * 9 + 9, 9 * 2 + 2], R, S)
    for r in range(R * S):
        row = sum(e.nbytes for e in events if e.src == r and e.dst // S == r // S)
        column = sum(e.nbytes for e in events if e.src == r and e.dst % S == r % S)
        assert row == 2 * closed["shard_per_rank"]
        assert abs(column - 2 * closed["replicate_per_rank"]) <= 2 * 2 * (R - 1) * 8 * 2
    assert all(e.dst // S == e.src // S or e.dst % S == e.src % S for e in events)
    across = sum(e.nbytes for e in events if e.dst // S != e.src // S)
    assert across == 2 * closed["cross_node_total"]


def test_cases_are_hidden_and_cover_the_meshes():
    meshes = [c.info["mesh"] for c in CASES]
    assert {(2, 2), (2, 3), (3, 2), (1, 4), (4, 1), (2, 4)} <= set(meshes)
    assert sum(c.info["measure"] for c in CASES) == 1 and MEASURED.info["mesh"] == (2, 2)
    assert all("unequal shards" in c.label for c in CASES if c.world_size > 1)
    assert any(p % c.info["mesh"][1] for c in CASES for p in [c.info["numel"]])
    other = list(G.cases(np.random.default_rng(1)))
    assert [c.info["seed"] for c in CASES] != [c.info["seed"] for c in other]
    assert G.causality_case(CASES).info["mesh"] == (2, 2)


def test_the_graders_reference_is_data_parallel_adam():
    info = FIRST.info
    res = ringlab.run(data_parallel_adam, [info["batches"]] * FIRST.world_size,
                      kwargs=dict(sizes=info["sizes"], seed=info["seed"], lr=info["lr"]))
    assert np.allclose(res.outputs[0][1], common.final_vector(info, info["ref"]),
                       rtol=0, atol=1e-12)


def never_gathers(comm, mesh, model, opt, x, y, batch_size):
    """Forward on units whose parameters were never gathered (None): numpy says
    "x @ None: not enough dimensions", with no 'NoneType' in it (a red team's program)."""
    for unit in model.units:
        for layer in unit.layers:
            x = layer.forward(x)
    return 0.0


def test_a_unit_never_gathered_is_named_even_when_numpy_does_not_say_none():
    report = grade(never_gathers)
    assert not report.passed and report.failure.check == "the program runs without error"
    assert "has no parameters (None) unless you gathered them" in str(report), str(report)


def _divided_by(axis):
    """The solution with the mean gradient divided by the size of one mesh axis
    instead of weighted by len(x) / batch_size (a red team's program: not named)."""
    def step(comm, mesh, model, opt, x, y, batch_size):
        return P.solution(comm, mesh, model, opt, x, y, batch_size,
                          weight=lambda rows, b, mesh: 1 / mesh.group(axis).world_size)
    return step


@pytest.mark.parametrize("axis, letter", [("shard", "S"), ("replicate", "R")])
def test_a_gradient_divided_by_one_axis_is_named(axis, letter):
    report = grade(_divided_by(axis))
    assert not report.passed and report.failure.check == "parameters equal data-parallel Adam"
    assert f"each rank's mean gradient divided by {letter}" in str(report), str(report)


def test_a_bucketed_replicate_allreduce_is_told_the_grader_reads_one_unit_per_allreduce():
    """A limit, stated: one AllReduce of every unit's shard is right HSDP, but the
    exercise grades one AllReduce per unit, and the report's hint says so."""
    report = grade(P.bucketed_replicate_allreduce)
    assert not report.passed and report.failure.check == "every message carries parameters or gradients"
    assert "in its replicate group" in str(report) and "(a bucket" in str(report), str(report)
