"""Pipeline schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1) and their validator.

References: counts and orders checked directly; the validator against mutations
whose first violation is worked out from the original list; peaks and bubbles
against the published closed forms; the orders against torch.distributed.pipelining
(its schedule tables, its runtime's actual calls, and its _validate_schedule).
"""

from collections import Counter
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringlab.pipeline import Action, ScheduleError, bubble_fraction, bubble_ratio, check, gpipe, interleaved_1f1b, interleaved_1f1b_rank, one_f_one_b, one_f_one_b_stage, parse, peak_in_flight, timeline, validate, zb_h1

NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}


@st.composite
def schedules(draw):
    """(name, schedule, p, m, v) for small p, m, v."""
    p = draw(st.integers(1, 5))
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb_h1"]))
    if name == "interleaved":
        v, m = draw(st.integers(1, 3)), p * draw(st.integers(1, 3))
        return name, interleaved_1f1b(p, m, v), p, m, v
    m = draw(st.integers(1, 8))
    return name, {"gpipe": gpipe, "1f1b": one_f_one_b, "zb_h1": zb_h1}[name](p, m), p, m, 1


# ---- the generators -----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_generators_pass_the_validator_and_run_each_microbatch_once_per_stage(case):
    name, schedule, p, m, v = case
    assert len(schedule) == p
    assert validate(schedule) is None
    kinds = "FBW" if name == "zb_h1" else "FB"
    for r, actions in enumerate(schedule):
        assert {a.stage for a in actions} == {r + k * p for k in range(v)}  # Megatron placement
        assert Counter(actions) == Counter(
            Action(kind, mb, r + k * p) for kind in kinds for mb in range(m) for k in range(v))


def test_one_f_one_b_phases_warm_up_steady_cool_down():
    """Stage r: p - 1 - r forwards, then F B pairs, then the remaining backwards."""
    p, m = 4, 8
    for r in range(p):
        kinds = "".join(a.kind for a in one_f_one_b_stage(r, p, m))
        w = p - 1 - r
        assert kinds == "F" * w + "FB" * (m - w) + "B" * w
    assert [str(a) for a in one_f_one_b_stage(0, 2, 3)] == "0F0 0F1 0B0 0F2 0B1 0B2".split()


def test_interleaved_warm_up_is_megatrons_formula_and_needs_m_multiple_of_p():
    p, m, v = 4, 8, 2
    for r in range(p):
        order = interleaved_1f1b_rank(r, p, m, v)
        warmup = next(i for i, a in enumerate(order) if a.kind == "B") - 1
        assert warmup == (v - 1) * p + 2 * (p - 1 - r)
    with pytest.raises(ValueError, match="m=6 is not a multiple of p=4"):
        interleaved_1f1b(4, 6, 2)


def test_generators_reject_bad_sizes():
    with pytest.raises(ValueError, match="rank 3 does not exist: ranks are 0 to 2"):
        one_f_one_b_stage(3, 3, 4)
    with pytest.raises(ValueError, match="got p=2, m=0"):
        gpipe(2, 0)


# ---- the validator: messages ----------------------------------------------------------------


