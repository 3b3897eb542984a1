"""The Part 4 graders: right programs pass, the usual mistakes fail with the right
check and words (programs in tests/programs/pipeline.py)."""

import functools

import pytest

import ringlab
from ringlab.grading.trusted import banned_answers, reference_in
from ringlab.pipeline.schedules import one_f_one_b_stage
from ringlab.pipeline.stages import pipeline_stage

import programs.pipeline as P
from programs.reports import assert_fails

OFOB_RIGHT = [one_f_one_b_stage, P.ofob_loop, P.ofob_text, P.ofob_counter]
OFOB_WRONG = [
    (P.ofob_gpipe, "microbatches in flight",
     ["your rank 0 holds 8 microbatches at once, GPipe's m, not 1F1B's p - r = 4: start "
      "backwards after the warm-up", "list is GPipe's"]),
    (P.ofob_warmup_long, "microbatches in flight",
     ["rank 0 holds 5 microbatches", "warm-up has 4 forward(s)", "one forward too many",
      "expected p - 1 - r = 3"]),
    (P.ofob_warmup_short, "microbatches in flight",
     ["fewer than 1F1B's min(p - r, m) = 4", "warm-up has 2 forward(s)", "one forward too few",
      "expected p - 1 - r = 3"]),
    (P.ofob_swapped, "the schedule is valid",
     ["rank 3, action 0 (3B0): backward of microbatch 0 before its forward",
      "forward and backward swapped"]),
    (P.ofob_stage_zero, "returns a list of Actions", ["stage 0, not rank 1's own stage 1"]),
    (P.ofob_strings, "returns a list of Actions", ["is a str ('0F0'), not an Action"]),
    (P.ofob_no_last_backward, "the schedule is valid",
     ["stage 0 never runs the backward of microbatch 7"]),
    (P.ofob_m1_forward_only, "the schedule is valid",
     ["p=3 ranks, m=1 microbatches", "never runs the backward of microbatch 0"]),
    (P.ofob_float_mb, "returns a list of Actions",
     ["[0].mb is 0.5 (float): expected a whole number, 0 <= n < 2**31"]),
    (P.ofob_late_forward, "the bubble",
     ["with t_f = 1 and t_b = 1", "is 1/2, not 1F1B's (p - 1) / m = 3/8"]),
]

SHARED = {}
STAGE_RIGHT = [pipeline_stage, P.stage_recompute, P.stage_twins]
STAGE_WRONG = [
    (functools.partial(P.stage_recompute, blocking=True), "no deadlock",
     ["rendezvous mode", "Rank 0 is blocked in a send to rank 1",
      "rank 1 is itself blocked in a send to rank 0",
      "a receive posted after a blocking send to the same neighbour", "comm.isend"]),
    (functools.partial(P.stage_recompute, wrong_neighbour=True), "no deadlock",
     ["Rank 2 sent rank 0 the message (tag 5) that rank 1 waits for: a send to the wrong "
      "neighbour", "stage_rank(s - 1, p)"]),
    (functools.partial(P.stage_recompute, zero_each_b=True),
     "gradients equal the unpipelined model's",
     ["only the last microbatch's gradient (microbatch 3)", "not accumulated over the 4"]),
    (functools.partial(P.stage_recompute, unweighted=True),
     "gradients equal the unpipelined model's", ["not weighted by its share of the batch"]),
    (functools.partial(P.stage_recompute, scale=0.25),
     "gradients equal the unpipelined model's",
     ["times 1 / m, one over the number of microbatches"]),
    (functools.partial(P.stage_recompute, scale=2.0),
     "gradients equal the unpipelined model's", ["times 2"]),
    (functools.partial(P.stage_recompute, shared_module=True),
     "gradients equal the unpipelined model's",
     ["differs from the unpipelined model's", "keep a copy of the stage per microbatch"]),
    (functools.partial(P.stage_recompute, zeros=SHARED),
     "each activation and gradient sent once, to its neighbour",
     ["rank 0 sent rank 1 zeros: neither an activation nor a gradient",
      "data shared some other way"]),
    (functools.partial(P.stage_recompute, own_order=True), "the schedule's order",
     ["rank 1's message 3 was the activation of microbatch 2; its schedule sends the "
      "gradient of microbatch 0 there", "Run the actions of work.actions one by one"]),
    (functools.partial(P.stage_recompute, twice=True),
     "each activation and gradient sent once, to its neighbour",
     ["the activation of microbatch 0 from stage 0 to stage 1 was sent 2 times"]),
    # float32 on the wire: the gradients are off by ~1e-8, not a stale activation
    (functools.partial(P.stage_recompute, float32=True),
     "activations and gradients travel as float64",
     ["rank 0 sent rank 1 a float32 message", "float32 rounds the values on the way",
      "no astype on the way"]),
    # tag 0 everywhere: a receive takes another message of the same tag (it crashes in
    # the layer's matmul or gets wrong gradients; the report names the tags, not that)
    (functools.partial(P.stage_recompute, one_tag=True), "each message has a tag of its own",
     ["interleaved, rank 1 depth-first", "rank 0 sent rank 1 the activation of microbatch 1 "
      "from stage 0 with tag 0", "rank 1's action 3F0 needs the activation of microbatch 0 "
      "from stage 2 first", "a receive takes the oldest message of its tag: 3F0 got the "
      "activation of microbatch 1 from stage 0", "give each message its own tag"]),
]


