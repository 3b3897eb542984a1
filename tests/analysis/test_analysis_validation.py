"""The analyzer against published runs it was not fitted to (ringlab.analysis.published).

First the rows are checked against their own sources' other columns (a misread
number shows up there); then the comparison: what the book's closing chapter
reports, computed here the same way. The analyzer's defaults are measurements
from sources independent of these runs (presets.py says which) and are asserted
to be those measurements, so that nobody tunes them to this table without it
showing.
"""

import dataclasses
import statistics

import pytest

from ringlab.analysis import presets, published
from ringlab.analysis.compute import flops_per_iteration
from ringlab.analysis.config import Layout
from ringlab.analysis.step import analyze, link_cost
from ringlab.analysis.timing import layer_work

RUNS = published.RUNS


def test_at_least_12_runs_from_4_teams_each_with_its_source():
    assert len(RUNS) >= 12 and len({r.team for r in RUNS}) >= 4
    for run in RUNS:
        assert run.source and run.where and run.metric
        run.layout.check(run.model, run.hardware)


def test_the_defaults_are_their_sources_measurements():
    """Each preset efficiency is one measured number of a source that is not one of
    the runs (presets.py cites them): the sustained matmul rate (He 2024 on A100:
    257 of 312 TFLOP/s; Bekman's MSMF on H200, the H100's compute: 708.5 of 989,
    FP8 1288.7 of 1979), NCCL's share of the links (Jeaugey: ~230 of 300 GB/s on
    A100 NVLink, 370 of 450 on H100, 24 of 25 GB/s on a 200G NIC)."""
    a100, h100 = presets.HARDWARE["dgx-a100"], presets.HARDWARE["dgx-h100"]
    assert a100.efficiency == round(257 / 312, 3)
    assert (h100.efficiency, h100.fp8_efficiency) == (round(708.5 / 989, 3),
                                                      round(1288.7 / 1979, 3))
    assert (a100.intra_efficiency, h100.intra_efficiency) == (round(230 / 300, 3),
                                                              round(370 / 450, 3))
    assert a100.inter_efficiency == h100.inter_efficiency == 24 / 25
    assert (a100.attention_efficiency, a100.hbm_efficiency) == (0.615, 0.8)
    assert (h100.attention_efficiency, h100.hbm_efficiency) == (0.632, 0.8)
    for run in RUNS:        # every run on its preset, but for what a row says it reads
        preset = a100 if run.hardware.peak_flops == 312e12 else h100
        assert run.hardware.efficiency == preset.efficiency, run.name
        assert run.hardware.intra_efficiency == preset.intra_efficiency, run.name
        if run.hardware.attention_efficiency != preset.attention_efficiency:
            assert run.team == "Meta" and "FlashAttention-2 (35%" in run.assumed
            assert run.hardware.attention_efficiency == 0.35


def test_nccl_share_of_the_link_in_every_collective():
    """A collective's beta is 1 / (line rate x NCCL's share): on the preset, one TP
    AllGather of 2048 x 12288 x 2 bytes over 8 GPUs takes (7/8) n / (300 GB/s x 0.767),
    1/0.767 = 1.30 times what the line rate gives (the term this commit adds)."""
    a100 = presets.HARDWARE["dgx-a100"]
    line = dataclasses.replace(a100, intra_efficiency=1.0, inter_efficiency=1.0)
    assert link_cost(a100, "intra")[1] == pytest.approx(1 / (300e9 * 0.767))
    assert link_cost(a100, "inter")[1] == pytest.approx(1 / (25e9 * 0.96))
    model = presets.MODELS["gpt3-175b"]
    lay = Layout(tp=8, sp=True, microbatches=4, overlap_tp="none")
    ours, at_line = analyze(model, lay, a100), analyze(model, lay, line)
    n = 2048 * 12288 * 2
    ag = [c for c in ours.comms if c.kind == "tp_allgather"][0]
    assert ag.seconds / ag.count == pytest.approx(7 * (5e-6 + n / 8 / (300e9 * 0.767)))
    latency = 4 * 96 * 10 * 7 * 5e-6
    assert (ours.times["tp"] - latency) / (at_line.times["tp"] - latency) == pytest.approx(
        1 / 0.767)


