"""The ``moe_dispatch_combine`` grader: right programs pass, each wrong one fails the
check that names its mistake, cheats fail, and the self-check and ``ringlab grade``'s
isolated ranks agree (programs in tests/programs/moe.py)."""

import sys
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
from programs.reports import assert_fails
from ringlab.collectives import alltoall

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


# -- a red team's wrong programs whose first reason named another cause (written anew) ---

def _gates_ignored(comm, tokens, gates, expert):
    """Adds the experts' outputs without their gates. A token left with one expert after
    a drop looks the same as with its gates renormalised: the other tokens decide."""
    return P._moe(comm, tokens, gates, expert, gated=False)


def _largest_k(comm, tokens, gates, expert):
    """Routes each token to its k largest gates, the last expert first among equal ones:
    where a drop left fewer than k nonzero gates, an expert of gate 0 gets it too."""
    k = int((gates != 0).sum(axis=1).max(initial=1))
    top = np.argsort(gates, axis=1, kind="stable")[:, ::-1][:, :k]
    return P._moe(comm, tokens, gates, expert,
                  route=lambda g: [np.flatnonzero((top == i).any(axis=1)) for i in range(g.shape[1])])


def _small_gates_skipped(comm, tokens, gates, expert):
    """Sends a token only to the experts whose gate is above 0.2."""
    return P._moe(comm, tokens, gates, expert,
                  route=lambda g: [np.flatnonzero(g[:, i] > 0.2) for i in range(g.shape[1])])


def _totals_only(comm, tokens, gates, expert):
    """Tells each rank only how many rows come in all (a 0-d array), and splits what
    arrives evenly over the experts."""
    e, me, E = comm.world_size, comm.rank, gates.shape[1]
    per = E // e
    rows = [np.flatnonzero(gates[:, i]) for i in range(E)]
    mine = [range(d * per, (d + 1) * per) for d in range(e)]
    sizes = [sum(len(rows[i]) for i in m) for m in mine]
    got = [int(n) for n in alltoall(comm, [np.array(n) for n in sizes])]     # BUG: totals
    guess = [np.array_split(np.arange(n), per) for n in got]
    blocks = [np.concatenate([tokens[rows[i]] for i in m]) for m in mine]
    arrived = P._exchange(comm, blocks, got)
    back = [[] for _ in range(e)]
    for j, i in enumerate(mine[me]):
        parts = [arrived[s][guess[s][j]] for s in range(e)]
        out = expert(i, np.concatenate(parts))
        for s, part in enumerate(np.split(out, np.cumsum([len(p) for p in parts])[:-1])):
            back[s].append(part)
    returned = P._exchange(comm, [np.concatenate(b) for b in back], sizes)
    y = np.zeros_like(tokens)
    for d, m in enumerate(mine):
        for i, part in zip(m, np.split(returned[d], np.cumsum([len(rows[i]) for i in m])[:-1])):
            y[rows[i]] += gates[rows[i], i][:, None] * part
    return y


def _outputs_in_float32(comm, tokens, gates, expert):
    """The experts' outputs made float32: they travel back rounded."""
    return P._moe(comm, tokens, gates, lambda i, x: expert(i, x).astype(np.float32))


@pytest.mark.parametrize("seed", range(12))
def test_no_gates_is_named_even_where_a_rank_s_tokens_all_fit_renormalised_gates_too(seed):
    """(Seeds 1, 4, 7, 8, ... said "renormalised" before: with one expert left a
    token's renormalised gate is 1.) Renormalised gates are still named as such."""
    assert_fails(ringlab.grade(ID, _gates_ignored, seed=seed, log=False), VALUES,
                 ["the experts' outputs summed without their gates", "y[t] += gates[t, i]"],
                 absent=["renormalised"])
    assert_fails(ringlab.grade(ID, P.renormalised, seed=seed, log=False), VALUES,
                 ["the gates renormalised over the experts it reached"])


@pytest.mark.parametrize("program, check, phrases", [
    (_largest_k, "dropped tokens are not sent",
     ["rank 0 told rank 3 the counts [1, 3] for rank 3's experts 6, 7, but [0, 0] of its "
      "rows have a nonzero gate for them: it sent token 3 there, which goes to no expert "
      "(its assignments to experts 3, 4 were dropped by the capacity)",
      "not by the k largest"]),
    (_small_gates_skipped, "a token goes to exactly the experts of its nonzero gates",
     ["rank 0 told rank 2 the counts [1, 0] for rank 2's experts 4, 5, but [2, 0] of its "
      "rows have a nonzero gate for them: it did not send token 1 there, whose gate for "
      "expert 4 is 0.185, nonzero", "route by gates != 0"]),
    (_totals_only, "a counts exchange first",
     ["rank 0's first message to rank 1 carries one number, 4 (shape ()): the total of its "
      "rows for rank 1, not one count per expert of rank 1 (experts 2, 3)",
      "cannot split what arrives"]),
    (_outputs_in_float32, "tokens and outputs travel as float64",
     ["at step 6 rank 0 sent its experts' outputs for rank 1's tokens to rank 1 as float32: "
      "float32 rounds the values on the way, to about 1e-07 of their size", "no astype"]),
], ids=["largest_k", "small_gates_skipped", "totals_only", "outputs_in_float32"])
def test_a_wrong_message_is_named_before_the_result_it_spoils(program, check, phrases):
    assert_fails(ringlab.grade(ID, program, seed=0, log=False), check, phrases)


# -- a second red team's wrong programs whose first reason was vague (written anew) -------

