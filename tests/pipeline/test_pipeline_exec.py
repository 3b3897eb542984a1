"""Pipeline schedules executed on the simulated world (and on real processes):
the gradients are the unpipelined model's, every message goes once to the next
stage, and the bubble, the activations held and the message counts measured
from the trace are the closed forms of the papers."""

import importlib.util
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

import ringlab
from ringlab.errors import DeadlockError, RankError
from ringlab.nn import mlp_model, mse
from ringlab.pipeline import Action, parse, run_pipeline, split_model, stage_rank
from ringlab.pipeline.bubble import bubble_closed_form, measure, messages_closed_form, of_total, peak_held_closed_form

SCHEDULES = ("gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1")
CASES = [(name, p, m) for name in SCHEDULES for p in (2, 4) for m in (p, 2 * p)]
V = 2
WIDTH = 3


def make(name, p, m):
    from ringlab.pipeline import schedules
    return schedules.interleaved_1f1b(p, m, V) if name == "interleaved_1f1b" else \
        getattr(schedules, name)(p, m)


def n_stages(name, p):
    return V * p if name == "interleaved_1f1b" else p


def problem(stages, rows, seed=0):
    """A float64 MLP with one Linear per stage (GeLU between), and a batch."""
    model = mlp_model([WIDTH] * (stages + 1), np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    return model, (rng.normal(size=(rows, WIDTH)), rng.normal(size=(rows, WIDTH)))


def reference(model, batch):
    """The unpipelined model's loss and gradients on the whole batch (a fresh copy)."""
    import copy
    model = copy.deepcopy(model)
    loss, dy = mse(model.forward(batch[0]), batch[1])
    model.backward(dy)
    return loss, model.named_grads()


def assert_same_grads(got, want, rtol=1e-12):
    assert list(got) == list(want)
    for name, g in want.items():
        assert np.abs(got[name] - g).max() <= rtol * np.abs(g).max(), name


# -- gradients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,p,m", CASES)
def test_gradients_are_the_unpipelined_models(name, p, m):
    model, batch = problem(n_stages(name, p), rows=2 * m + 1)   # unequal microbatches too
    res = run_pipeline(model, batch, make(name, p, m))
    loss, grads = reference(model, batch)
    assert_same_grads(res.grads, grads)
    assert res.loss == pytest.approx(loss, rel=1e-12)
    assert not any(g.any() for g in model.named_grads().values())    # the model was copied


@pytest.mark.parametrize("name,p,m", [("one_f_one_b", 2, 3), ("interleaved_1f1b", 2, 4)])
def test_the_unpipelined_reference_is_the_whole_model_and_each_microbatch(name, p, m):
    """``unpipelined`` (what the pipeline_stage grader compares with): the whole
    model's gradients, which its microbatches' add up to and a schedule's run gives,
    and one activation and one gradient per microbatch at every stage boundary."""
    from ringlab.pipeline.stages import unpipelined
    n = n_stages(name, p)
    model, batch = problem(n, rows=2 * m + 1)
    ref = unpipelined(model, batch, n, m)
    assert_same_grads(ref.grads, reference(model, batch)[1])
    assert_same_grads({k: sum(mb[k] for mb in ref.per_microbatch) for k in ref.grads}, ref.grads)
    assert_same_grads(run_pipeline(model, batch, make(name, p, m)).grads, ref.grads)
    assert sorted(ref.messages) == sorted((kind, s, mb) for kind in ("activation", "gradient")
                                          for s in range(n - 1) for mb in range(m))
    rows = [len(a) for a in np.array_split(batch[0], m)]
    assert all(a.shape == (rows[mb], WIDTH) for (_, _, mb), a in ref.messages.items())
    assert [first for first, _ in ref.stages] == [first for first, _ in split_model(model, n)]


@pytest.mark.parametrize("name,p,m", CASES)
def test_rendezvous_mode_runs_with_the_same_gradients(name, p, m):
    model, batch = problem(n_stages(name, p), rows=m)
    net = ringlab.AlphaBeta(1e-3, 1e-6)
    res = run_pipeline(model, batch, make(name, p, m), mode="rendezvous", network=net)
    assert_same_grads(res.grads, reference(model, batch)[1])


def test_hand_written_schedule_with_split_backward():
    """A zero-bubble-like schedule written by hand: B gives the input gradient,
    W adds the weight gradient later; the sum is the same."""
    sched = [parse("0F0 0F1 0B0 0F2 0B1 0W0 0B2 0W1 0W2"),
             parse("1F0 1B0 1F1 1B1 1W0 1F2 1B2 1W1 1W2")]
    model, batch = problem(2, rows=7)
    for mode in ("buffered", "rendezvous"):
        res = run_pipeline(model, batch, sched, mode=mode)
        assert_same_grads(res.grads, reference(model, batch)[1])


def test_linear_backward_in_two_halves():
    from ringlab.nn import Linear
    whole, split = (Linear(3, 2, np.random.default_rng(0)) for _ in range(2))
    x, dy = np.random.default_rng(1).normal(size=(2, 4, 3))[0], np.ones((4, 2))
    whole.forward(x), split.forward(x)
    dx = split.backward_input(dy)
    assert not split.grads["weight"].any()          # B: the input gradient only
    split.backward_weight(dy)                        # W: then the weight gradient
    assert np.array_equal(dx, whole.backward(dy))
    assert all(np.array_equal(split.grads[k], whole.grads[k]) for k in whole.grads)


def test_a_schedule_that_never_frees_a_microbatch_is_an_error():
    model, batch = problem(1, rows=2)
    with pytest.raises(RankError, match="still held.*stage 0 microbatch 1"):
        run_pipeline(model, batch, [parse("0F0 0F1 0B0")])


# -- the trace: each activation once, to the next stage ----------------------------------------

@pytest.mark.parametrize("name,p,m", CASES)
def test_each_activation_and_gradient_is_sent_once_to_its_neighbour(name, p, m):
    n = n_stages(name, p)
    model, batch = problem(n, rows=m)
    res = run_pipeline(model, batch, make(name, p, m))
    sent = Counter()
    for e in res.trace:
        a = parse(e.span)[0]                      # the action that sent it
        to = a.stage + 1 if a.kind == "F" else a.stage - 1
        assert (e.src, e.dst) == (stage_rank(a.stage, p), stage_rank(to, p)), (str(a), e)
        assert e.chunk == a.mb and e.shape == (1, WIDTH)
        sent[a] += 1
    want = {Action(k, mb, s) for mb in range(m)
            for k, s in [("F", s) for s in range(n - 1)] + [("B", s) for s in range(1, n)]}
    assert set(sent) == want and set(sent.values()) == {1}


# -- bubble, activations, messages against the closed forms ------------------------------------

@pytest.mark.parametrize("name,p,m", CASES)
def test_bubble_is_the_closed_form(name, p, m):
    model, batch = problem(n_stages(name, p), rows=m)
    stats = measure(run_pipeline(model, batch, make(name, p, m), t_f=1, t_b=1, t_w=1).trace)
    want = bubble_closed_form(name, p, m, V if name == "interleaved_1f1b" else 1)
    assert stats.bubble == [want] * p                  # idle / ideal compute, every rank
    assert stats.bubble_of_total == [of_total(want)] * p
    if name in ("gpipe", "one_f_one_b"):
        assert of_total(want) == Fraction(p - 1, m + p - 1)
    if name == "zb_h1":
        assert want == Fraction(p - 1, 3 * m)


def test_the_two_conventions():
    # GPipe's paper: (K-1)/(M+K-1) of the time; Megatron-LM's: (p-1)/m of the ideal compute.
    assert of_total(bubble_closed_form("gpipe", p=4, m=8)) == Fraction(3, 11)
    assert bubble_closed_form("gpipe", p=4, m=8) == Fraction(3, 8)


@pytest.mark.parametrize("name,p,m", CASES)
def test_peak_activations_held(name, p, m):
    model, batch = problem(n_stages(name, p), rows=m)
    res = run_pipeline(model, batch, make(name, p, m))
    want = [peak_held_closed_form(name, p, m, r, V) for r in range(p)]
    assert res.peak_held == want == measure(res.trace).peak_held
    if name == "gpipe":
        assert want == [m] * p
    if name == "one_f_one_b":
        assert want == [p - r for r in range(p)]


@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (4, 4), (4, 8)])
def test_interleaving_sends_about_v_times_the_messages(p, m):
    plain = measure(run_pipeline(*problem(p, m), make("one_f_one_b", p, m)).trace)
    inter = measure(run_pipeline(*problem(V * p, m), make("interleaved_1f1b", p, m)).trace)
    assert plain.activations == plain.gradients == m * (p - 1)
    assert plain.messages == messages_closed_form(p, m)
    assert inter.messages == messages_closed_form(p, m, V) == 2 * m * (V * p - 1)
    # v times as many boundaries between ranks, plus the v - 1 that loop back to rank 0
    assert inter.messages == V * plain.messages + 2 * m * (V - 1)