def test_validator_messages():
    cases = [
        ([parse("0F0 0B0"), parse("1B0 1F0")],
         "rank 1, action 0 (1B0): backward of microbatch 0 before its forward"),
        ([parse("0F0 0W0 0B0")],
         "rank 0, action 1 (0W0): weight gradient of microbatch 0 before its backward"),
        ([parse("0F1 0F0 0B0 0B1")],
         "rank 0, action 0 (0F1): forward of microbatch 1 out of order: microbatch 0 comes first"),
        ([parse("0F0 0F0 0B0")], "rank 0, action 1 (0F0): forward of microbatch 0 runs twice"),
        ([parse("0F0 0B0"), parse("0F0")], "rank 1, action 0 (0F0): stage 0 belongs on rank 0, "
                                           "not rank 1"),
        ([["0F0"]], "rank 0, action 0 ('0F0'): '0F0' is not an Action (parse('0F0') makes one)"),
        ([parse("0F0 0B0"), parse("1F0")],
         "rank 0, action 1 (0B0): needs the gradient of microbatch 0 from stage 1, "
         "which no action on rank 1 produces"),
        ([parse("0F0 0F1 0B0"), parse("1F0 1B0 1F1 1B1")],
         "rank 0, end of its list: stage 0 never runs the backward of microbatch 1"),
        ([parse("0F0 0B0 0W0 0F1 0B1")],
         "rank 0, end of its list: stage 0 never runs the weight gradient of microbatch 1"),
        ([parse("0F0 0B0 0F1 0B1"), parse("1F0 1F1 1B0 1B1")],
         "rank 0, action 1 (0B0): deadlock: it waits for the gradient of microbatch 0 from 1B0 "
         "(rank 1, action 2); rank 1, action 1 (1F1), waits for the activation of microbatch 1 "
         "from 0F1 (rank 0, action 2)"),
        # one rank, two chunks: it waits for itself
        ([parse("1F0 0F0 1B0 0B0")],
         "rank 0, action 0 (1F0): deadlock: it waits for the activation of microbatch 0 from "
         "0F0 (rank 0, action 1)"),
    ]
    for schedule, message in cases:
        assert str(validate(schedule)) == message
    assert str(validate(gpipe(2, 2), n_stages=1)) == (
        "rank 1, action 0 (1F0): stage 1 does not exist: stages are 0 to 0")
    assert str(validate(gpipe(2, 2), n_microbatches=1)) == (
        "rank 0, action 1 (0F1): microbatch 1 does not exist: microbatches are 0 to 0")


def test_three_rank_deadlock_names_the_whole_cycle():
    # rank 0 waits for 1B0; rank 1 waits at 1F1 for 0F1 (behind rank 0's 0B0), and so on.
    schedule = gpipe(3, 2)
    schedule[0] = parse("0F0 0B0 0F1 0B1")
    v = validate(schedule)
    assert (v.rank, v.index, v.action) == (0, 1, Action("B", 0, 0))
    assert str(v).startswith("rank 0, action 1 (0B0): deadlock: it waits for the gradient")
    assert "rank 1, action 1 (1F1), waits for the activation of microbatch 1" in str(v)


def test_check_and_timeline_raise_on_a_bad_schedule():
    bad = [parse("0B0 0F0")]
    with pytest.raises(ScheduleError, match="backward of microbatch 0 before its forward"):
        check(bad)
    with pytest.raises(ScheduleError) as info:
        timeline(bad)
    assert info.value.violation.index == 0


# ---- the validator: mutated schedules -------------------------------------------------------


def _first(actions, start, wanted):
    """Position and action of the first of ``wanted`` in actions[start:], or None."""
    return next(((i, a) for i, a in enumerate(actions) if i >= start and a in wanted), None)


@settings(max_examples=150, deadline=None)
@given(schedules(), st.data())
def test_swapping_two_microbatches_of_one_kind_is_caught(case, data):
    _, schedule, p, m, _ = case
    r = data.draw(st.integers(0, p - 1))
    pairs = [(a, b) for a in schedule[r] for b in schedule[r]
             if (a.kind, a.stage) == (b.kind, b.stage) and a.mb < b.mb]
    if not pairs:
        return
    a, b = data.draw(st.sampled_from(pairs))
    mutated = [list(acts) for acts in schedule]
    i, j = mutated[r].index(a), mutated[r].index(b)
    mutated[r][i], mutated[r][j] = b, a
    before = {"B": "F", "W": "B"}.get(b.kind)
    if before and mutated[r].index(Action(before, b.mb, b.stage)) > i:
        problem = f"{NAMES[b.kind]} of microbatch {b.mb} before its {NAMES[before]}"
    else:
        problem = (f"{NAMES[b.kind]} of microbatch {b.mb} out of order: "
                   f"microbatch {a.mb} comes first")
    assert str(validate(mutated)) == f"rank {r}, action {i} ({b}): {problem}"