def _grade(exercise, program):
    SHARED.clear()
    return ringlab.grade(exercise, program, seed=0, log=False)


@pytest.mark.parametrize("program", OFOB_RIGHT, ids=lambda f: f.__name__)
def test_one_f_one_b_right_programs_pass(program):
    report = _grade("one_f_one_b", program)
    assert report.passed, str(report)
    assert report.cases_total == 13 and report.world_sizes[0] == 1 and report.world_sizes[-1] == 8


@pytest.mark.parametrize("program, check, phrases", OFOB_WRONG,
                         ids=[w[0].__name__ for w in OFOB_WRONG])
def test_one_f_one_b_wrong_programs_fail(program, check, phrases):
    assert_fails(_grade("one_f_one_b", program), check, phrases)


@pytest.mark.parametrize("program", STAGE_RIGHT, ids=lambda f: f.__name__)
def test_pipeline_stage_right_programs_pass(program):
    report = _grade("pipeline_stage", program)
    assert report.passed, str(report)


@pytest.mark.parametrize("program, check, phrases", STAGE_WRONG,
                         ids=[f"{k}" for w in STAGE_WRONG for k in [w[0].keywords]])
def test_pipeline_stage_wrong_programs_fail(program, check, phrases):
    # the driver's frames are not shown
    assert_fails(_grade("pipeline_stage", program), check, phrases, absent=["grading/exercises/pipeline"])


def test_pipeline_stage_cases_cover_the_schedules_modes_and_a_network():
    from ringlab.grading.pipeline import pipeline_stage as g
    import numpy as np
    cases = list(g.cases(np.random.default_rng(0)))
    labels = " | ".join(c.label for c in cases)
    for words in ("GPipe", "1F1B, p=4 ranks, m=2", "interleaved 1F1B", "v=2", "ZB-H1",
                  "rendezvous mode", "AlphaBeta network", "rank 1 depth-first"):
        assert words in labels
    # one valid schedule in which a rank takes its neighbour's messages in another order
    # than they were sent (so that one tag for all messages cannot pass)
    from ringlab.pipeline import validate
    from ringlab.pipeline.actions import needs, sends, stage_rank
    mixed = [c for c in cases if "depth-first" in c.label][0].info
    assert validate(mixed["schedule"]) is None
    n, p = mixed["n_stages"], mixed["p"]
    out = [(a.stage, a.kind, a.mb) for a in mixed["schedule"][0]
           if sends(a, n) and stage_rank(sends(a, n)[1], p) == 1]
    into = [(needs(a, n)[1], "F" if a.kind == "F" else "B", a.mb) for a in mixed["schedule"][1]
            if needs(a, n) and stage_rank(needs(a, n)[1], p) == 0]
    assert sorted(out) == sorted(into) and out != into
    # the reference payloads are those of the library's own pipelined run
    case = cases[0]
    res = ringlab.run(g.drive, case.inputs, args=case.args, record_payloads=True,
                      kwargs=dict(learner=pipeline_stage))
    assert len(res.trace) == len(case.info["payloads"])