def test_korthikanti_table4_one_layer():
    """Korthikanti et al.'s Table 4 times one layer of their 22B model (t = 8, b = 4,
    A100): forward plus backward, five ways. With the sustained matmul rate and
    NCCL's share of NVLink the analyzer's layer is within 4% of each (with the
    burst MAMF and the line rate it was 4-10% fast). Not a fit: no constant comes
    from this table."""
    hw, k22 = presets.HARDWARE["dgx-a100"], RUNS[0].model
    table4 = [(False, "none", 7.7 + 11.9), (True, "none", 7.2 + 11.8),
              (False, "full", 7.7 + 19.5), (False, "selective", 7.7 + 13.2),
              (True, "selective", 7.2 + 13.1)]
    for sp, recompute, ms in table4:
        lay = Layout(tp=8, micro_batch=4, sp=sp, recompute=recompute, attention="unfused")
        w = layer_work(k22, lay, hw)
        ours = (w.seconds + analyze(k22, lay, hw).times["tp"] / 48) * 1e3
        assert 0.96 < ours / ms < 1.04, (sp, recompute, ours, ms)


def test_korthikanti_table5_mfu_column_from_its_times():
    """Table 5's MFU: model FLOPs (their eq. 7) / (time x GPUs x 312 TFLOP/s)."""
    mfu = {"22B": 0.415, "175B": 0.514, "530B": 0.560, "1T": 0.563}
    for run in RUNS:
        if run.team == "NVIDIA" and run.name.endswith("present work"):
            flops = flops_per_iteration(run.model, run.layout.global_batch, "none")
            ours = flops / (run.published * run.layout.gpus * 312e12)
            assert ours == pytest.approx(mfu[run.name.split()[0]], abs=0.003), run.name


def test_megascale_mfu_column_from_its_times():
    """MegaScale's MFU column is eq. 7's model FLOPs at 312 TFLOP/s per GPU: the count
    we use to turn Table 3's 47.7% into seconds."""
    for (gpus, batch), mfu in published.MEGASCALE_MFU.items():
        (run,) = [r for r in RUNS if r.name == f"175B, {gpus} GPUs, batch {batch}"]
        flops = flops_per_iteration(run.model, batch, "none")
        assert flops / (run.published * gpus * 312e12) == pytest.approx(mfu, abs=0.002)


def test_llama3_tflops_and_mfu_columns_agree():
    """Table 4: 430, 400, 380 TFLOPs/GPU and 43%, 41%, 38% MFU: of the H100's 989
    they are 43.5%, 40.4%, 38.4% (the table's rounding, or a slightly different peak)."""
    for run, mfu in zip([r for r in RUNS if r.team == "Meta"], (0.43, 0.41, 0.38)):
        assert run.published / 989 == pytest.approx(mfu, abs=0.01)
        assert run.layout.gpus == int(run.name.split()[1].replace(",", ""))


def test_the_comparison():
    """What the closing chapter reports: the ratios, their median and range. Issue
    25's targets were a median within 10% and every run within 25%: the median is
    1.10 (just over), every run but one inside 25%, the one outside Llama 3 405B at
    131K tokens (1.30). The bounds fail if the accuracy regresses."""
    ratios = {run.name: ratio for run, _, ratio in published.comparison()}
    median = statistics.median(ratios.values())
    assert 1.0 < median < 1.11                         # still optimistic, by 10%
    inside = [n for n, x in ratios.items() if 0.75 <= x <= 1.25]
    outliers = sorted(set(ratios) - set(inside))
    assert outliers == ["405B, 16384 GPUs, cp 16, 128K"]
    assert len(inside) == 21
    assert all(1.0 < x < 1.35 for x in ratios.values())
    a100 = [x for run, _, x in published.comparison() if run.hardware.peak_flops == 312e12]
    assert statistics.median(a100) < 1.11 and max(a100) < 1.2
