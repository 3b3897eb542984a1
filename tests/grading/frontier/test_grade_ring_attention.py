"""The ``ring_attention`` grader: right programs pass (in the notebook's self-check and
in isolated rank processes, as ``ringlab grade`` runs them); each wrong one fails the
check that names its mistake; the cheats fail; its numbers are checked against the
library's block attention and the reference's trace (programs in tests/programs/)."""

import types

import cloudpickle
import numpy as np
import pytest

import ringlab
from ringlab.backends.isolated import runner
from ringlab.frontier import ring_attention as library
from ringlab.frontier.blockwise import block_attention
from ringlab.grading.frontier import ring_attention as RA
from ringlab.grading.kit.loop import grade_cases
from ringlab.grading.trusted import banned_answers, reference_in

import programs.ring_attention as P

ID = "ring_attention"
RESULT = "every rank's output equals attention over the whole sequence"
CONTENTS = "messages carry whole K/V blocks of one rank"
MEMORY = "memory: peak per rank, measured"


def grade(program, seed=0):
    P.SHARED.clear()
    return ringlab.grade(ID, program, seed=seed, log=False)


@pytest.mark.parametrize("program", P.RIGHT, ids=[p.__name__ for p in P.RIGHT])
def test_right_programs_pass(program):
    report = grade(program)
    assert report.passed, str(report)
    assert report.cases_total == 18 and report.world_sizes == (1, 2, 3, 4, 5, 6, 7, 8, 16)


def test_the_solution_passes_on_another_seed():
    assert grade(P.solution, seed=7).passed


# (program, check, phrases in the report)
WRONG = [
    (P.no_rescale, RESULT, ["rank 1's output is wrong", "without the log-sum-exp rescale",
                            "Ranks with the right output: 0.", "logaddexp(lse, lse_b)"]),
    (P.no_correction, RESULT, ["forgot the factor exp(m_old - m_new)"]),
    (P.local_mask, RESULT, ["positions inside each block", "instead of global positions",
                            "Compare global positions"]),
    (P.local_mask_skipping, RESULT, ["later ranks' blocks rightly skipped",
                                     "positions inside each block", "Compare global positions"]),
    (P.two_ranks_on, "messages go only between ring neighbours",
     ["rank 0 sent to rank 2, which is not its neighbour"]),
    (P.wrong_direction, RESULT, ["masked with the positions of the block coming the other way",
                                 "passing left, (rank + t) % c's"]),
    (P.last_only, RESULT, ["the last block's result only", "replaced the one before"]),
    (P.no_scale, RESULT, ["not scaled by 1/sqrt(head_dim)"]),
    (P.one_hop_short, RESULT, ["rank 3's output is wrong", "rank 0's block left out",
                               "fewer than c - 1 hops"]),
    (P.skips_in_both, RESULT, ["later ranks' blocks skipped, with causal=False"]),
    (P.diagonal_unmasked, RESULT, ["own block attended to without the mask"]),
    (P.naive_exp, RESULT, ["large scores", "nan or inf", "subtract the running max"]),
]


def assert_fails_naming(program, check, phrases):
    """The report of ``program`` fails at ``check`` and holds every phrase; returns its text."""
    report = grade(program)
    text = str(report)
    assert not report.passed and report.failure.check == check, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    return text