def _split_moe(comm, tokens, gates, expert, *, experts_reversed=False, outputs_3d=False,
               one_total=False):
    """The dispatch and combine with a mistake: the pieces of what arrives given to this
    rank's experts last one first; the outputs sent back as (rows, 1, d) arrays; or the
    counts as one total per rank, all of it taken as the first expert's rows."""
    e, me, E = comm.world_size, comm.rank, gates.shape[1]
    per, width = E // e, tokens.shape[1]
    rows = [np.flatnonzero(gates[:, i]) for i in range(E)]
    mine = [list(range(d * per, (d + 1) * per)) for d in range(e)]
    counts = [np.array([len(rows[i]) for i in m]) for m in mine]
    if one_total:
        totals = alltoall(comm, [np.array([c.sum()]) for c in counts])
        got = [np.array([int(t[0])] + [0] * (per - 1)) for t in totals]
    else:
        got = alltoall(comm, counts)
    blocks = [np.concatenate([tokens[rows[i]] for i in m]) for m in mine]
    arrived = P._exchange(comm, blocks, [g.sum() for g in got])
    pieces = [np.split(arrived[s], np.cumsum(got[s])[:-1]) for s in range(e)]
    back = [[] for _ in range(e)]
    for j, i in enumerate(mine[me][::-1] if experts_reversed else mine[me]):
        parts = [pieces[s][j] for s in range(e)]
        out = expert(i, np.concatenate(parts))
        for s, part in enumerate(np.split(out, np.cumsum([len(p) for p in parts])[:-1])):
            back[s].append(part)
    back = [np.concatenate(b) for b in back]
    if outputs_3d:
        recvs = {s: comm.irecv(s) for s in range(e) if s != me and counts[s].sum()}
        for req in [comm.isend(back[d][:, None, :], d) for d in range(e)
                    if d != me and len(back[d])]:
            req.wait()
        returned = [back[s] if s == me else recvs[s].wait().reshape(-1, width)
                    if s in recvs else np.zeros((0, width)) for s in range(e)]
    else:
        returned = P._exchange(comm, back, [c.sum() for c in counts])
    y = np.zeros_like(tokens)
    for d, m in enumerate(mine):
        for i, part in zip(m, np.split(returned[d], np.cumsum(counts[d])[:-1])):
            y[rows[i]] += gates[rows[i], i][:, None] * part
    return y


def _experts_swapped(comm, tokens, gates, expert):
    return _split_moe(comm, tokens, gates, expert, experts_reversed=True)


def _outputs_3d(comm, tokens, gates, expert):
    return _split_moe(comm, tokens, gates, expert, outputs_3d=True)


def _one_total(comm, tokens, gates, expert):
    return _split_moe(comm, tokens, gates, expert, one_total=True)


def test_rows_given_to_the_wrong_expert_where_they_arrive_are_named():
    """(It said "a row that is no gated sum of this rank's experts' outputs".)"""
    assert_fails(ringlab.grade(ID, _experts_swapped, seed=0, log=False),
                 "every expert computes exactly its tokens",
                 ["rank 0 applied expert 1 to rank 1's token 3, which goes to expert(s) [0] "
                  "only: rank 1's tokens reached rank 0 right at step 4, but rank 0 split them "
                  "among its experts wrongly (at step 6 it sent that output back to rank 1)",
                  "expert 0: tokens [3]; expert 1: tokens []", "expert 1's output for token 3",
                  "give the j-th piece to your j-th expert"], absent=["no gated sum"])


def test_the_right_rows_in_a_3d_array_are_named_with_the_2d_shape_expected():
    """(It said only "sent rank 1 an array of shape (1, 1, 5), dtype float64".)"""
    assert_fails(ringlab.grade(ID, _outputs_3d, seed=0, log=False),
                 "only tokens and their outputs travel, after the counts",
                 ["at step 6 rank 0 sent rank 1 its experts' 1 output row(s) for rank 1's "
                  "tokens as a 3-D array of shape (1, 1, 5): the right rows, but not a 2-D array "
                  "of shape (1, 5)",
                  "Send each block as the 2-D (rows, d) array it is"])


def test_one_total_is_shown_on_a_pair_whose_total_is_not_0():
    """On seed 21 rank 0 sends ranks 1 and 2 no rows: the report showed their total, 0,
    on the first pair; it shows rank 0's total for rank 3 now."""
    case = next(MD.cases(np.random.default_rng(21)))
    plan = MD.Plan(case)
    assert [plan.counts[0][plan.owned(d)].sum() for d in (1, 2, 3)] == [0, 0, 4]
    assert_fails(ringlab.grade(ID, _one_total, seed=21, log=False), "a counts exchange first",
                 ["rank 0's first message to rank 3 carries one number, 4 (shape (1,)): the "
                  "total of its rows for rank 3, not one count per expert of rank 3 (experts "
                  "6, 7)"], absent=["one number, 0"])


@pytest.mark.parametrize("program, check", [
    (_outputs_in_float32, "tokens and outputs travel as float64"),
    (_experts_swapped, "every expert computes exactly its tokens"),
], ids=["outputs_in_float32", "experts_swapped"])
def test_isolated_ranks_give_the_self_checks_first_reason(program, check):
    """``ringlab grade``'s isolated ranks give the same first reason as in process."""
    cloudpickle.register_pickle_by_value(P)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        report = _isolated(program, picks=(0,))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        cloudpickle.unregister_pickle_by_value(P)
    same = ringlab.grade(ID, program, seed=0, log=False).failure
    assert report.failure.check == same.check == check
    assert report.failure.what == same.what