def test_network_time_adds_to_the_makespan():
    """p = 2, one microbatch: F, activation, F B, gradient, B in a row."""
    model, batch = problem(2, rows=4)
    net = ringlab.AlphaBeta(0.25, 1e-3)
    res = run_pipeline(model, batch, [parse("0F0 0B0"), parse("1F0 1B0")],
                       t_f=1, t_b=2, t_w=0, network=net)
    assert res.time == pytest.approx(2 * (1 + 2) + 2 * net.message(4 * WIDTH * 8), rel=1e-12)


# -- errors ------------------------------------------------------------------------------------

def test_split_model_says_when_it_cannot():
    model, _ = problem(3, rows=1)
    assert [first for first, _ in split_model(model, 3)] == [0, 2, 4]
    assert [len(s.layers) for _, s in split_model(model, 2)] == [4, 1]
    with pytest.raises(ValueError, match="3 layers with parameters into 4 stages"):
        split_model(model, 4)


def test_a_cyclic_schedule_deadlocks_with_a_diagnosis():
    model, batch = problem(2, rows=2)
    with pytest.raises(DeadlockError, match="recv"):
        run_pipeline(model, batch, [parse("0F0 0B0 0F1 0B1"), parse("1F1 1B1 1F0 1B0")],
                     mode="rendezvous")


