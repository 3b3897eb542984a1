"""ringlab.cost.nccl_quiz: the predict-then-reveal quiz over NCCL's model, live
(ipywidgets) and static (HTML + JavaScript, checked in a headless Chromium)."""

import json
import re

import pytest

from ringlab.cost import nccl
from ringlab.cost.nccl_quiz import quiz, reveal, size_label, static_quiz
from support.chromium import CHROMIUM, DRIVER, headless_chromium, severe


def test_size_labels():
    assert [size_label(n) for n in (8, 1000, 1024, 3 << 20, 1 << 30)] == \
        ["8 B", "1000 B", "1 KiB", "3 MiB", "1 GiB"]


@pytest.mark.parametrize("nbytes,nodes", [(8, 1), (8 << 10, 4), (64 << 20, 2), (1 << 30, 16)])
def test_reveal_is_the_models_choice(nbytes, nodes):
    best = nccl.choose(nbytes, nodes, 8)
    r = reveal(nbytes, nodes, 8, guess=best[:2])
    assert (r.algorithm, r.protocol, r.time_us) == best[:3] and r.right
    assert min(r.times.values()) == r.time_us and len(r.times) == 6
    other = next(p for p in r.times if p != best[:2])
    assert reveal(nbytes, nodes, 8, guess=other).right is False
    assert reveal(nbytes, nodes, 8).right is None


def test_live_panel_hides_and_reveals():
    panel = quiz()
    size, nodes = panel.children[0].children
    algorithm, protocol, button, out = panel.children[1:]
    size.value, nodes.value = 8 << 10, 4
    algorithm.value, protocol.value = "tree", "LL"
    panel.reveal(None)
    assert "picks tree/LL" in out.value and "Your guess is right" in out.value
    size.value = 1 << 30                                   # a new question: answer hidden
    assert "picks" not in out.value
    panel.reveal(None)
    assert "picks ring/Simple" in out.value and "x the best" in out.value


def test_static_quiz_holds_the_models_choices():
    sizes, nodes = [64, 1 << 20, 1 << 30], [1, 4, 64]
    page = static_quiz(sizes, nodes).html()
    payload = json.loads(re.search(r"\), (\{.*\})\);</script>", page).group(1))
    for i, s in enumerate(sizes):
        for j, m in enumerate(nodes):
            cell = payload["cells"][i][j]
            best = nccl.choose(s, m, 8)
            assert cell[0][0] == f"{best.algorithm}/{best.protocol}"
            assert cell[0][1] == pytest.approx(best.time_us, abs=1e-3)
            assert [t for _, t in cell[1:]] == sorted(t for _, t in cell[1:])
    assert "<script" not in page.split("<script>", 1)[1]     # one script, nothing fetched
    assert "http" not in page


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs chromium and chromedriver")
def test_static_quiz_in_a_browser(tmp_path):
    from selenium.webdriver.support.ui import Select
    driver = headless_chromium(tmp_path / "profile")
    try:
        path = static_quiz([8 << 10, 1 << 30], [4, 16]).save_html(tmp_path / "quiz.html")
        driver.get(path.as_uri() if hasattr(path, "as_uri") else f"file://{path}")
        root = driver.find_element("css selector", ".ringlab-quiz")
        answer = root.find_element("css selector", ".answer")
        Select(root.find_element("css selector", "select.size")).select_by_index(0)
        Select(root.find_element("css selector", "select.nodes")).select_by_index(0)
        root.find_element("css selector", "input[value='ring']").click()
        root.find_element("css selector", "button").click()
        assert "picks tree/LL" in answer.text and "x the best" in answer.text
        Select(root.find_element("css selector", "select.size")).select_by_index(1)
        assert "picks" not in answer.text                     # a new question
        root.find_element("css selector", "input[value='Simple']").click()
        root.find_element("css selector", "button").click()
        best = nccl.choose(1 << 30, 4, 8)
        assert f"picks {best.algorithm}/{best.protocol}" in answer.text
        assert "Your guess is right" in answer.text
        assert not severe(driver)
    finally:
        driver.quit()