@pytest.mark.parametrize("program, check, phrases", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_programs_fail_with_the_mistake_named(program, check, phrases):
    text = assert_fails_naming(program, check, phrases)
    assert "np.float64(" not in text and "ring_attention.py" not in text


CHEATS = [
    (P.allgather_library, "K/V travel one block per hop, never gathered",
     ["'ring_allgather': K/V gathered with an AllGather", "all-gather context parallelism"]),
    (P.allgather_by_hand, MEMORY, ["memory measured", "K/V blocks of",
                                   "the whole sequence's K and V: 32 blocks", "at most 14 K/V"]),
    (P.allgather_lean, MEMORY, ["the whole sequence's K and V: 32 blocks"]),
    (P.values_and_scores_kept, MEMORY, ["world_size=16", "at most 14 K/V blocks"]),
    (P.scores_row_kept, MEMORY, ["a query's whole row of scores: 16 blocks",
                                 "at most 14 K/V blocks and 4 blocks of scores"]),
    (P.whole_sequence, CONTENTS, ["at step 2 rank 0 sent rank 1 blocks of ranks 0, 3 in one "
                                  "message: a gather of the sequence"]),
    (P.globals_numpy, "every rank passes on c - 1 K/V blocks",
     ["rank 0 sent nothing", "only messages can bring them"]),
    # the ring's messages for show: in one process the output from the dict is right,
    # but the dict holds every rank's blocks at once
    (P.globals_and_ring, MEMORY, ["the whole sequence's K and V: 32 blocks"]),
]


@pytest.mark.parametrize("program, check, phrases", CHEATS, ids=[c[0].__name__ for c in CHEATS])
def test_cheats_fail(program, check, phrases):
    assert_fails_naming(program, check, phrases)


def test_queries_partial_outputs_and_reused_blocks_are_read_from_the_payloads():
    """Messages that are not one rank's K/V blocks, or that a receiver already holds."""
    def send(what):
        def program(comm, q, k, v, causal):
            c, r = comm.world_size, comm.rank
            out = P.solution(comm, q, k, v, causal)
            for _ in range(c - 1):
                comm.sendrecv(what(q, k, v, out), (r + 1) % c, (r - 1) % c)
            return out
        return program
    case = next(iter(RA.cases(np.random.default_rng(0))))
    for what, check, words in [
            (lambda q, k, v, o: q, CONTENTS, "queries (rank 0's q)"),
            (lambda q, k, v, o: o, CONTENTS, "that are no K/V block"),
            (lambda q, k, v, o: k[:, :1], CONTENTS, "12 of the 24 values of rank 0's k"),
            (lambda q, k, v, o: np.stack([k, v]), "each block reaches each rank once",
             "rank 0 sent rank 1 rank 0's k, which it received at step 1")]:
        failure = RA.check(send(what), case)
        assert failure is not None and failure.check == check, failure
        assert words in failure.what, failure.what


def test_the_grader_s_attention_is_the_library_s_block_attention_on_the_whole_sequence():
    for case in list(RA.cases(np.random.default_rng(3)))[:6]:
        q, k, v = RA.whole(case)
        pos = np.arange(q.shape[2])
        want, _ = block_attention(q, k, v, pos, pos, case.info["causal"])
        got = np.concatenate(RA.expected(case), axis=2)
        assert np.allclose(got, want, rtol=0, atol=1e-13), case.label


def test_the_grader_counts_what_the_reference_sends():
    """Counted on the reference's trace: c - 1 messages of K and V per rank, each
    (2, b, h, n, d) float64, so 2(c-1) b h n d x 8 bytes; and its memory peak sits
    below the bound that the gathering programs exceed."""
    rng = np.random.default_rng(0)
    for c, (b, h, n, d) in [(4, (1, 2, 3, 4)), (5, (2, 1, 2, 3)), (2, (1, 1, 1, 2))]:
        case = RA.make_case(rng, c, (b, h, n, d), True)
        res = ringlab.run(lambda comm, qkv: library.ring_attention(comm, *qkv, True),
                          case.inputs)
        for r in range(c):
            mine = res.trace.filter(src=r)
            assert len(mine) == c - 1 and all(e.shape == (2, b, h, n, d) for e in mine)
            assert sum(e.nbytes for e in mine) == 2 * (c - 1) * b * h * n * d * 8
    measured = list(RA.cases(np.random.default_rng(0)))[-1]
    size, bound = RA.block_bytes(measured), RA.memory_bound(measured) / RA.block_bytes(measured)
    for program, low, high in [(library.ring_attention, 0, bound / 1.5),
                               (P.allgather_by_hand, 2 * measured.world_size, None),
                               (P.allgather_lean, 2 * measured.world_size, None)]:
        res, failure = RA.run(program, measured, "sim")
        peaks = [out[1][0] / size for out in res.outputs]
        assert failure is None and all(low <= p and (high is None or p <= high) for p in peaks)


def test_cases_are_hidden_and_cover_the_worlds():
    cases = list(RA.cases(np.random.default_rng(0)))
    assert {c.world_size for c in cases} == set(range(1, 9)) | {RA.MEASURED}
    assert {(c.world_size, c.info["causal"]) for c in cases} >= {(w, x) for w in range(1, 9)
                                                                for x in (True, False)}
    assert sum(c.info["measure"] for c in cases) == 1
    other = list(RA.cases(np.random.default_rng(1)))
    assert [c.info["dims"] for c in cases[1:-2]] != [c.info["dims"] for c in other[1:-2]]
    assert not np.array_equal(cases[0].inputs[0][0], other[0].inputs[0][0])
    assert RA.causality_case(cases).info["causal"] is False


def test_ringlab_grade_bans_the_reference_and_its_block_maths():
    banned = banned_answers(ID)
    for name in ("ring_attention:ring_attention", "ring_attention:RingAttention.forward",
                 "ring_attention:zigzag_ring_attention", "blockwise:block_attention",
                 "blockwise:merge"):
        assert f"ringlab.frontier.{name}" in banned
    assert "ringlab.collectives.allgather:ring_allgather" in banned
    assert "answer to ring_attention" in reference_in(cloudpickle.dumps(library.ring_attention),
                                                      banned)
    # As a notebook defines them (in __main__: pickled by value).
    notebook = {"__name__": "__main__"}
    exec("from ringlab.frontier.blockwise import merge\n"
         "def cheat(comm, q, k, v, causal):\n    return merge(None, None, q, None)\n"
         "def mine(comm, q, k, v, causal):\n    return comm.sendrecv(k, 0, 0)\n", notebook)
    assert "answer to ring_attention (ringlab.frontier.blockwise" in reference_in(
        cloudpickle.dumps(notebook["cheat"]), banned)
    assert reference_in(cloudpickle.dumps(notebook["mine"]), banned) is None

def _isolated(program, which):
    """The grade ``ringlab grade`` gives, on the grader's cases ``which`` picks."""
    module = types.SimpleNamespace(
        check=RA.check, cases=lambda rng: [c for i, c in enumerate(RA.cases(rng)) if which(i, c)])
    cloudpickle.register_pickle_by_value(P)
    try:
        return grade_cases(ID, module, program, seed=0, runner=runner(512, banned_answers(ID)))
    finally:
        cloudpickle.unregister_pickle_by_value(P)


def test_isolated_rank_processes_grade_the_same():
    """The first case and the measured one: the solution passes (memory measured in the
    rank's own process); calling the reference, or sharing a dict, fails there."""
    assert _isolated(P.solution, lambda i, c: i == 0 or c.info["measure"]).passed
    called = _isolated(P.calls_reference, lambda i, c: i == 0)
    assert not called.passed and "ringlab's own answer to ring_attention" in str(called)
    shared = _isolated(P.globals_and_ring, lambda i, c: i == 0)
    assert not shared.passed and shared.failure.check == "the program runs without error"
