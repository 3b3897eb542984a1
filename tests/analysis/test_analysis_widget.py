"""The closing chapter's panel (ringlab.analysis.explorer): its text is the
analyzer's report, the static explorer holds every layout's text and picks the
right one in a real browser, with no JavaScript error."""

import base64
import gzip
import html
import json

import pytest

from ringlab.analysis import Layout, analyze, presets
from ringlab.analysis import explorer as aw
from support.chromium import CHROMIUM, DRIVER, headless_chromium, open_snippet, severe

GPT3, A100 = presets.MODELS["gpt3-175b"], presets.HARDWARE["dgx-a100"]


def test_summary_is_the_report():
    lay = Layout(dp=32, tp=8, pp=4, microbatches=48, zero=1, recompute="selective")
    r = analyze(GPT3, lay, A100)
    text = aw.summary("gpt3-175b", dp=32, tp=8, pp=4, microbatches=48, zero=1,
                      recompute="selective")
    assert text == "\n".join(aw.lines(r))
    assert f"step time  {r.step:8.3f} s" in text and f"MFU        {r.mfu:8.1%}" in text
    assert f"{r.memory['total'] / 1e9:8.1f} GB per GPU" in text and "fits in 80 GB: yes" in text
    assert max(len(line) for line in text.splitlines()) <= 88
    assert aw.summary("gpt3-175b", tp=7) == (
        "not possible: tp = 7 must divide the 96 attention heads (each rank keeps whole heads)")


def test_panel_builds_and_reruns():
    pytest.importorskip("ipywidgets")
    panel = aw.analysis_panel()
    shown = panel.children[-1]
    assert shown.value == f"<pre>{html.escape(aw.explorer().texts['8,4,0,1,selective'])}</pre>"
    panel.controls["tp"].value = 16                               # tp over two nodes
    want = aw.summary(dp=32, tp=16, pp=4, microbatches=48, zero=1, recompute="selective")
    assert shown.value == f"<pre>{html.escape(want)}</pre>" and "2048 GPUs" in want
    panel.controls["tp"].value = 32
    assert "dp32-tp32-pp4-z1-sel: 4096 GPUs" in shown.value          # 96 / 32 = 3 heads
    panel.controls["tp"].value = 1
    panel.controls["sp"].value = True
    assert "sequence parallelism needs tp &gt; 1" in shown.value


def test_explorer_holds_every_layout():
    ex = aw.explorer()
    assert len(ex.texts) == 5 * 6 * 2 * 4 * 3
    texts = json.loads(gzip.decompress(base64.b64decode(ex.packed())))
    assert texts == ex.texts
    lay = Layout(dp=8, tp=8, pp=16, global_batch=1536, sp=True, zero=2, recompute="full")
    assert texts["8,16,1,2,full"] == "\n".join(aw.lines(analyze(GPT3, lay, A100)))
    assert texts["1,1,0,0,none"].startswith("not possible: layout: global_batch = 1536")
    assert texts["1,4,1,0,none"] == "not possible: layout: sequence parallelism needs tp > 1"
    assert ex.texts[ex.default].startswith("dp32-tp8-pp4-z1-sel: 1024 GPUs")
    assert ex.html().count("<select") == 5 and ex.packed() == aw.explorer().packed()


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and driver")
def test_explorer_in_a_browser(tmp_path):
    from selenium.webdriver.support.ui import Select
    ex = aw.explorer()
    driver = headless_chromium(tmp_path / "profile")
    try:
        pre = open_snippet(driver, tmp_path, ex.html(), ".ringlab-analysis").find_element(
            "css selector", "pre")
        assert pre.text == ex.texts[ex.default]
        for key, value in (("tp", "16"), ("sp", "1"), ("recompute", "full")):
            Select(driver.find_element("css selector", f"select[data-key={key}]")
                   ).select_by_value(value)
        assert pre.text == ex.texts["16,4,1,1,full"]
        assert not severe(driver), severe(driver)
    finally:
        driver.quit()
