"""The ``moe_dispatch_combine`` grader: right programs pass, each wrong one fails the
check that names its mistake, cheats fail, and the self-check and ``ringlab grade``'s
isolated ranks agree (programs in tests/programs/moe.py)."""

import types

import cloudpickle
import numpy as np
import pytest

import ringlab
from ringlab.backends.isolated import runner
from ringlab.frontier import expert_parallel as ep
from ringlab.grading.frontier import moe_dispatch_combine as MD
from ringlab.grading.kit.loop import grade_cases
from ringlab.grading.trusted import banned_answers, reference_in
from ringlab.nn import MoE

import programs.moe as P

ID = "moe_dispatch_combine"
RIGHT = [P.reference, P.solution, P.empty_blocks_too, P.tokens_in_reverse, P.all_counts,
         P.pairwise_float_counts]
VALUES = "every rank returns y = sum_i gates[t, i] * expert_i(x_t)"
NOWHERE = "no token goes to a rank that does not hold its expert"
# (program, check, phrases in the report)
WRONG = [
    (P.no_gate, VALUES, ["summed without their gates", "y[t] += gates[t, i] * out_i[t]"]),
    (P.token_order_back, VALUES, ["its share of expert 3", "is expert 3's output for token 1",
                                  "in the order they were sent"]),
    (P.skips_counts, "a counts exchange first",
     ["rank 0's first message to rank 1 carries rows", "the counts exchange was skipped",
      "rank 0's counts for rank 1's experts 2, 3: [2, 2]"]),
    (P.ring_counts, "a counts exchange first",
     ["the counts of several ranks, as a ring AlltoAll forwards them", "directly"]),
    (P.argsort_top_k, "dropped tokens are not sent",
     ["they count the assignments the capacity dropped", "not by the k largest"]),
    (P.residual_for_dropped, VALUES, ["were all dropped by capacity, and it got the token itself",
                                      "gets 0 from this layer"]),
    (P.renormalised, VALUES, ["the gates renormalised", "nothing is renormalised"]),
    (P.own_experts_forgotten, VALUES, ["lacks expert 0's share, on rank 0",
                                       "one of this rank's own experts"]),
    (P.round_robin_owner, "each rank applies only its own experts",
     ["rank 0 called expert(4, ...), but it holds experts 0..1 only"]),
    (P.computes_everything, "every expert computes exactly its tokens",
     ["expert 1 (on rank 0) computed 4 rows; 0 assignments go to it"]),
    (P.everything_to_everyone, NOWHERE,
     ["rank 0 sent every rank all its 6 tokens", "8 more columns each: their gates?",
      "only 4 row(s) go to rank 1's experts (2, 3)", "keep the gates home"]),
    (P.local_from_globals, "a counts exchange first", ["rank 0 sent rank 1 nothing"]),
    (P.nan_row, VALUES, ["rank 0: 1 of 6 tokens wrong, the first token 0", "[nan,"]),
]


@pytest.mark.parametrize("program", RIGHT, ids=[p.__name__ for p in RIGHT])
@pytest.mark.parametrize("seed", [0, 5])
def test_right_programs_pass(program, seed):
    report = ringlab.grade(ID, program, seed=seed, log=False)
    assert report.passed, str(report)
    assert report.cases_total == len(MD.SHAPES) and report.world_sizes == tuple(range(1, 9))