def test_ringlab_grade_bans_each_exercise_s_reference_module():
    grader = "ringlab.grading.pipeline.one_f_one_b"
    assert {"ringlab.pipeline.schedules:one_f_one_b_stage", "ringlab.pipeline.stages:pipeline_stage",
            f"{grader}:_with_warmup", f"{grader}:mistakes", f"{grader}:diagnose"} <= set(
        banned_answers("one_f_one_b"))
    assert "ringlab.pipeline.schedules:one_f_one_b_stage" not in banned_answers("pipeline_stage")
    assert "ringlab.pipeline.stages:pipeline_stage" in banned_answers("pipeline_stage")
    import cloudpickle
    assert reference_in(cloudpickle.dumps(one_f_one_b_stage))
    assert reference_in(cloudpickle.dumps(pipeline_stage), banned_answers("pipeline_stage"))
    from ringlab.pipeline import schedules
    assert not reference_in(cloudpickle.dumps(schedules.gpipe), banned_answers("pipeline_stage"))
    assert not reference_in(cloudpickle.dumps(P.ofob_loop))


# -- `ringlab grade` (each rank in its own process): ways around the ban of the reference --

def _ref_schedules():
    import importlib
    return importlib.import_module(".".join(["ringlab", "pipeline", "schedules"]))


def ofob_profiler_off(r, p, m):
    import sys
    sys.setprofile(None)                      # profilers, the guard's of old, switched off
    return _ref_schedules().one_f_one_b_stage(r, p, m)


def ofob_thread_without_hook(r, p, m):
    import threading
    threading._profile_hook = None            # new threads start without the hook
    out, mod = [], _ref_schedules()
    t = threading.Thread(target=lambda: out.append(mod.one_f_one_b_stage(r, p, m)))
    t.start()
    t.join()
    return out[0]


def ofob_caught(r, p, m):
    try:
        return _ref_schedules().one_f_one_b_stage(r, p, m)
    except BaseException:                     # noqa: BLE001 - swallow whatever the guard raises
        return []


def ofob_exec_source(r, p, m):
    import os
    import ringlab.pipeline as pkg
    path = os.path.join(os.path.dirname(pkg.__file__), "sche" + "dules.py")
    ns = {"__name__": "mine"}
    exec(compile(open(path).read(), "mine.py", "exec"), ns)
    return ns["one_f_one_b_stage"](r, p, m)


def ofob_grader_answer(r, p, m):
    import importlib
    g = importlib.import_module(".".join(["ringlab", "grading", "pipeline", "one_f_one_b"]))
    return g._with_warmup(r, p, m, p - 1 - r)


@pytest.mark.parametrize("program, phrase", [
    (ofob_profiler_off, "called ringlab's own answer to one_f_one_b (ringlab.pipeline.schedules."),
    (ofob_thread_without_hook, "ringlab's own answer to one_f_one_b (ringlab.pipeline.schedules."),
    (ofob_caught, "ringlab's own answer to one_f_one_b (ringlab.pipeline.schedules."),
    (ofob_exec_source, "made a copy of ringlab's own answer to one_f_one_b (ringlab.pipeline."),
    (ofob_grader_answer, "answer to one_f_one_b (ringlab.grading.pipeline.one_f_one_b."),
], ids=lambda x: getattr(x, "__name__", ""))
def test_isolated_grading_catches_the_reference_however_it_is_reached(program, phrase):
    """In `ringlab grade`'s rank processes the reference functions are replaced by a
    stub that ends the rank, an audit hook catches a copy of their code made from the
    sources, and a grader's own answer functions are removed too."""
    import importlib
    import cloudpickle
    from ringlab.grading import GRADERS
    from ringlab.backends.isolated import Submission, runner
    from ringlab.grading.kit.loop import grade_cases
    program.__module__ = "__main__"           # pickled by value, as from a notebook
    module = importlib.import_module(f"ringlab.grading.{GRADERS['one_f_one_b']}")
    report = grade_cases("one_f_one_b", module,
                         Submission(cloudpickle.dumps(program), "one_f_one_b"), seed=1,
                         runner=runner(banned=banned_answers("one_f_one_b")))
    assert not report.passed and "ReferenceCalled" in str(report), report
    assert phrase in str(report), report