# -- real processes ----------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="backend='torch' needs PyTorch: pip install 'ringlab[torch]'")
@pytest.mark.parametrize("p", [2, 4])
def test_torch_backend_same_gradients_and_trace(p):
    from ringlab.backends.torch import pool
    model, batch = problem(p, rows=2 * p)
    sched = make("one_f_one_b", p, 2 * p)
    try:
        sim = run_pipeline(model, batch, sched)
        real = run_pipeline(model, batch, sched, backend="torch")
    finally:
        pool.shutdown()
    assert real.trace == sim.trace, sim.trace.diff(real.trace)
    assert all(np.array_equal(real.grads[k], g) for k, g in sim.grads.items())
    assert real.peak_held == sim.peak_held and real.loss == sim.loss


# -- the chapter's panel -------------------------------------------------------------------------

@pytest.mark.parametrize("name", SCHEDULES)
def test_panel_draws_the_closed_form(name):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ringlab.pipeline.panel import figure
    out = figure(p=4, m=8, v=V, schedule=name)
    title = plt.gca().get_title()
    plt.close("all")
    assert out["stats"].bubble == [out["closed_form"]] * 4
    assert f"peak activations held per rank {out['stats'].peak_held}" in title


def test_live_panel_builds():
    pytest.importorskip("ipywidgets")
    import matplotlib
    matplotlib.use("Agg")
    from ringlab.pipeline.panel import pipeline_panel
    panel = pipeline_panel()
    assert [c.description for c in panel.children[:3]] == ["p", "m", "v (interleaved)"]
