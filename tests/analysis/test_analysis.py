"""The training-step analyzer (ringlab.analysis), checked three ways:

(a) against ringlab's own runs: the bytes of every kind of communication equal
    the bytes in the trace of the real implementations exactly, and the times
    equal the simulated AlphaBeta times (exactly for collectives; for pipelines
    within 1e-9 of the makespan, where the analyzer's count of exposed message
    times is the simulator's);
(b) against published formulas: the ZeRO paper's memory table, Korthikanti et
    al.'s activation memory (derived again here term by term), Megatron's four
    AllReduces per layer, the bubble, Narayanan et al.'s FLOPs and parameters;
(c) against published end-to-end results: Narayanan et al. (2021), Table 1.
"""

import dataclasses
import json
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

import ringlab
from ringlab.analysis import Hardware, Layout, Model, analyze, compare_layouts, presets
from ringlab.analysis import traffic as acomm
from ringlab.analysis.compute import flops_per_iteration, forward_flops_per_token, narayanan_flops, six_n_d
from ringlab.analysis.config import even_split
from ringlab.analysis.gemm import gemm_seconds, linear_seconds, wave_quantization
from ringlab.analysis.gpu_memory import layer_activation_bytes, model_states, params_per_gpu, rank_params
from ringlab.analysis.timing import head_work, layer_work
from ringlab.analysis.step import pipeline_seconds, pp_exposed_messages
from ringlab.pipeline.validate import makespan_of
from ringlab.cli import main
from ringlab.nn import GPT, TransformerBlock, mlp_model
from ringlab.pipeline import gpipe, interleaved_1f1b, one_f_one_b, run_pipeline
from ringlab.tensor_parallel.block import ParallelTransformerBlock, tp_bytes_per_layer
from ringlab.tensor_parallel.hybrid import tp_dp_sgd_step
from ringlab.zero.all_stages import comm_per_step, run_stages
from ringlab.analysis.step import rank_params

import programs.context_parallel as cp_programs

ALPHA, BETA = 2e-6, 1e-9
NET_HW = Hardware("test", gpus_per_node=64, intra_bw=1 / BETA, intra_latency=ALPHA,
                  peak_flops=1e30, hbm_bw=1e30, efficiency=1.0)     # compute takes no time


def sent_by_rank0(trace, skip=()):
    """{innermost span: bytes rank 0 sent}."""
    out = Counter()
    for e in trace.events:
        if e.src == 0 and not any(s in e.span for s in skip):
            out[e.span.rsplit("/", 1)[-1]] += e.nbytes
    return out


# -- (a) against ringlab's traces ------------------------------------------------------------

B, S, H, A, F, LAYERS = 2, 8, 16, 4, 64, 2
TINY = Model("tiny", layers=LAYERS, hidden=H, heads=A, seq_len=S, vocab=32, ffn=F,
             param_bytes=8, grad_bytes=8, act_bytes=8)


def run_tp_stack(t, sp):
    blocks = [TransformerBlock(H, A, F, np.random.default_rng(i)) for i in range(LAYERS)]
    x = np.random.default_rng(9).standard_normal((B, S, H))

    def program(comm, x):
        layers = [ParallelTransformerBlock.from_block(b, comm, sequence_parallel=sp)
                  for b in blocks]
        n = S // comm.world_size
        if sp:
            x = x[:, comm.rank * n:(comm.rank + 1) * n]
        for layer in layers:
            x = layer.forward(x)
        dy = np.ones_like(x)
        for layer in reversed(layers):
            dy = layer.backward(dy)
        for layer in layers:
            layer.sync_sequence_parallel_grads()

    return ringlab.run(program, [x] * t, network=ringlab.AlphaBeta(ALPHA, BETA))


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_tp_bytes_and_times_equal_the_trace(t, sp):
    res = run_tp_stack(t, sp)
    traced = sent_by_rank0(res.trace)
    sync = sent_by_rank0(res.trace, skip=("tp.block",))    # only tp.sp.grad_sync is left
    report = analyze(TINY, Layout(tp=t, sp=sp, micro_batch=B), NET_HW)
    kinds = report.by_kind()
    if sp:
        assert kinds == {"tp_allgather": traced["ring_allgather"],
                         "tp_reduce_scatter": traced["ring_reduce_scatter"],
                         "tp_sp_grad_sync": sync["ring_allreduce"]}
        # 10 halves instead of 8: 5/4 of the AllReduce form (block.py's docstring)
        assert kinds["tp_allgather"] + kinds["tp_reduce_scatter"] == \
            LAYERS * tp_bytes_per_layer(B, S, H, t, 8) * 5 // 4
    else:
        assert kinds == {"tp_allreduce": traced["ring_allreduce"]}
        assert kinds["tp_allreduce"] == LAYERS * tp_bytes_per_layer(B, S, H, t, 8)
    # nothing else runs: the makespan is the collectives' time, one after another
    comm_time = report.times["tp"] + report.times["sp_grad_sync"]
    assert comm_time == pytest.approx(res.time, rel=1e-12)


def test_megatron_four_allreduces_per_layer_two_each_way():
    """Shoeybi et al. (2019), Figure 4: 4 communication operations per layer."""
    res = run_tp_stack(2, False)
    spans = [c["span"] for c in res.trace.collectives()
             if c["span"].endswith("ring_allreduce")]
    forward = [s for s in spans if s.startswith("tp.block.forward")]
    assert len(spans) == 4 * LAYERS and len(forward) == 2 * LAYERS
    counts, _ = acomm.tp_collectives_per_layer(B, S, H, 2, 8)
    assert counts == {("tp_allreduce", "allreduce"): 4}
    counts, _ = acomm.tp_collectives_per_layer(B, S, H, 2, 8, recompute="full")
    assert counts == {("tp_allreduce", "allreduce"): 6}      # the forward's 2 again