@settings(max_examples=200, deadline=None)
@given(schedules(), st.data())
def test_dropping_an_action_is_caught(case, data):
    _, schedule, p, m, _ = case
    r = data.draw(st.integers(0, p - 1))
    k = data.draw(st.integers(0, len(schedule[r]) - 1))
    mutated = [list(acts) for acts in schedule]
    gone = mutated[r].pop(k)
    s, i = gone.stage, gone.mb
    next_same = Action(gone.kind, i + 1, s)
    dependent = {"F": Action("B", i, s), "B": Action("W", i, s)}.get(gone.kind)
    hit = _first(mutated[r], k, {next_same, dependent})
    if hit and hit[1] == next_same:
        expected = (f"rank {r}, action {hit[0]} ({next_same}): {NAMES[gone.kind]} of microbatch "
                    f"{i + 1} out of order: microbatch {i} comes first")
    elif hit:
        expected = (f"rank {r}, action {hit[0]} ({dependent}): {NAMES[dependent.kind]} of "
                    f"microbatch {i} before its {NAMES[gone.kind]}")
    elif gone.kind == "W" and not any(a.kind == "W" and a.stage == s for a in mutated[r]):
        expected = "None"  # its only W gone: the stage's B is now a full backward, still valid
    elif gone.kind == "B" and s > 0:  # the stage before waits for a gradient that never comes
        q = (s - 1) % p
        waiting = Action("B", i, s - 1)
        expected = (f"rank {q}, action {mutated[q].index(waiting)} ({waiting}): needs the "
                    f"gradient of microbatch {i} from stage {s}, which no action on rank {r} "
                    f"produces")
    else:
        expected = (f"rank {r}, end of its list: stage {s} never runs the {NAMES[gone.kind]} "
                    f"of microbatch {i}")
    assert str(validate(mutated)) == expected


@settings(max_examples=150, deadline=None)
@given(schedules(), st.data())
def test_duplicating_an_action_is_caught(case, data):
    _, schedule, p, m, _ = case
    r = data.draw(st.integers(0, p - 1))
    k = data.draw(st.integers(0, len(schedule[r]) - 1))
    at = data.draw(st.integers(k + 1, len(schedule[r])))
    mutated = [list(acts) for acts in schedule]
    a = mutated[r][k]
    mutated[r].insert(at, a)
    assert str(validate(mutated)) == (
        f"rank {r}, action {at} ({a}): {NAMES[a.kind]} of microbatch {a.mb} runs twice")


# ---- memory: microbatches in flight ---------------------------------------------------------


@pytest.mark.parametrize("p, m", [(1, 1), (2, 5), (4, 4), (4, 8), (8, 3), (8, 24)])
def test_peak_in_flight_closed_forms(p, m):
    assert peak_in_flight(gpipe(p, m)) == [m] * p
    assert peak_in_flight(one_f_one_b(p, m)) == [min(p - r, m) for r in range(p)]
    # ZB-H1 holds each microbatch until its W: p on every stage, 1F1B's peak
    assert peak_in_flight(zb_h1(p, m)) == [min(p, m)] * p
    if m % p == 0:
        for v in (2, 3):  # Megatron's warm-up + 1, in chunks of 1/v stage
            expected = [min((v - 1) * p + 2 * (p - 1 - r) + 1, v * m) for r in range(p)]
            assert peak_in_flight(interleaved_1f1b(p, m, v)) == expected


