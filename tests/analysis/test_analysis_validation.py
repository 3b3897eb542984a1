"""The analyzer against published runs it was not fitted to (ringlab.analysis.published).

First the rows are checked against their own sources' other columns (a misread
number shows up there); then the comparison: what the book's closing chapter
reports, computed here the same way. The analyzer's defaults were fixed before
the comparison (commit "analyze: a compute model ...", presets.py) and are
asserted unchanged, so that nobody tunes them to this table without it showing.
"""

import statistics

import pytest

from ringlab.analysis import presets, published
from ringlab.analysis.compute import flops_per_iteration

RUNS = published.RUNS


def test_at_least_12_runs_from_4_teams_each_with_its_source():
    assert len(RUNS) >= 12 and len({r.team for r in RUNS}) >= 4
    for run in RUNS:
        assert run.source and run.where and run.metric
        run.layout.check(run.model, run.hardware)


def test_the_defaults_are_the_ones_fixed_before_the_comparison():
    a100, h100 = presets.HARDWARE["dgx-a100"], presets.HARDWARE["dgx-h100"]
    assert (a100.efficiency, a100.attention_efficiency, a100.hbm_efficiency) == (
        0.869, 0.615, 0.8)
    assert (h100.efficiency, h100.fp8_efficiency, h100.attention_efficiency,
            h100.hbm_efficiency) == (0.803, 0.709, 0.632, 0.8)
    assert all(r.hardware.efficiency == (0.869 if r.hardware.peak_flops == 312e12 else 0.803)
               for r in RUNS)


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
    """What the closing chapter reports: the ratios, their median and range. The
    targets of issue 25 (median within 10%, every run within 25%) are not met: the
    assertions say what is true, not what was hoped for."""
    ratios = {run.name: ratio for run, _, ratio in published.comparison()}
    median = statistics.median(ratios.values())
    assert 1.10 < median < 1.25                        # optimistic by 10-25% (not within 10%)
    inside = [n for n, x in ratios.items() if 0.75 <= x <= 1.25]
    outliers = sorted(set(ratios) - set(inside))
    assert all(run.team == "Meta" for run in RUNS if run.name in outliers)
    assert len(inside) >= 19
    assert all(0.8 < x < 2.0 for x in ratios.values())
