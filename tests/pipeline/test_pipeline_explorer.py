"""The pipeline chapter's kernel-free explorer (ringlab.pipeline.explorer): each
packed run is the simulator's run of that schedule, its text the measured bubble
and the closed form of Narayanan et al. / Qi et al., and impossible settings
say why."""

from fractions import Fraction

import pytest
from support.chromium import CHROMIUM, DRIVER, headless_chromium, open_snippet, severe

from ringlab.pipeline import bubble
from ringlab.pipeline.drawing import pipeline_boxes
from ringlab.pipeline.explorer import TICKS, PipelineExplorer
from ringlab.pipeline.panel import SCHEDULES, simulate
from ringlab.show.packed import unpack


@pytest.fixture(scope="module")
def small():
    return PipelineExplorer(ps=(2, 4), ms=(1, 4, 8), vs=(2, 4))


def test_every_setting_is_held(small):
    # 3 schedules x 2 p x 3 m, and interleaved x 2 v.
    assert len(small.runs) == 3 * 2 * 3 + 2 * 2 * 3
    assert set(small.runs) == {small.key(s, p, m, v) for s in SCHEDULES for p in (2, 4)
                               for m in (1, 4, 8) for v in (2, 4)}
    assert small.key("gpipe", 4, 8, 3) == "gpipe,4,8,1"          # v only for interleaved


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("one_f_one_b", 2, 4, 1),
                                            ("interleaved_1f1b", 4, 8, 2),
                                            ("interleaved_1f1b", 2, 4, 4), ("zb_h1", 4, 4, 1)])
def test_a_run_is_the_simulators(small, schedule, p, m, v):
    run = small.runs[small.key(schedule, p, m, v)]
    out = simulate(p, m, v, schedule)
    want = [[b["rank"], b["start"], b["end"], b["mb"], b["stage"], "FBW".index(b["shade"])]
            for b in pipeline_boxes(out["result"].trace)]
    got = [[r, Fraction(s, TICKS), Fraction(e, TICKS), mb, st, k]
           for r, s, e, mb, st, k in run["boxes"]]
    assert got == want                                   # exact: times are whole ticks
    assert Fraction(run["end"], TICKS) == out["stats"].makespan
    # Every rank does v m forwards and v m backwards (and ZB-H1 m W's).
    assert len(got) == p * v * m * (3 if schedule == "zb_h1" else 2)
    closed = bubble.bubble_closed_form(schedule, p, m, v)
    assert all(b == closed for b in out["stats"].bubble)   # t_f = t_b = t_w: the formula holds
    lines = run["text"].splitlines()
    assert f"{out['stats'].messages} messages" in lines[0]
    assert out["stats"].messages == bubble.messages_closed_form(p, m, v)
    assert f"= {100 * float(closed):.1f}%" in lines[1]
    assert lines[2] == f"peak activations held per rank {out['stats'].peak_held}"
    assert out["stats"].peak_held == [bubble.peak_held_closed_form(schedule, p, m, r, v)
                                      for r in range(p)]


def test_impossible_settings_say_why(small):
    run = small.runs["interleaved_1f1b,4,1,2"]
    assert set(run) == {"text"}
    assert run["text"].startswith("not possible: interleaved 1F1B needs the number of "
                                  "microbatches to be a multiple of the number of ranks")


def test_the_page_holds_the_runs(small):
    data = unpack(small.packed())
    assert data["runs"] == small.runs and data["ticks"] == TICKS
    assert len(data["colours"]) == 10 and all(len(row) == 3 for row in data["colours"])
    page = small.html()
    assert page.count('type="range"') == 3 and page.count("<select") == 1
    assert small.packed() == PipelineExplorer(ps=(2, 4), ms=(1, 4, 8), vs=(2, 4)).packed()


def test_the_default_grid_fits_a_page():
    ex = PipelineExplorer()
    assert len(ex.runs) == 3 * 5 * 16 + 3 * 5 * 16
    assert len(ex.packed()) < 150_000                        # bytes of base64 in the page
    assert ex.runs[ex.key(*ex.default)]["text"].startswith("one_f_one_b, p=4, m=8")


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and driver")
def test_explorer_in_a_browser(tmp_path):
    """A reader with no kernel moves the sliders: the text and the boxes drawn are
    the picked run's, the bubble shrinks as m grows, v only counts when interleaved."""
    from selenium.webdriver.support.ui import Select
    ex = PipelineExplorer(ps=(2, 4), ms=(4, 8, 16), vs=(2, 4))
    driver = headless_chromium(tmp_path / "profile", "--window-size=1400,900")
    try:
        pre = open_snippet(driver, tmp_path, ex.html(), ".ringlab-pipeline").find_element(
            "css selector", "pre")

        def shown(key):
            run = ex.runs[key]
            assert pre.text == run["text"]
            drawn = driver.execute_script(
                "return Array.from(document.querySelectorAll('rect.rpe-box'))"
                ".map(r => r.dataset.kind + r.dataset.mb)")
            assert drawn == ["FBW"[b[5]] + str(b[3]) for b in run.get("boxes", [])]

        def slide(name, index):      # a range input moved by the reader
            driver.execute_script(
                "const s = document.querySelector(`input[data-key=${arguments[0]}]`);"
                "s.value = arguments[1]; s.dispatchEvent(new Event('input'));", name, index)

        shown("one_f_one_b,4,8,1")
        assert "bubble 37.5% of compute" in pre.text                 # (4 - 1) / 8
        slide("m", 2)
        shown("one_f_one_b,4,16,1")
        assert "bubble 18.8% of compute" in pre.text                 # (4 - 1) / 16
        v = driver.find_element("css selector", "input[data-key=v]")
        assert not v.is_enabled()                      # v counts only when interleaved
        Select(driver.find_element("css selector", "select[data-key=schedule]")
               ).select_by_value("interleaved_1f1b")
        assert v.is_enabled()
        slide("v", 1)
        shown("interleaved_1f1b,4,16,4")
        assert "bubble 4.7% of compute" in pre.text                  # 3 / (4 * 16)
        slide("m", 0)
        slide("p", 0)
        shown("interleaved_1f1b,2,4,4")
        Select(driver.find_element("css selector", "select[data-key=schedule]")
               ).select_by_value("zb_h1")
        assert not v.is_enabled()
        shown("zb_h1,2,4,1")
        height = driver.execute_script(
            "return document.querySelector('.ringlab-pipeline').getBoundingClientRect().height")
        assert height < 757                                        # one screen, controls too
        assert not severe(driver), severe(driver)
    finally:
        driver.quit()