def test_max_in_flight_limit():
    p, m = 4, 8
    assert validate(one_f_one_b(p, m), max_in_flight=p) is None
    assert validate(one_f_one_b(p, m), max_in_flight=[p - r for r in range(p)]) is None
    assert str(validate(one_f_one_b(p, m), max_in_flight=[p - r - 1 for r in range(p)])) == (
        "rank 0, action 3 (0F3): 4 microbatches in flight, more than the limit of 3")
    assert str(validate(gpipe(p, m), max_in_flight=p)) == (
        "rank 0, action 4 (0F4): 5 microbatches in flight, more than the limit of 4")
    assert validate(zb_h1(p, m), max_in_flight=p) is None
    assert str(validate(zb_h1(p, m), max_in_flight=[4, 4, 4, 3])) == (
        "rank 3, action 6 (3F3): 4 microbatches in flight, more than the limit of 3")
    with pytest.raises(ValueError, match="3 limits for 4 ranks"):
        validate(gpipe(p, m), max_in_flight=[1, 2, 3])


# ---- bubbles from the ideal timeline --------------------------------------------------------

PM = [(p, m) for p in range(1, 7) for m in range(1, 13)]


@pytest.mark.parametrize("t_f, t_b", [(1, 1), (1, 2), (2, 3), (3, 1)])
def test_bubble_gpipe_and_1f1b(t_f, t_b):
    for p, m in PM:
        for make in (gpipe, one_f_one_b):
            tl = timeline(make(p, m), t_f=t_f, t_b=t_b)
            assert bubble_ratio(tl) == Fraction(p - 1, m)  # idle / compute
            assert bubble_fraction(tl) == Fraction(p - 1, m + p - 1)  # idle / total


def test_bubble_interleaved():
    for p, m in PM:
        if m % p:
            continue
        for v in (1, 2, 3):
            for t_f, t_b in [(1, 1), (1, 2), (2, 1)]:
                tl = timeline(interleaved_1f1b(p, m, v), t_f=t_f, t_b=t_b)
                assert bubble_ratio(tl) == Fraction(p - 1, v * m)
                assert bubble_fraction(tl) == Fraction(p - 1, v * m + p - 1)


def test_bubble_zb_h1():
    for p, m in PM:
        if m < p:
            continue
        tl = timeline(zb_h1(p, m))
        assert bubble_ratio(tl) == Fraction(p - 1, 3 * m)  # a third of 1F1B's
        assert bubble_fraction(tl) == Fraction(p - 1, 3 * m + p - 1)
        for t_f, t_b, t_w in [(1, 2, 1), (2, 1, 1), (3, 2, 1)]:  # (p-1)(t_f+t_b-t_w) idle
            tl = timeline(zb_h1(p, m), t_f=t_f, t_b=t_b, t_w=t_w)
            assert bubble_ratio(tl) == Fraction((p - 1) * (t_f + t_b - t_w), m * (t_f + t_b + t_w))


# ---- torch.distributed.pipelining -------------------------------------------------------------

try:
    import torch
    from torch.distributed.pipelining import schedules as ts
except ImportError:  # the tests above still run
    torch = ts = None
needs_torch = pytest.mark.skipif(ts is None, reason="needs torch.distributed.pipelining")
GRID = [(p, m) for p in (2, 4, 8) for m in (p, 2 * p, 3 * p)]


def ours(action):
    kind = {"F": "F", "B": "B", "I": "B", "W": "W"}[action.computation_type.value]
    return Action(kind, action.microbatch_index, action.stage_index)


def torch_table(cls, p, m, v=1):
    """torch's pipeline_order (its schedule table), built without a process group."""
    if v == 1:
        sched = cls(SimpleNamespace(num_stages=p), m)
    else:
        stages = [SimpleNamespace(num_stages=v * p, group_size=p, group_rank=0) for _ in range(v)]
        sched = cls(stages, m)
    return [[ours(a) for a in sched.pipeline_order[r] if a is not None and a.is_compute_op]
            for r in range(p)]


class RecordingStage:
    """Just enough of a PipelineStage for a single-stage schedule's runtime loop:
    no communication, it records the forwards and backwards it is asked for."""

    def __init__(self, r, p):
        self.stage_index, self.num_stages, self.is_last, self.log = r, p, r == p - 1, []

    def __getattr__(self, name):  # get_fwd_recv_ops, get_bwd_send_ops, ...: nothing to send
        if name.startswith("get_"):
            return lambda *args, **kwargs: []
        raise AttributeError(name)

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(Action("F", mb, self.stage_index))

    def backward_one_chunk(self, mb, **kwargs):
        self.log.append(Action("B", mb, self.stage_index))

    def perform_reduce_grad(self, *args):
        pass