@pytest.mark.parametrize("sp", [False, True])
def test_tp_inside_dp_mesh_bytes(sp):
    dp, tp = 2, 2
    block = TransformerBlock(H, A, F, np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((4, S, H))
    dy = np.random.default_rng(2).standard_normal((4, S, H))
    res = ringlab.run(tp_dp_sgd_step, [(block, x, dy, (dp, tp), 0.1, sp)] * (dp * tp))
    traced = sent_by_rank0(res.trace, skip=("dp.grad_sync",))
    dp_traced = sum(e.nbytes for e in res.trace.events
                    if e.src == 0 and "dp.grad_sync" in e.span)
    one = Model("one", layers=1, hidden=H, heads=A, seq_len=S, vocab=32, ffn=F,
                param_bytes=8, grad_bytes=8, act_bytes=8)
    lay = Layout(dp=dp, tp=tp, sp=sp, micro_batch=4 // dp)
    report = analyze(one, lay, NET_HW)
    kinds = report.by_kind()
    for kind, name in [("tp_allreduce", "ring_allreduce"), ("tp_allgather", "ring_allgather"),
                       ("tp_reduce_scatter", "ring_reduce_scatter")]:
        assert kinds.get(kind, 0) == (traced[name] - (kinds.get("tp_sp_grad_sync", 0)
                                                      if name == "ring_allreduce" else 0))
    # the parameters this GPU holds: its shard of the block (the rest is the embedding)
    layer_psi = params_per_gpu(one, lay) - (32 * H // tp + S * H)
    assert layer_psi == sum(a.size for a in res.outputs[0][0].values())
    dp_comm = acomm.dp_collectives(layer_psi, dp, 0, grad_bytes=8)
    assert dp_comm[0][:2] == ("dp_allreduce", "allreduce")
    assert acomm.Traffic("dp", "allreduce", dp, dp_comm[0][2], 1).bytes_sent == dp_traced


PIPELINES = [(2, 4, 1, "1f1b"), (4, 8, 1, "1f1b"), (3, 9, 1, "1f1b"), (4, 16, 1, "1f1b"),
             (4, 8, 1, "gpipe"), (2, 4, 2, "1f1b"), (4, 8, 2, "1f1b"), (3, 6, 2, "1f1b"),
             (4, 1, 1, "1f1b"), (4, 2, 1, "1f1b"), (8, 4, 1, "1f1b"), (8, 16, 1, "1f1b")]


@pytest.mark.parametrize("p,m,v,schedule", PIPELINES)
def test_pipeline_bytes_and_time_equal_the_simulation(p, m, v, schedule):
    W, rows = 16, 2
    model = mlp_model([W] * (v * p + 1), np.random.default_rng(0))
    x = np.random.default_rng(1).normal(size=(rows * m, W))
    plan = (gpipe(p, m) if schedule == "gpipe" else
            interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m))
    net = ringlab.AlphaBeta(1e-3, 1e-5)
    t_f, t_b = 1.0, 1.5
    res = run_pipeline(model, (x, np.zeros_like(x)), plan, t_f=t_f, t_b=t_b / 2,
                       t_w=t_b / 2, network=net)
    msg = rows * W * 8
    shape = Model("mlp", layers=v * p, hidden=W, heads=1, seq_len=1, vocab=1, act_bytes=8)
    lay = Layout(pp=p, interleave=v, micro_batch=rows, microbatches=m, schedule=schedule)
    assert res.trace.bytes_sent() == [n * msg for n in acomm.pp_messages_per_rank(p, m, v)]
    assert acomm.pp_comms(shape, lay)[0].bytes_sent == max(res.trace.bytes_sent())
    assert sum(acomm.pp_messages_per_rank(p, m, v)) == 2 * m * (v * p - 1)
    # time: (m + (p-1)/v) stages' work (the bubble) plus the exposed message times
    ideal = (m + Fraction(p - 1, v)) * Fraction(t_f + t_b)
    expected = float(ideal) + pp_exposed_messages(p, m, v, schedule) * net.message(msg)
    assert res.time == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("n", [2, 4])
def test_zero_stages_bytes_equal_the_trace(n):
    sizes = [8] + [32] * 3 + [8]                   # every unit and bucket divides by 2 and 4
    psi = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
    data = ringlab.nn.data.TeacherRegression(n_samples=64, dim=8, out=8)
    batches = [b for _, b in zip(range(2), data.batches(16))]
    runs = run_stages(sizes, batches, n)
    names = {"allreduce": "ring_allreduce", "allgather": "ring_allgather",
             "reduce_scatter": "ring_reduce_scatter"}
    for zero, stage in enumerate(["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]):
        traced = comm_per_step(runs[stage].trace, steps=2)[0]
        expected = Counter()
        for kind, op, nbytes, count, _ in acomm.dp_collectives(psi, n, zero, 8, 8):
            expected[names[op]] += acomm.Traffic(kind, op, n, nbytes, count).bytes_sent
        assert traced == dict(expected), stage
    # DP's time per step: forward + backward (3 x forward FLOPs) and the AllReduce after it
    flops = sum(2 * (16 // n) * a * b for a, b in zip(sizes[:-1], sizes[1:]))
    allreduce = acomm.Traffic("dp", "allreduce", n, psi * 8, 1).time(1e-6, 1e-9)
    assert runs["DP"].time == pytest.approx(2 * (3 * flops / 1e9 + allreduce), rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_dp_communication_that_fits_its_window_adds_nothing(zero):
    """GPT-3 175B, dp=8 tp=8 pp=16, B=512, b=8 (m=8) on DGX A100: the overlappable
    data-parallel collectives (the gradient AllReduce or ReduceScatter, ZeRO-3's
    gathers) take less than the compute they run under, so they add nothing to
    the step; only ZeRO-1/2's parameter AllGather, after the optimizer step, does."""
    hw = presets.HARDWARE["dgx-a100"]
    lay = Layout(dp=8, tp=8, pp=16, global_batch=512, micro_batch=8, zero=zero)
    r = analyze(presets.MODELS["gpt3-175b"], lay, hw)
    d, p, m = 8, 16, r.layout.microbatches
    assert m == 8 and r.links["dp"] == "inter"
    # the ring closed forms on the inter-node link: (d-1) steps of one chunk each
    # at the share of the line rate NCCL reaches (NVIDIA/nccl#412: 24 of 25 GB/s)
    alpha, beta = hw.inter_latency, 1 / (25e9 * 0.96)
    # 16-bit gradients and weights of the critical (slowest) stage's parameters
    crit = rank_params(presets.MODELS["gpt3-175b"], r.layout, r.extra["critical_rank"])
    grads = params = 2 * sum(crit)
    rs = (d - 1) * (alpha + grads / d * beta)               # ReduceScatter of the gradients
    ag = (d - 1) * (alpha + params / d * beta)              # AllGather of the weights
    hidden, exposed = {0: (2 * rs, 0.0), 1: (rs, ag), 2: (m * rs, ag),
                       3: (2 * m * ag + m * rs, 0.0)}[zero]
    # the windows they may hide under: the critical stage's backward of the last
    # microbatch (ZeRO-0/1), of every microbatch (ZeRO-2), or all its compute (ZeRO-3)
    last_backward = r.extra["backward"][r.extra["critical_rank"]]
    window = {0: last_backward, 1: last_backward, 2: m * last_backward,
              3: r.times["compute"]}[zero]
    assert 0 < hidden < window                              # it fits: nothing left over
    assert r.times["dp_exposed"] == pytest.approx(exposed, rel=1e-12, abs=0)
    # the step: the pipeline, its exposed messages, the exposed data-parallel time
    # (ZeRO-1/2's AllGather), the optimizer
    expected = (r.times["pipeline"] + r.times["pp_exposed"] + exposed
                + r.times["sp_grad_sync"] + r.times["optimizer"])
    assert r.step == pytest.approx(expected, rel=1e-12)


# -- (b) against published formulas ------------------------------------------------------------

def test_zero_memory_table():
    """Rajbhandari et al. (2020), Figure 1: 7.5B parameters, N_d = 64."""
    got = [round(sum(model_states(7.5e9, 64, z).values()) / 1e9, 1) for z in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]
    # the same through analyze, for the 7.5B shape (7.47B parameters by equation 2)
    m = presets.MODELS["zero-7.5b"]
    r = analyze(m, Layout(dp=64, zero=3, global_batch=64), presets.HARDWARE["dgx-a100"])
    assert r.memory["weights"] == 2 * m.params / 64
    assert r.memory["optimizer"] == 12 * m.params / 64


def korthikanti(s, b, h, a, t, sp, recompute):
    """Activation bytes per layer, from the paper's component list (sec. 4.1):
    attention 11sbh + 5as^2b, MLP 19sbh, LayerNorms 4sbh; with TP the LayerNorm
    inputs (4), QKV and fc inputs (2 + 2) and two dropout masks (1 + 1) stay whole
    (10sbh) unless SP splits them; selective recomputation drops 5as^2b; full keeps
    the layer input, 2sbh."""
    if recompute == "full":
        return Fraction(2 * s * b * h, t if sp else 1)
    whole = 4 + 2 + 2 + 1 + 1                                  # not split without SP
    split = (11 + 19 + 4) - whole                              # Q K, V, GeLU in, proj in...
    sbh = s * b * h
    total = Fraction(sbh * whole, t if sp else 1) + Fraction(sbh * split, t)
    if recompute == "none":
        total += Fraction(5 * a * s * s * b, t)
    return total


@pytest.mark.parametrize("t,sp", [(1, False), (2, False), (8, False), (2, True), (8, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_korthikanti_activation_memory(t, sp, recompute):
    if sp and t == 1:
        return
    s, b, h, a = 2048, 4, 12288, 96
    m = Model("x", layers=8, hidden=h, heads=a, seq_len=s, vocab=51200)
    got = layer_activation_bytes(m, Layout(tp=t, sp=sp, micro_batch=b, recompute=recompute,
                                           attention="unfused"))
    assert got == korthikanti(s, b, h, a, t, sp, recompute)
    if recompute == "none":   # the closed forms: sbh(10 + 24/t + 5as/(ht)), (sbh/t)(34 + 5as/h)
        closed = (Fraction(s * b * h, t) * (34 + Fraction(5 * a * s, h)) if sp else
                  s * b * h * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)))
        assert got == closed


@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (12, 32, 1), (4, 8, 2), (8, 64, 4)])
def test_bubble(p, m, v):
    lay = Layout(pp=p, microbatches=m, interleave=v)
    model = Model("x", layers=8 * p * v, hidden=64, heads=4, seq_len=32, vocab=100)
    r = analyze(model, lay, Hardware())
    assert r.bubble == pytest.approx((p - 1) / (v * m), rel=1e-12)
    # equal chunks: Narayanan et al.'s (m + (p-1)/v) of one microbatch's work...
    n = p * v
    assert pipeline_seconds([1.0] * n, [2.0] * n, p, m, v) == (m + (p - 1) / v) * 3.0 * v
    plan = interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m)
    assert makespan_of(plan, lambda a: {"F": 1.0, "B": 2.0}[a.kind]) == pytest.approx(
        (m + (p - 1) / v) * 3.0 * v, rel=1e-12)
    # ...and the chunks here (the first has the embedding, the last the logits) run as
    # the schedule runs them
    fwd, bwd = r.extra["forward"], r.extra["backward"]
    assert len(set(fwd)) > 1
    assert r.times["pipeline"] == pytest.approx(
        makespan_of(plan, lambda a: (fwd if a.kind == "F" else bwd)[a.stage]), rel=1e-9)
    busy = m * max(sum(fwd[k] + bwd[k] for k in range(r_, n, p)) for r_ in range(p))
    assert r.times["bubble"] == pytest.approx(r.times["pipeline"] - busy)


def test_flops_narayanan_eq3_and_the_nn_model():
    B, s, l, h, V = 8, 32, 3, 64, 100
    m = Model("x", layers=l, hidden=h, heads=4, seq_len=s, vocab=V, tied_embeddings=False)
    assert flops_per_iteration(m, B, "full") == pytest.approx(
        narayanan_flops(B, s, l, h, V), rel=1e-12)
    assert flops_per_iteration(m, B) == pytest.approx(
        narayanan_flops(B, s, l, h, V, recompute=False), rel=1e-12)
    gpt = GPT(vocab=V, dim=h, n_heads=4, hidden=4 * h, n_layers=l, seq_len=s,
              rng=np.random.default_rng(0))
    assert forward_flops_per_token(m) * B * s == gpt.flops((B, s))
    # parameters: equation 2, and ringlab's GPT (untied head, final LayerNorm 2h)
    assert m.layers * m.layer_params + (V + s) * h == 12 * l * h * h * (
        1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * l * h))
    assert m.params + 2 * h == sum(a.size for a in gpt.named_parameters().values())
    # 6ND leaves out attention's s x s products: the model FLOPs exceed it by 12 B s^2 l h
    assert flops_per_iteration(m, B) - six_n_d(m, B) == 12 * B * s * s * l * h


def test_llama_shapes():
    """Touvron et al. (2023): 6.74B and 68.98B parameters ("7B", "70B")."""
    assert round(presets.MODELS["llama2-7b"].params / 1e9, 2) == 6.74
    assert round(presets.MODELS["llama2-70b"].params / 1e9, 2) == 68.98


def test_impossible_layouts_say_why():
    m = presets.MODELS["gpt3-175b"]
    with pytest.raises(ValueError, match="must divide the 96 attention heads"):
        Layout(tp=7).check(m)
    Layout(pp=5).check(m)                   # 96 layers on 5 stages: 19 or 20 each
    with pytest.raises(ValueError, match="model chunks for 96 layers"):
        Layout(pp=64, interleave=2, microbatches=64).check(m)
    with pytest.raises(ValueError, match="cluster has 64 GPUs"):
        Layout(dp=2, tp=8).check(m, Hardware(gpus=64))
    with pytest.raises(ValueError, match="multiple of dp x micro_batch"):
        Layout(dp=3, global_batch=16)
    with pytest.raises(ValueError, match="multiple of pp"):
        Layout(pp=4, interleave=2, microbatches=6)


# -- (c) against published end-to-end results ---------------------------------------------------

def test_megatron_2021_table1(capsys):
    """Narayanan et al. (2021), Table 1. The analyzer is not fitted to it: the
    hardware preset (the sustained matmul rate, the DGX A100 links) is the same
    for every row and was set before this comparison. We assert only a broad band."""
    hw = presets.HARDWARE["dgx-a100"]
    assert hw.efficiency == 0.824
    rows = presets.megatron_comparison(hw)
    print(f"\n{'model':<16}{'t':>3}{'p':>4}{'n':>6}{'B':>6}{'published':>11}"
          f"{'estimate':>10}{'est/pub':>9}")
    for row, r in rows:
        # equation 3 is what they report: our FLOPs with full recomputation are it
        eq3 = narayanan_flops(row.batch, 2048, row.layers, row.hidden, 51200)
        assert r.flops == pytest.approx(eq3, rel=1e-12)
        ratio = r.tflops_per_gpu / row.tflops_per_gpu
        print(f"{row.name:<16}{row.tp:>3}{row.pp:>4}{row.gpus:>6}{row.batch:>6}"
              f"{row.tflops_per_gpu:>11}{r.tflops_per_gpu:>10.1f}{ratio:>9.2f}")
        assert 0.5 <= ratio <= 2, row.name
        assert r.fits, row.name
    with capsys.disabled():
        print(capsys.readouterr().out)


# -- the command line ---------------------------------------------------------------------------

def test_cli_table_json_and_errors(capsys):
    args = ["analyze", "--model", "gpt3-175b", "--dp", "8", "--tp", "8", "--pp", "12",
            "--microbatches", "32", "--recompute", "full"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tp_allreduce" in out and "MFU" in out
    assert max(len(line) for line in out.splitlines()) <= 88
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layout"]["gpus"] == 768 and report["bubble"] == pytest.approx(11 / 32)
    assert main(["analyze", "--model", "gpt3-175b", "--tp", "7"]) == 2
    assert "must divide the 96 attention heads" in capsys.readouterr().err
    assert main(["analyze", "--layers", "4", "--hidden", "64"]) == 2
    assert "missing --heads, --seq-len, --vocab" in capsys.readouterr().err
    assert main(["analyze", "--model", "llama2-7b", "--global-batch", "64", "--compare",
                 "dp=8,zero=1", "dp=4,tp=2,sp=1"]) == 0
    assert "dp4-tp2-pp1-sp" in capsys.readouterr().out


def test_compare_layouts_columns():
    m, hw = presets.MODELS["megatron-7.5b"], presets.HARDWARE["dgx-a100"]
    text, reports = compare_layouts(m, hw, [Layout(dp=32, tp=4, global_batch=512),
                                            Layout(dp=16, tp=8, global_batch=512)],
                                    reports=True)
    assert reports[1].by_kind()["tp_allreduce"] > reports[0].by_kind()["tp_allreduce"]
    assert math.isclose(reports[0].flops, reports[1].flops)
    assert len(text.splitlines()) == 15


def test_compare_layouts_wide_labels_go_on_two_lines():
    m, hw = presets.MODELS["gpt3-175b"], presets.HARDWARE["dgx-a100"]
    lays = [Layout(dp=32, tp=8, pp=4, global_batch=1536, zero=1, recompute=rc)
            for rc in ("selective", "none", "full")]
    lays.append(Layout(dp=16, tp=8, pp=8, global_batch=1536, zero=1, sp=True,
                       recompute="selective", micro_batch=2))
    text = compare_layouts(m, hw, lays)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 88 and len(lines) == 16
    assert lines[0].split() == ["layout"] + ["dp32-tp8-pp4"] * 3 + ["dp16-tp8-pp8"]
    assert lines[1].split() == ["z1-sel", "z1", "z1-full", "b2-sp-z1-sel"]
    assert lines[-1].split() == ["fits", "yes", "yes", "yes", "yes"]


# -- (d) issue 25: shapes, precisions, stages, and the new dimensions --------------------------

def analyze_cli(capsys, *args):
    """``ringlab analyze ... --json`` -> the report as a dict."""
    assert main(["analyze", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_pipeline_messages_with_sequence_parallelism_carry_one_tp_th():
    """With --sp each tensor-parallel rank holds 1/t of the tokens and sends those
    (Megatron-LM); the old analyzer sent b s h from every rank."""
    m = presets.MODELS["gpt3-175b"]
    b, s, h, t = 2, 2048, 12288, 8
    for sp in (False, True):
        lay = Layout(tp=t, pp=4, sp=sp, micro_batch=b, microbatches=8)
        (send,) = acomm.pp_comms(m, lay)
        assert send.nbytes == b * s * h * 2 // (t if sp else 1)


def test_activation_memory_follows_the_shape():
    """Llama 2 70B (GQA, SwiGLU, no dropout) at t = 8 with SP: the tensors of one
    layer, counted by hand; the old analyzer gave GPT's 34 + 5as/h whatever the
    MLP's size, the same bytes at ffn 28,672 and 100,000."""
    base = presets.MODELS["llama2-70b"]
    s, h, t, kv = 4096, 8192, 8, 1024                 # 8 kv heads of 128
    lay = Layout(tp=t, sp=True)
    got = {}
    for f in (28672, 100000):
        m = dataclasses.replace(base, ffn=f)
        norms_qkv_fc1 = 4 * 2 * s * h // t            # 2 norm inputs, QKV and fc1 inputs, / t
        q_k_v_proj = 2 * s * (h // t + 2 * kv // t) + 2 * s * h // t
        mlp = 2 * s * 2 * f // t + 2 * s * f // t     # both halves of the gate, fc2's input
        assert layer_activation_bytes(m, lay) == norms_qkv_fc1 + q_k_v_proj + mlp
        got[f] = layer_activation_bytes(m, lay)
    assert got[100000] > got[28672]
    assert layer_activation_bytes(base, lay) == got[28672]


def test_model_switches_on_presets_and_custom_shapes(capsys):
    """Every setting of a shape is an option, on a preset too, and the report says
    which are on; the old CLI could only switch --gated on."""
    r = analyze_cli(capsys, "--model", "llama2-7b", "--no-gated")
    plain = dataclasses.replace(presets.MODELS["llama2-7b"], gated=False)
    assert r["model"] == "llama2-7b*" and r["params"] == plain.params
    r = analyze_cli(capsys, "--layers", "4", "--hidden", "256", "--heads", "4", "--seq-len",
                    "128", "--vocab", "1000", "--no-bias", "--no-learned-positions",
                    "--no-tied-embeddings")
    h = 256
    assert r["params"] == 4 * (12 * h * h + 2 * h) + 2 * 1000 * h
    r = analyze_cli(capsys, "--model", "gpt3-175b", "--hidden", "4096", "--heads", "32")
    assert r["model"] == "gpt3-175b*" and r["params"] == Model(
        "x", layers=96, hidden=4096, heads=32, seq_len=2048, vocab=50257).params
    assert main(["analyze", "--model", "llama2-7b", "--no-rotary", "--dropout"]) == 0
    out = capsys.readouterr().out
    assert "gated no-bias no-learned-pos untied dropout" in out and "rotary" not in out
    assert max(len(line) for line in out.splitlines()) <= 88


def test_fp32_gradients_and_the_distributed_optimizer(capsys):
    """Megatron-LM with bf16 weights and fp32 gradients: 18 bytes per parameter,
    6 + 12/d with the distributed optimizer (docs/source/distrib_optimizer.md);
    the gradients are reduced in fp32 too."""
    args = ["--model", "megatron-1.7b", "--dp", "8", "--global-batch", "64"]
    r0 = analyze_cli(capsys, *args, "--fp32-grads")
    psi = r0["params_per_gpu"]
    states = sum(v for k, v in r0["memory_bytes"].items() if k not in ("activations", "total"))
    assert states == pytest.approx(18 * psi)
    r1 = analyze_cli(capsys, *args, "--fp32-grads", "--distributed-optimizer")
    states = sum(v for k, v in r1["memory_bytes"].items() if k not in ("activations", "total"))
    assert states == pytest.approx((6 + 12 / 8) * psi)
    r16 = analyze_cli(capsys, *args, "--distributed-optimizer")
    rs = {c["kind"]: c["bytes_sent"] for c in r1["comm"]}
    rs16 = {c["kind"]: c["bytes_sent"] for c in r16["comm"]}
    assert rs["dp_reduce_scatter"] == 2 * rs16["dp_reduce_scatter"]
    assert rs["dp_allgather"] == rs16["dp_allgather"]          # 16-bit weights
    assert main(["analyze", *args, "--distributed-optimizer", "--zero", "3"]) == 2
    assert "--distributed-optimizer is ZeRO-1" in capsys.readouterr().err


def test_fp8_speeds_up_the_linear_layers_only(capsys):
    """FP8 (Transformer Engine): the four linear layers' matmuls at the FP8 rate;
    attention, the logits and every message stay 16-bit. No FP8 on an A100."""
    m, hw = presets.MODELS["llama3-8b"], presets.HARDWARE["dgx-h100"]
    lay = Layout(tp=2, sp=True, global_batch=4)
    bf16, fp8 = analyze(m, lay, hw), analyze(m, dataclasses.replace(lay, fp8=True), hw)
    assert fp8.times["matmul"] < bf16.times["matmul"]
    assert fp8.times["attention"] == bf16.times["attention"]
    assert fp8.by_kind() == bf16.by_kind()
    w16, w8 = layer_work(m, lay, hw), layer_work(m, dataclasses.replace(lay, fp8=True), hw)
    T = 8192
    big = gemm_seconds(T, 14336, 4096, hw, fp8=True)        # one half of fc1: compute-bound
    assert big == pytest.approx(2 * T * 14336 * 4096 / (1979e12 * 0.651 * wave_quantization(
        T, 14336, hw)))
    assert w8.gemms["fc2"][0] < w16.gemms["fc2"][0]
    assert head_work(m, dataclasses.replace(lay, fp8=True), hw).gemms == head_work(
        m, lay, hw).gemms
    assert main(["analyze", "--model", "llama3-8b", "--fp8"]) == 2
    assert "no FP8 tensor cores" in capsys.readouterr().err


def test_uneven_stages_and_the_heavy_last_stage(capsys):
    """126 layers on 16 stages and 70 on 12 are real runs (Llama 3 405B, BLOOM):
    the old analyzer refused them. A 250k vocabulary makes the logits' stage the
    slowest unless it gets fewer layers (BLOOM's partition: 5, 6 x 10, 5)."""
    bloom = Model("bloom", layers=70, hidden=14336, heads=112, seq_len=2048, vocab=250880,
                  learned_positions=False)
    hw = presets.HARDWARE["dgx-a100"]
    lay = Layout(dp=8, tp=4, pp=12, micro_batch=2, global_batch=2048, recompute="full")
    r = analyze(bloom, lay, hw)
    assert even_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert r.layout.split(bloom) == (5,) + (6,) * 10 + (5,)
    assert r.extra["critical_rank"] == 11
    even = dataclasses.replace(lay, stage_layers=(6,) * 5 + (5,) * 2 + (6,) * 5)
    assert analyze(bloom, even, hw).step > r.step
    # the 1F1B makespan of unequal stages is the schedule's, action by action
    fwd, bwd = r.extra["forward"], r.extra["backward"]
    plan = one_f_one_b(12, 128)
    assert r.times["pipeline"] == pytest.approx(
        makespan_of(plan, lambda a: (fwd if a.kind == "F" else bwd)[a.stage]), rel=1e-9)
    assert main(["analyze", "--model", "llama2-7b", "--pp", "4", "--stage-layers",
                 "8,8,8,9"]) == 2
    assert "add up to 33" in capsys.readouterr().err


def test_pipeline_with_unequal_stages_equals_the_simulation():
    """Rank r of a 1F1B pipeline slower by a factor: the analyzer's makespan of the
    schedule equals ringlab's simulated run of it (messages free)."""
    from ringlab.pipeline.stages import pipeline_stage, stage_works
    W = 8
    for p, m, scale in [(4, 8, [1.5, 1, 1, 1]), (4, 8, [1, 1, 1, 1.5]), (3, 12, [1.3, 1, 0.7])]:
        model = mlp_model([W] * (p + 1), np.random.default_rng(0))
        x = np.random.default_rng(1).normal(size=(2 * m, W))
        works = stage_works(model, (x, np.zeros_like(x)), one_f_one_b(p, m), t_f=1.0,
                            t_b=1.0, t_w=1.0)
        for r, w in enumerate(works):
            w.seconds = {k: s * scale[r] for k, s in w.seconds.items()}
        res = ringlab.run(pipeline_stage, works)
        ours = pipeline_seconds([1.0 * c for c in scale], [2.0 * c for c in scale], p, m)
        assert ours == pytest.approx(res.time, rel=1e-12)


def test_gemm_roofline_and_quantization():
    """A matmul's time from its shape: compute-bound at efficiency x peak / q,
    memory-bound at HBM bandwidth; q counts tiles that hang over the edge and the
    last partial wave (NVIDIA, Matrix Multiplication Background, ch. 3)."""
    a100 = presets.HARDWARE["dgx-a100"]
    m, n, k = 8192, 8192, 8192                      # 64 x 32 = 2048 tiles of 128 x 256
    waves = math.ceil(2048 / 108)
    assert wave_quantization(m, n, a100) == pytest.approx(2048 / (waves * 108))
    assert gemm_seconds(m, n, k, a100) == pytest.approx(
        2 * m * n * k / (312e12 * 0.824 * wave_quantization(m, n, a100)))
    skinny = gemm_seconds(8192, 8192, 16, a100)      # 2 mnk / bytes = 16: memory-bound
    assert skinny == pytest.approx((8192 * 16 * 2 * 2 + 8192 * 8192 * 2) / (2.039e12 * 0.8))
    assert linear_seconds(2048, 512, 4096, a100)[2] == gemm_seconds(4096, 512, 2048, a100)


def test_efficiency_is_an_input(capsys):
    """The same 530B layout on the same GPUs ran at 30% MFU in one framework and
    at 42% in another: what the stack reaches is an input (--efficiency), not a
    fixed 75%."""
    args = ["--model", "megatron-529.6b", "--tp", "8", "--pp", "35", "--global-batch", "280",
            "--recompute", "full", "--attention", "unfused"]
    fast = analyze_cli(capsys, *args)
    slow = analyze_cli(capsys, *args, "--efficiency", "0.6")
    assert slow["step_seconds"] > 1.3 * fast["step_seconds"]
    assert slow["times"]["memory_bound"] == fast["times"]["memory_bound"]


def test_link_efficiency_is_an_input(capsys):
    """NCCL's share of a link's line rate (--intra-efficiency, --inter-efficiency):
    half the share, twice each collective's bandwidth term; out of (0, 1], exit 2."""
    args = ["--model", "gpt3-175b", "--tp", "8", "--sp", "--microbatches", "2",
            "--overlap-tp", "none"]
    base = analyze_cli(capsys, *args)
    half = analyze_cli(capsys, *args, "--intra-efficiency", str(0.767 / 2))
    (ag,), (ag2,) = ([c for c in r["comm"] if c["kind"] == "tp_allgather"]
                     for r in (base, half))
    latency = ag["count"] * 7 * 5e-6
    assert ag2["seconds"] - latency == pytest.approx(2 * (ag["seconds"] - latency))
    assert half["step_seconds"] > base["step_seconds"]
    assert main(["analyze", *args, "--inter-efficiency", "1.5"]) == 2
    assert "inter_efficiency is a fraction" in capsys.readouterr().err


def test_optimizer_step_and_memory_bound_kernels_take_time():
    m, hw = presets.MODELS["gpt3-175b"], presets.HARDWARE["dgx-a100"]
    r = analyze(m, Layout(dp=32, tp=8, pp=4, global_batch=1536, zero=1), hw)
    psi = r.params_per_gpu
    local = sum(rank_params(m, r.layout, r.extra["critical_rank"]))
    assert r.times["optimizer"] == pytest.approx(
        (local / 32 * (26 + 2 * 2) + local * 2) / (2.039e12 * 0.8))
    assert 0 < r.times["memory_bound"] < r.times["matmul"] and psi >= local
    w = layer_work(m, Layout(tp=8), hw)
    T, h = 2048, 12288
    fwd_bytes = 4 * T * h * 2 + 2 * T * h * 7 + 2 * T * 4 * h // 8 * 2   # norms, adds, GeLU
    assert w.forward["memory"] == pytest.approx(fwd_bytes / (2.039e12 * 0.8))
    assert w.backward["memory"] == pytest.approx(2 * w.forward["memory"])


def test_tensor_parallel_overlap_options():
    """Exposed TP time: each collective less the matmul it can hide under."""
    m, hw = presets.MODELS["gpt3-175b"], presets.HARDWARE["dgx-a100"]
    base = Layout(tp=8, sp=True, microbatches=4)
    times = {o: analyze(m, dataclasses.replace(base, overlap_tp=o), hw).times["tp"]
             for o in ("none", "backward", "full")}
    assert times["none"] > times["backward"] > times["full"] >= 0
    w = layer_work(m, base, hw)
    nvlink = 1 / (300e9 * 0.767)               # NCCL's ~230 of 300 GB/s (nccl-tests#149)
    ag = acomm.Traffic("tp", "allgather", 8, 2048 * 12288 * 2, 1).time_one(5e-6, nvlink)
    rs = acomm.Traffic("tp", "reduce_scatter", 8, 2048 * 12288 * 2, 1).time_one(5e-6, nvlink)
    none_layer = 6 * ag + 4 * rs
    assert times["none"] == pytest.approx(4 * 96 * none_layer)
    back = 0.0
    for inner in ("qkv", "fc1"):
        back += max(0, rs - w.gemms[inner][2]) + max(0, ag - w.gemms[inner][1])
    assert times["backward"] == pytest.approx(4 * 96 * (none_layer - 4 * ag - 2 * rs + back
                                                        + 2 * ag))
    with pytest.raises(ValueError, match="needs sp"):
        Layout(tp=8, overlap_tp="full")


def test_interleaved_sends_overlap_compute():
    """Megatron-LM overlaps the interleaved schedule's sends with compute: only the
    fill and the drain, 2 (p - 1) message times, are exposed, not 2 (v p - 1)."""
    assert pp_exposed_messages(4, 8, 2, overlap=True) == 6
    assert pp_exposed_messages(4, 8, 2, overlap=False) == 14
    m, hw = presets.MODELS["gpt3-175b"], presets.HARDWARE["dgx-a100"]
    lay = Layout(dp=8, tp=8, pp=8, interleave=3, global_batch=512)
    on, off = analyze(m, lay, hw), analyze(m, dataclasses.replace(lay, overlap_pp=False), hw)
    one = [c for c in on.comms if c.kind == "pp_send"][0].time_one(10e-6, 1 / (25e9 * 0.96))
    assert on.times["pp_exposed"] == pytest.approx(14 * one)
    assert off.times["pp_exposed"] == pytest.approx(46 * one)


@pytest.mark.parametrize("c", [2, 4])
@pytest.mark.parametrize("kind", ["ring", "allgather"])
def test_context_parallel_bytes_equal_a_simulated_ring_attention(c, kind):
    """Ring attention (forward: c-1 passes of K, V; backward: K, V and their
    gradients c-1 times, then the gradients home) and the all-gather variant,
    run on ringlab: right outputs and gradients, and every byte the analyzer's."""
    s, d = 8 * c, 4
    rng = np.random.default_rng(c)
    q, k, v, do = (rng.standard_normal((s, d)) for _ in range(4))
    want = cp_programs.reference(q, k, v, do)
    n = s // c
    blocks = [tuple(x[r * n:(r + 1) * n] for x in (q, k, v, do)) for r in range(c)]
    program = cp_programs.ring_attention if kind == "ring" else cp_programs.allgather_attention
    res = ringlab.run(program, blocks)
    for r, got in enumerate(res.outputs):
        for ours, theirs in zip(got, want):
            np.testing.assert_allclose(ours, theirs[r * n:(r + 1) * n], rtol=1e-10, atol=1e-12)
    sent = Counter()
    for e in res.trace.events:
        if e.src == 0:
            sent["fwd" if "cp.forward" in e.span else "bwd"] += e.nbytes
    one = Model("one", layers=1, hidden=d, heads=1, seq_len=s, vocab=8, act_bytes=8)
    lay = Layout(cp=c, cp_kind=kind)
    block = acomm.cp_block_bytes(one, lay)
    assert block == 2 * n * d * 8                         # K and V of one rank
    if kind == "ring":
        assert sent == {"fwd": (c - 1) * block, "bwd": (2 * c - 1) * block}
        assert sent["fwd"] == 2 * (c - 1) / c * s * d * 8     # 2 (c-1)/c b s kv per rank
    else:
        assert sent == {"fwd": (c - 1) * block, "bwd": (c - 1) * block}
    kinds = {x.kind: x.bytes_sent for x in acomm.cp_comms(one, lay, 1)}
    assert sum(kinds.values()) == sent["fwd"] + sent["bwd"]


def test_context_parallelism_in_the_step():
    """Each CP rank has s/c tokens: TP and pipeline messages shrink c times, the
    gradients are reduced over dp x cp ranks, and the K/V ring hides under the
    attention blocks when they are long enough."""
    m = dataclasses.replace(presets.MODELS["llama3-405b"], seq_len=131072)
    hw = presets.HARDWARE["dgx-h100"]
    lay = Layout(dp=8, tp=8, cp=16, pp=16, sp=True, global_batch=128, zero=1, interleave=8,
                 stage_layers=(0,) + (1,) * 126 + (0,), cp_kind="ring")
    r = analyze(m, lay, hw)
    assert r.links["cp"] == "inter" and r.links["dp"] == "inter"
    dp = [c for c in r.comms if c.kind == "dp_reduce_scatter"][0]
    assert dp.group == 128
    tp = [c for c in r.comms if c.kind == "tp_allgather"][0]
    assert tp.nbytes == 131072 // 16 * 16384 * 2
    # the ring on one layer, one microbatch: the K/V block of a rank is 2 (s/c) kv/t x 2 B
    n = 2 * (131072 // 16) * (1024 // 8) * 2
    w = layer_work(m, lay, hw)
    one, two = 10e-6 + n / (50e9 * 0.96), 10e-6 + 2 * n / (50e9 * 0.96)
    fwd = 15 * max(0.0, one - w.forward["attention"] / 16)
    bwd = 15 * max(0.0, two - w.backward["attention"] / 16) + one
    assert r.times["cp"] == pytest.approx(16 * 8 * (fwd + bwd))     # m x the rank's 8 layers
    assert acomm.cp_block_bytes(m, lay) == n
    ag = analyze(m, dataclasses.replace(lay, cp_kind="allgather"), hw)
    assert ag.times["cp"] > r.times["cp"]
    with pytest.raises(ValueError, match="needs attention='flash'"):
        Layout(cp=2, attention="unfused")


def test_mixture_of_experts_shapes_and_alltoall():
    """Experts: parameters, model FLOPs (the top_k experts a token uses), and the
    AlltoAll bytes, the part to peers in the node on NVLink."""
    moe = Model("moe", layers=4, hidden=1024, heads=8, seq_len=1024, vocab=1000, ffn=4096,
                gated=True, bias=False, learned_positions=False, tied_embeddings=False,
                dropout=False, experts=16, top_k=2, moe_ffn=512, shared_experts=1,
                moe_layers=3)
    h, f, fe = 1024, 4096, 512
    attn = 4 * h * h
    assert moe.params == (attn + 2 * h + 3 * h * f) + 3 * (attn + 2 * h + h * 16
                                                            + 17 * 3 * h * fe) + 2 * 1000 * h
    per_token = (2 * (attn + 3 * h * f) + 4 * 1024 * h) + 3 * (
        2 * (attn + h * 16 + 3 * 3 * h * fe) + 4 * 1024 * h) + 2 * h * 1000
    assert forward_flops_per_token(moe) == per_token
    hw = presets.HARDWARE["dgx-h100"]
    lay = Layout(dp=16, ep=16, global_batch=32)
    r = analyze(moe, lay, hw)
    (a2a,) = [c for c in r.comms if c.kind == "ep_alltoall"]
    tokens = 1024 * 2                                # b s, top_k = 2, no capacity factor
    assert a2a.nbytes == tokens * h * 2 and a2a.count == 4 * 3 * 2
    assert a2a.bytes_sent == a2a.count * 15 / 16 * a2a.nbytes
    assert a2a.link == "mixed" and a2a.intra_share == pytest.approx(7 / 15)
    out = 15 / 16 * a2a.nbytes
    one = 10e-6 + max(out * 7 / 15 / (450e9 * 0.822), out * 8 / 15 / (50e9 * 0.96))
    assert a2a.seconds == pytest.approx(a2a.count * one)
    assert r.times["ep"] == pytest.approx(a2a.seconds)
    # each expert lives on one rank of the 16 (dp x tp / ep = 1): no expert gradient sync,
    # while the dense parameters are reduced over the 16 data-parallel ranks
    assert not [c for c in r.comms if c.kind.startswith("ex_")]
    assert [c.group for c in r.comms if c.kind == "dp_allreduce"] == [16]
    more = analyze(moe, dataclasses.replace(lay, ep=8), hw)
    assert [c.group for c in more.comms if c.kind == "ex_dp_allreduce"] == [2]
    capped = analyze(moe, dataclasses.replace(lay, capacity=1.25), hw)
    assert [c for c in capped.comms if c.kind == "ep_alltoall"][0].nbytes == 1.25 * a2a.nbytes


BAD = [
    (["--model", "gpt3-175b", "--ep", "2"], "needs a model with experts"),
    (["--model", "gpt3-175b", "--tp", "8", "--overlap-tp", "full"], "needs sp"),
    (["--model", "gpt3-175b", "--cp", "2", "--attention", "unfused"], "needs attention='flash'"),
    (["--model", "gpt3-175b", "--cp", "3"], "2 x cp = 6 must divide the sequence length"),
    (["--model", "llama3-8b", "--fp8"], "no FP8 tensor cores"),
    (["--model", "gpt3-175b", "--distributed-optimizer", "--zero", "2"],
     "--distributed-optimizer is ZeRO-1"),
    (["--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "10",
      "--experts", "8", "--ep", "3", "--dp", "3"], "ep = 3 must divide the 8 experts"),
    (["--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "10",
      "--experts", "8", "--ep", "2", "--tp", "2", "--dp", "1"], "need sequence parallelism"),
    (["--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "10",
      "--top-k", "2"], "need experts > 0"),
    (["--model", "gpt3-175b", "--pp", "2", "--stage-layers", "40,50"], "add up to 90"),
]


@pytest.mark.parametrize("args,reason", BAD)
def test_bad_combinations_exit_2_with_the_reason(capsys, args, reason):
    assert main(["analyze", *args]) == 2
    assert reason in capsys.readouterr().err


def test_help_lists_the_new_options(capsys):
    with pytest.raises(SystemExit) as done:
        main(["analyze", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for option in ("--cp", "--cp-kind", "--ep", "--experts", "--top-k", "--moe-ffn",
                   "--capacity", "--kv-heads", "--gated", "--no-gated", "--bias",
                   "--tied-embeddings", "--learned-positions", "--rotary", "--dropout",
                   "--stage-layers", "--fp32-grads", "--distributed-optimizer", "--fp8",
                   "--attention", "--overlap-tp", "--overlap-param-gather", "--no-overlap-pp",
                   "--efficiency", "--attention-efficiency", "--hbm-efficiency", "--hbm-tbps",
                   "--intra-efficiency", "--inter-efficiency"):
        assert option in text, option