@pytest.mark.parametrize("program, check, phrases", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_programs_fail_with_the_mistake_named(program, check, phrases):
    report = ringlab.grade(ID, program, seed=0, log=False)
    text = str(report)
    assert not report.passed and report.failure.check == check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    assert "np.float64(" not in text and "moe_dispatch_combine.py" not in text


def test_cases_cover_the_promised_worlds_gates_capacity_and_zero_counts():
    cases = list(MD.cases(np.random.default_rng(0)))
    assert sorted(c.world_size for c in cases) == [1, 2, 2, 3, 4, 5, 6, 7, 8]
    assert {c.info["top_k"] for c in cases} == {1, 2} and {c.info["per"] for c in cases} == {1, 2}
    plans = [MD.Plan(c) for c in cases]
    # capacity overflows: dropped assignments, and tokens every expert dropped
    assert sum(len(d) for c in cases for d in c.info["dropped"]) > 20
    assert any(not g.any(axis=1).all() for c in cases for _, g, *_ in c.inputs)
    assert any(len(x) == 0 for c in cases for x, *_ in c.inputs)            # a rank without tokens
    for case, plan in zip(cases, plans):
        e = case.world_size
        if e > 1:            # pairs with nothing between them, in every multi-rank case
            assert any(not plan.tokens[s][d] for s in range(e) for d in range(e) if s != d)
    assert any(not any(plan.tokens[s][d] for s in range(c.world_size))        # receives nothing
               for c, plan in zip(cases, plans) for d in range(c.world_size) if c.world_size > 1)
    # the data come from the seed: a program cannot tell the grader's cases apart
    sizes = {s: [tuple(len(x) for x, *_ in c.inputs) for c in MD.cases(np.random.default_rng(s))]
             for s in range(3)}
    assert len({tuple(v) for v in sizes.values()}) == 3


def test_the_graders_moe_is_ringlab_nn_moe_in_one_process():
    """The grader's one-process y (its numpy experts, the gates of ``route``) is what
    ``ringlab.nn.MoE`` computes, when the experts are the MoE's: the same formula."""
    moe = MoE(dim=3, hidden=5, n_experts=4, top_k=2, rng=np.random.default_rng(1),
              capacity_factor=1.0)
    x = np.random.default_rng(2).standard_normal((7, 3))
    want = moe.forward(x)
    gates = moe.routing.dense_gates()
    y = np.zeros_like(x)
    for i, layer in enumerate(moe.experts.layers):
        y += gates[:, i:i + 1] * layer.forward(x)
    assert np.abs(y - want).max() < 1e-12


def test_the_plan_is_what_the_reference_sends():
    """Independent of the checks: the reference's trace holds, per pair, the counts
    message and exactly the rows the grader's plan says."""
    case = next(MD.cases(np.random.default_rng(0)))
    plan = MD.Plan(case)
    res = ringlab.run(lambda comm, inp: MD.drive(comm, inp, case.info["per"], P.reference),
                      case.inputs, args=(), record_payloads=True)
    e = case.world_size
    for s in range(e):
        for d in range(e):
            if s != d:
                sent = [res.payload(ev) for ev in res.trace if (ev.src, ev.dst) == (s, d)]
                assert sent[0].tolist() == plan.counts[s][plan.owned(d)].tolist()
                assert sum(len(p) for p in sent[1:]) == len(plan.tokens[s][d]) + len(plan.tokens[d][s])


def test_trusted_grading_bans_the_reference_and_its_dispatch_and_combine():
    banned = banned_answers(ID)
    for name in ("moe_dispatch_combine", "dispatch", "combine", "send_back", "alltoallv"):
        assert f"ringlab.frontier.expert_parallel:{name}" in banned
        assert reference_in(cloudpickle.dumps(getattr(ep, name)), banned)
    assert "ringlab.collectives.alltoall:alltoall" not in banned       # Part 1: a tool here
    notebook = {"__name__": "__main__"}
    exec("from ringlab.frontier.expert_parallel import dispatch, combine\n"
         "def cheat(comm, tokens, gates, expert):\n"
         "    plan, inputs = dispatch(comm, tokens, gates)\n"
         "    return combine(comm, plan, [expert(i, x) for i, x in enumerate(inputs)], gates)[0]\n",
         notebook)
    assert "answer to moe_dispatch_combine" in reference_in(cloudpickle.dumps(notebook["cheat"]),
                                                            banned)


def _isolated(program, picks=(0, 3)):
    cases = list(MD.cases(np.random.default_rng(0)))
    # (no causality repeats here: 1 + N more runs of N processes each; the self-check does them)
    module = types.SimpleNamespace(cases=lambda rng: [cases[i] for i in picks], check=MD.check,
                                   causality_case=lambda cases: None)
    return grade_cases(ID, module, program, seed=0, runner=runner(banned=banned_answers(ID)))


def test_isolated_ranks_pass_the_solution_and_stop_the_reference_and_the_cheats():
    cloudpickle.register_pickle_by_value(P)
    try:
        assert _isolated(P.solution).passed
        report = _isolated(P.reference, picks=(0,))
        assert not report.passed and "own answer to moe_dispatch_combine" in str(report)
        shared = _isolated(P.local_from_globals, picks=(0,))       # no globals across processes
        assert not shared.passed and shared.failure.check == "the program runs without error"
        # the same verdict as the self-check, for a wrong program
        wrong = _isolated(P.no_gate, picks=(0,))
        assert wrong.failure.check == ringlab.grade(ID, P.no_gate, seed=0, log=False).failure.check
        assert "summed without their gates" in str(wrong)
    finally:
        cloudpickle.unregister_pickle_by_value(P)


def test_a_timeout_shows_the_learner_s_frames_not_the_driver_s():
    """An endless loop is stopped with the traceback of where it ran: the learner's
    frames, never the grader's driver (a red team's finding: `drive` showed)."""
    from ringlab.grading.kit.running import run_case
    import functools

    def endless(comm, tokens, gates, expert):
        while True:
            pass
    case = next(MD.cases(np.random.default_rng(0)))
    _, failure = run_case(functools.partial(MD.drive, learner=endless), case, "sim",
                          timeout=0.5)
    assert failure.check == "the program finishes"
    assert "in endless" in failure.what and "stopped here by the time limit" in failure.what
    assert "in drive" not in failure.what
    assert "ringlab/grading/frontier/moe_dispatch_combine.py" not in failure.what


def test_each_wrong_token_message_gets_its_own_report():
    """``_bad_tokens`` on hand-made messages of rank 0 to rank 1 (rank 1 holds expert
    1; tokens 0 and 2 go there; token 3's assignment to expert 1 was dropped): a
    token sent with no assignment there, a dropped one, everything, a missing one."""
    from types import SimpleNamespace as NS
    gates = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    plan = NS(tokens={0: {1: [0, 2]}}, x={0: np.zeros((4, 2))}, gates={0: gates},
              owned=lambda d: range(d, d + 1))
    case = NS(label="a case", info={"dropped": {0: [(3, 1)]}})
    ev = NS(src=0, dst=1)

    def check(ids):
        return MD._bad_tokens(case, plan, ev, ids, "", "tokens [0, 2]", set())
    assert check([0, 1, 2]).check == NOWHERE and "token 1, which goes to expert(s) [0]" in (
        check([0, 1, 2]).what)
    assert check([0, 2, 3]).check == "dropped tokens are not sent"
    assert "token 3, whose assignment to expert 1 was dropped" in check([0, 2, 3]).what
    assert check([0, 1, 2, 3]).check == "dropped tokens are not sent"       # the named cause
    assert check([0]).check == "one message of tokens per pair of ranks"
    assert "token 2 is not in it" in check([0]).what