def torch_runtime(cls, p, m):
    """The actions torch's runtime loop (_step_microbatches) runs, rank by rank."""
    out = []
    for r in range(p):
        stage = RecordingStage(r, p)
        sched = cls(stage, m)
        sched._initialize_stage = lambda *args, **kwargs: None  # shape inference: not needed
        sched._step_microbatches()
        out.append(stage.log)
    return out


def fix_last_rank(table, p):
    """Undo torch 2.13's labelling of the last rank's forwards in Schedule1F1B's table."""
    return table[:-1] + [[Action(a.kind, a.mb - (a.kind == "F"), a.stage) for a in table[-1]]]


@needs_torch
@pytest.mark.parametrize("p, m", GRID)
def test_gpipe_and_1f1b_equal_torchs_runtime(p, m):
    assert torch_runtime(ts.ScheduleGPipe, p, m) == gpipe(p, m)
    assert torch_runtime(ts.Schedule1F1B, p, m) == one_f_one_b(p, m)


@needs_torch
@pytest.mark.parametrize("p, m", GRID)
def test_gpipe_and_1f1b_equal_torchs_tables(p, m):
    assert torch_table(ts.ScheduleGPipe, p, m) == gpipe(p, m)
    assert fix_last_rank(torch_table(ts.Schedule1F1B, p, m), p) == one_f_one_b(p, m)


@needs_torch
@pytest.mark.parametrize("p, m", GRID)
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_equals_torchs(p, m, v):
    assert torch_table(ts.ScheduleInterleaved1F1B, p, m, v) == interleaved_1f1b(p, m, v)


@needs_torch
@pytest.mark.skipif(ts is None or not torch.__version__.startswith("2.13"),
                    reason="pins torch 2.13's table")
def test_torch_2_13_labels_1f1b_last_rank_forwards_one_too_high():
    """Schedule1F1B._get_pipeline_order starts the last rank's forward counter at 1
    (it has no warm-up to set it): p = 4, m = 8 lists 3F1 ... 3F8 for 3F0 ... 3F7.
    Its runtime loop runs 3F0 ... 3F7; every other rank's table is right."""
    p, m = 4, 8
    table = torch_table(ts.Schedule1F1B, p, m)
    assert table[:-1] == one_f_one_b(p, m)[:-1]
    assert " ".join(map(str, table[-1])) == (
        "3F1 3B0 3F2 3B1 3F3 3B2 3F4 3B3 3F5 3B4 3F6 3B5 3F7 3B6 3F8 3B7")
    assert torch_runtime(ts.Schedule1F1B, p, m)[-1] == one_f_one_b_stage(p - 1, p, m)
    assert str(validate(table)) == (
        "rank 3, action 0 (3F1): forward of microbatch 1 out of order: microbatch 0 comes first")


@needs_torch
@pytest.mark.parametrize("p, m", GRID)
def test_torchs_validator_accepts_our_schedules(p, m):
    """torch's _validate_schedule (B before W needs I, the input-gradient backward)."""
    def to_torch(schedule):
        split = {a.stage for acts in schedule for a in acts if a.kind == "W"}
        kind = {"F": ts.F, "W": ts.W}
        return {r: [ts._Action(a.stage, kind.get(a.kind, ts.I if a.stage in split else ts.B),
                               a.mb) for a in acts] for r, acts in enumerate(schedule)}

    for schedule, n_stages in [(gpipe(p, m), p), (one_f_one_b(p, m), p), (zb_h1(p, m), p),
                               (interleaved_1f1b(p, m, 2), 2 * p)]:
        mapping = ts._validate_schedule(to_torch(schedule), p, n_stages, m)
        assert mapping == {s: s % p for s in range(n_stages)}
