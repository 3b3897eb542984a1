"""The trace player in a real browser: Debian's headless Chromium driven by selenium.

Checks what a reader sees: the right number of ranks, the arrows of each step
are exactly the trace's events of that step, the buttons and the slider move
the step, several players on one page stay independent, the player also runs
inside a page built by jupyter-book, and no JavaScript error is logged.
Expected holdings are derived by hand from the ring algorithm (see comments).
"""

import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import ringlab
from ringlab.collectives import binomial_broadcast, ring_allreduce
from support.chromium import CHROMIUM, DRIVER, headless_chromium
from support.worlds import computes_and_groups

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="needs Debian's chromium and chromium-driver (as root: apt-get install -y chromium "
           "chromium-driver; `make unit` does it)")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = headless_chromium(tmp_path_factory.mktemp("chromium-profile"),
                               "--disable-background-networking", "--disable-component-update",
                               "--window-size=900,1100")
    yield driver
    driver.quit()


# The book theme's own notice when it finds no colour mode stored yet; it then uses
# "auto". It came on some page loads only (a fresh browser profile), and nothing breaks.
THEME_RESET = "Got invalid theme mode: . Resetting to auto."


def js_errors(driver):
    """SEVERE console entries: uncaught exceptions and console.error calls."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and THEME_RESET not in e["message"]]


def open_page(driver, path):
    driver.get(path.as_uri())
    driver.get_log("browser")                # (the first call may hold older pages' entries)
    driver.refresh()
    wait_for(lambda: driver.execute_script(
        "return document.querySelectorAll('.ringlab-player[data-ready]').length") > 0)


def wait_for(condition, timeout=5.0):
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the page")
        time.sleep(0.05)


def arrows(driver, player):
    """(step, src, dst, chunk, op) of every arrow drawn in ``player`` now."""
    return sorted(driver.execute_script(
        "return Array.from(arguments[0].querySelectorAll('g.rlp-arrow')).map(a => ["
        "+a.dataset.step, +a.dataset.src, +a.dataset.dst, a.dataset.chunk, a.dataset.op])", player))


def expected(trace, step):
    return sorted([e.step, e.src, e.dst, str(e.chunk), e.op] for e in trace.at_step(step))


def cell_counts(driver, player):
    """Per rank, the number written in each chunk cell, in chunk order."""
    return driver.execute_script(
        "return Array.from(arguments[0].querySelectorAll('g.rlp-rank')).map(g => "
        "Array.from(g.querySelectorAll('text.rlp-count')).map(t => +t.textContent))", player)


def step_text(player):
    return player.find_element("css selector", ".rlp-stepno").text


def ring4():
    return ringlab.run(ring_allreduce, [np.arange(8.0) * (r + 1) for r in range(4)]).trace


def test_standalone_page(browser, tmp_path):
    from selenium.webdriver.common.keys import Keys
    trace = ring4()
    open_page(browser, trace.save_html(tmp_path / "ring.html"))
    player = browser.find_element("css selector", ".ringlab-player")
    assert len(player.find_elements("css selector", "g.rlp-rank")) == 4
    assert step_text(player) == "step 0 / 6"
    assert arrows(browser, player) == []
    assert cell_counts(browser, player) == [[1] * 4] * 4       # only its own contribution

    forward = player.find_element("css selector", "button.rlp-forward")
    for s in range(1, 7):
        forward.click()
        assert step_text(player) == f"step {s} / 6"
        assert arrows(browser, player) == expected(trace, s)
        if s == 3:
            # After reduce-scatter (N - 1 = 3 steps) rank r holds chunk (r + 1) % 4
            # complete (4 contributions) and, being 1..3 steps down the ring from the
            # other chunks' starts, chunks r+2, r+3, r with 3, 2, 1 contributions.
            want = [[0] * 4 for _ in range(4)]
            for r in range(4):
                for k, count in enumerate((4, 3, 2, 1)):
                    want[r][(r + 1 + k) % 4] = count
            assert cell_counts(browser, player) == want
    assert cell_counts(browser, player) == [[4] * 4] * 4       # everyone has everything
    forward.click()                                            # past the end: stays at 6
    assert step_text(player) == "step 6 / 6"

    player.find_element("css selector", "button.rlp-back").click()
    assert arrows(browser, player) == expected(trace, 5)
    slider = player.find_element("css selector", "input.rlp-slider")
    slider.send_keys(Keys.HOME)                                # keyboard moves a range input
    assert step_text(player) == "step 0 / 6"
    slider.send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
    assert step_text(player) == "step 2 / 6"
    assert arrows(browser, player) == expected(trace, 2)

    (ROOT / "_build").mkdir(exist_ok=True)
    browser.save_screenshot(str(ROOT / "_build" / "player-screenshot.png"))

    # Play at 4x (250 ms a step) runs on to the last step, then stops by itself.
    player.find_element("css selector", "select.rlp-speed option[value='4']").click()
    play = player.find_element("css selector", "button.rlp-play")
    play.click()
    wait_for(lambda: step_text(player) == "step 6 / 6", timeout=5)
    wait_for(lambda: "play" in play.text)
    assert arrows(browser, player) == expected(trace, 6)
    assert js_errors(browser) == []


def test_notebook_snippets_on_one_page(browser, tmp_path):
    """Two notebook outputs on one page: one inline as myst-nb writes it into the
    book, one inserted the way JupyterLab does (innerHTML, then its scripts re-run)."""
    ring = ring4()
    tree = ringlab.run(binomial_broadcast, [np.ones(4)] + [None] * 7, args=(0,)).trace
    inserted = tree.show()._repr_html_()
    page = textwrap.dedent(f"""\
        <!DOCTYPE html><html><head><meta charset="utf-8"></head><body>
        <div class="output">{ring.show()._repr_html_()}</div>
        <div class="output" id="later"></div>
        <template id="snippet">{inserted}</template>
        <script>
          const out = document.getElementById("later");
          out.innerHTML = document.getElementById("snippet").innerHTML;
          for (const old of out.querySelectorAll("script")) {{   // what JupyterLab does
            const s = document.createElement("script");
            s.textContent = old.textContent;
            old.replaceWith(s);
          }}
        </script></body></html>""")
    (tmp_path / "two.html").write_text(page, encoding="utf-8")
    open_page(browser, tmp_path / "two.html")
    wait_for(lambda: len(browser.find_elements("css selector", ".ringlab-player[data-ready]")) == 2)
    first, second = browser.find_elements("css selector", ".ringlab-player")
    ids = browser.execute_script("return Array.from(document.querySelectorAll('[id]')).map(e => e.id)")
    assert len(ids) == len(set(ids)), "element ids must be unique on the page"
    assert len(first.find_elements("css selector", "g.rlp-rank")) == 4
    assert len(second.find_elements("css selector", "g.rlp-rank")) == 8
    # binomial broadcast, 8 ranks: 0->1; 0->2, 1->3; 0->4, 1->5, 2->6, 3->7 (a tree).
    assert second.get_attribute("data-layout") == "tree"
    # copy-only trace: each cell shows whose data it holds: at the start its own,
    # at the end rank 0's everywhere.
    assert cell_counts(browser, second) == [[r] for r in range(8)]
    second.find_element("css selector", "button.rlp-last").click()
    assert arrows(browser, second) == expected(tree, 3)
    assert cell_counts(browser, second) == [[0]] * 8
    assert step_text(first) == "step 0 / 6"                   # the other player did not move
    first.find_element("css selector", "button.rlp-forward").click()
    assert arrows(browser, first) == expected(ring, 1)
    assert arrows(browser, second) == expected(tree, 3)
    assert js_errors(browser) == []


def test_computes_and_groups(browser, tmp_path):
    """Compute badges under the ranks at the step after which they run, and the group
    of each message in the list. Program: every rank computes "forward" (1 ms), then
    pairs (0, 1) and (2, 3) all-reduce in groups dp[0], dp[1] (steps 1, 2), then
    "optimizer" (2 ms) after the last step."""
    trace = ringlab.run(computes_and_groups, [np.ones(4)] * 4).trace
    open_page(browser, trace.save_html(tmp_path / "groups.html"))
    player = browser.find_element("css selector", ".ringlab-player")

    def badges():
        return [t.text for t in player.find_elements("css selector", "text.rlp-compute")]

    def listed():
        return [li.text for li in player.find_elements("css selector", "ul.rlp-messages li")]
    assert badges() == ["⚙ forward 1 ms"] * 4
    assert "rank 2 computes forward 1 ms" in listed()
    player.find_element("css selector", "button.rlp-forward").click()
    assert badges() == [""] * 4
    assert sorted(listed()) == ["rank 0 → rank 1 [group dp[0]]: chunk 0, reduce, 16 B",
                                "rank 1 → rank 0 [group dp[0]]: chunk 1, reduce, 16 B",
                                "rank 2 → rank 3 [group dp[1]]: chunk 0, reduce, 16 B",
                                "rank 3 → rank 2 [group dp[1]]: chunk 1, reduce, 16 B"]
    player.find_element("css selector", "button.rlp-last").click()
    assert badges() == ["⚙ optimizer 2 ms"] * 4
    assert js_errors(browser) == []


def test_unlabelled_run_and_alltoall_labels(browser, tmp_path):
    """A ring AllReduce sent without chunk=/op=, shown with res.show(inputs): the arrows
    say which ranks' inputs each message summed, the cells count contributions as for
    the reference. And an all-to-all's (src, dst) labels appear whole."""
    from test_player import random_inputs, unlabelled_ring_allreduce
    from ringlab.collectives import ring_alltoall
    inputs = random_inputs(4, 8)
    res = ringlab.run(unlabelled_ring_allreduce, inputs, record_payloads=True)
    blocks = [[np.array([10.0 * r + c]) for c in range(4)] for r in range(4)]
    a2a = ringlab.run(ring_alltoall, blocks).trace
    page = tmp_path / "unlabelled.html"
    page.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                    + res.show(inputs).html() + a2a.show().html() + "</body></html>", encoding="utf-8")
    open_page(browser, page)
    wait_for(lambda: len(browser.find_elements("css selector", ".ringlab-player[data-ready]")) == 2)
    player, other = browser.find_elements("css selector", ".ringlab-player")

    def labels(p):
        return sorted(t.text for t in p.find_elements("css selector", "text.rlp-arrow-label"))
    player.find_element("css selector", "button.rlp-forward").click()
    player.find_element("css selector", "button.rlp-forward").click()
    # step 2: rank r passes on chunk r - 1, now rank (r - 1)'s and its own inputs added
    assert labels(player) == sorted(f"c{(r - 1) % 4}: {'+'.join(map(str, sorted({r, (r - 1) % 4})))}"
                                    for r in range(4))
    assert "carries the sum of ranks 0, 1 (2 of 4)" in player.find_element(
        "css selector", "ul.rlp-messages").text
    player.find_element("css selector", "button.rlp-last").click()
    assert cell_counts(browser, player) == [[4] * 4] * 4
    other.find_element("css selector", "button.rlp-forward").click()
    # ring all-to-all, step 1: rank 0 sends its blocks for ranks 1, 2 and 3
    # whole, not "((0, 1), …": one block a line, so that neighbouring labels do not overlap
    assert "(0, 1)(0, 2)(0, 3)" in labels(other)
    assert [t.text for t in other.find_elements("css selector", "text.rlp-arrow-label")[0].find_elements(
        "css selector", "tspan")] == ["(0, 1)", "(0, 2)", "(0, 3)"]
    assert js_errors(browser) == []


@pytest.mark.skipif(not os.environ.get("RINGLAB_BOOK_HTML"),
                    reason="set RINGLAB_BOOK_HTML to a built book (make test does, after make book)")
def test_player_runs_in_the_built_book(browser):
    """The real book, as `make book` built it (`make test` runs this after the
    build, with tests/book/test_book_shape.py): the Ring AllReduce chapter's player
    renders and steps, and no page of the book logs a JavaScript error."""
    html = Path(os.environ["RINGLAB_BOOK_HTML"]) / "book"
    page = html / "collectives" / "ring_allreduce.html"
    assert "RinglabPlayer.mount" in page.read_text(encoding="utf-8")
    open_page(browser, page)
    player = browser.find_element("css selector", ".ringlab-player[data-ready]")
    assert len(player.find_elements("css selector", "g.rlp-rank")) == 4
    player.find_element("css selector", "button.rlp-forward").click()
    assert len(arrows(browser, player)) == 4            # step 1: every rank sends one chunk
    browser.save_screenshot(str(html.parent.parent / "book-player-screenshot.png"))
    assert js_errors(browser) == []
    for other in sorted(html.rglob("*.html")):           # every chapter loads cleanly
        browser.get(other.as_uri())
        assert js_errors(browser) == [], other.name


@pytest.mark.parametrize("n", [2, 3, 8, 16, 32])
def test_players_fit_one_screen(browser, tmp_path, n):
    """A 1400 x 900 window shows 757 px of a book page: every player, its controls
    and its list of a step's messages fit there; two ranks stand side by side, and
    a step of 2n messages lists 15 and says how many more."""
    trace = ringlab.run(ring_allreduce, [np.arange(2.0 * n)] * n).trace
    open_page(browser, trace.save_html(tmp_path / f"ring{n}.html"))
    player = browser.find_element("css selector", ".ringlab-player[data-ready]")
    for _ in range(trace.steps):
        player.find_element("css selector", "button.rlp-forward").click()
        height = browser.execute_script(
            "return arguments[0].getBoundingClientRect().height", player)
        assert height <= 757, (n, height)
    player.find_element("css selector", "button.rlp-first").click()
    player.find_element("css selector", "button.rlp-forward").click()
    items = [li.text for li in player.find_elements("css selector", "ul.rlp-messages li")]
    assert items[:min(n, 15)] == [
        f"rank {r} → rank {(r + 1) % n}: chunk {r}, reduce, 16 B" for r in range(n)][:15]
    assert len(items) == min(n, 16) and (n <= 16 or items[-1] == f"… and {n - 15} more")
    if n == 2:
        boxes = player.find_elements("css selector", "g.rlp-rank")
        assert abs(boxes[0].rect["y"] - boxes[1].rect["y"]) < 1
        assert boxes[1].rect["x"] - boxes[0].rect["x"] > 200
    assert js_errors(browser) == []


# -- the views of a strategy (ringlab.show.player.strategy) ------------------------------------

def views_shown(driver, player):
    """The view buttons, the pressed one, and the panes on display."""
    return driver.execute_script(
        "const p = arguments[0]; return [Array.from(p.querySelectorAll('button.rlp-view')).map(b => b.dataset.view),"
        " p.dataset.view, Array.from(p.querySelectorAll('.rlp-pane')).filter(x => x.style.display !== 'none')"
        ".map(x => x.dataset.pane)]", player)


def lane_items(driver, player):
    """(rank, stream, text, lit) of every lane box drawn now."""
    return sorted(tuple(x) for x in driver.execute_script(
        "return Array.from(arguments[0].querySelectorAll('g.rlp-item')).filter(g => g.dataset.shown === '1')"
        ".map(g => [+g.dataset.rank, +g.dataset.stream, g.dataset.text, g.dataset.lit === '1'])", player))


def memory_now(driver, player, n):
    """Per rank, {label: bytes} of the bars of the step shown."""
    held = [dict() for _ in range(n)]
    for r, label, b in driver.execute_script(
            "return Array.from(arguments[0].querySelectorAll('rect.rlp-mem-now')).filter(r => +r.dataset.bytes)"
            ".map(r => [+r.dataset.rank, r.dataset.label, +r.dataset.bytes])", player):
        held[r][label] = b
    return held


def expected_lanes(data, step):
    """What lane_items should read at ``step``, from the data Python gave the page: a box
    after its step ``at`` (cut at the cursor when messages have times), lit up to ``until``."""
    lanes, out = data["lanes"], []
    for it in lanes["items"]:
        shown = it[4] <= step
        if shown and lanes["cursor"] and it[3] > it[2]:
            shown = lanes["cursor"][step] > it[2]
        if shown:
            rank, stream = lanes["rows"][it[0]][:2]
            out.append((rank, stream, lanes["texts"][it[7]], step > 0 and it[4] <= step <= it[5]))
    return sorted(out)


def strategy_run(name):
    from support import strategies
    if name == "tp":
        trace, outputs = strategies.tp_attention()
        return trace, {"parts": outputs}
    if name == "zero3_16":
        return strategies.zero3(16), {}
    if name == "ddp_32":
        return strategies.ddp(32), {}
    return getattr(strategies, name)(), {}


@pytest.mark.parametrize("name, default", [("zero3", "memory"), ("gpipe", "lanes"), ("ddp", "lanes"),
                                           ("tp", "lanes"), ("learner", "memory"), ("zero3_16", "memory"),
                                           ("ddp_32", "lanes"), ("learner_pipeline", "lanes")])
def test_strategy_views(browser, tmp_path, name, default):
    """The book's ZeRO-3, GPipe, DDP-bucket and tensor-parallel runs and a learner's FSDP
    loop and GPipe loop: the player opens on the view of its part; at every step, in every view, it draws
    what the trace says (memory: each rank's bytes per label = memory_frames; lanes: the
    boxes of the steps so far; messages: the step's arrows) and fits 757 px. Also 16 and
    32 ranks, for the height (every 20th of the steps, and the last)."""
    from ringlab.show.player import memory_frames
    trace, options = strategy_run(name)
    show = trace.show(**options)
    open_page(browser, show.save(tmp_path / f"{name}.html"))
    player = browser.find_element("css selector", ".ringlab-player[data-ready]")
    views = show.data["views"]
    assert views_shown(browser, player) == [views, default, [default]]
    frames = memory_frames(trace)
    n = trace.world_size
    from selenium.webdriver.common.keys import Keys
    slider = player.find_element("css selector", "input.rlp-slider")
    every = max(1, trace.steps // 20)           # 16 ranks, 90 steps: every 4th, and the last
    at = 0
    for step in sorted(set(range(0, trace.steps + 1, every)) | {trace.steps}):
        if step > at:
            slider.send_keys(*[Keys.ARROW_RIGHT] * (step - at))   # the keyboard moves the slider
            at = step
        for view in views:
            player.find_element("css selector", f"button.rlp-view[data-view='{view}']").click()
            assert views_shown(browser, player)[1:] == [view, [view]]
            assert step_text(player) == f"step {step} / {trace.steps}"      # switching keeps the step
            if view == "memory":
                assert memory_now(browser, player, n) == frames[step], step
            elif view == "lanes":
                assert lane_items(browser, player) == expected_lanes(show.data, step), step
            elif n <= 8:                                      # (a pipeline's messages have no op)
                assert arrows(browser, player) == sorted(
                    [e.step, e.src, e.dst, str(e.chunk), e.op or ""] for e in trace.at_step(step))
            height = browser.execute_script("return arguments[0].getBoundingClientRect().height", player)
            assert height <= 757, (name, view, step, height)
    assert js_errors(browser) == []


def test_strategy_views_closed_numbers(browser, tmp_path):
    """What a reader reads, derived by hand (see tests/show/test_player_views.py)."""
    from support import strategies
    page = tmp_path / "parts.html"
    trace, outputs = strategies.tp_attention()
    page.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                    + strategies.zero3().show().html() + strategies.gpipe().show().html()
                    + strategies.ddp().show().html() + trace.show(parts=outputs).html()
                    + "</body></html>", encoding="utf-8")
    open_page(browser, page)
    wait_for(lambda: len(browser.find_elements("css selector", ".ringlab-player[data-ready]")) == 4)
    zero3, gpipe, ddp, tp = browser.find_elements("css selector", ".ringlab-player")

    def go(player, step):
        player.find_element("css selector", "button.rlp-first").click()
        for _ in range(step):
            player.find_element("css selector", "button.rlp-forward").click()

    def totals(player):
        return [t.text for t in player.find_elements("css selector", "text.rlp-mem-total")]
    # ZeRO-3: unit 0 gathered (320 B); at step 9 unit 0 again, unit "2" and its gradient.
    assert totals(zero3) == ["320 B"] * 4
    go(zero3, 9)
    assert memory_now(browser, zero3, 4)[0] == {"params.full": 480, "grads.full": 160}
    assert totals(zero3) == ["640 B"] * 4
    go(zero3, 18)
    assert totals(zero3) == ["0 B"] * 4
    # GPipe: after step 3 rank 3 runs microbatch 0's forward, lit; rank 0 has done F0-F3.
    go(gpipe, 3)
    items = lane_items(browser, gpipe)
    assert [i for i in items if i[0] == 3] == [(3, 0, "0", True)]
    assert [i[2] for i in items if i[0] == 0] == ["0", "1", "2", "3"]
    # DDP: at the last step, every bucket's AllReduce on stream 1, b0 b1 b2, on every rank.
    ddp.find_element("css selector", "button.rlp-last").click()
    assert sorted(i[2] for i in lane_items(browser, ddp) if i[1] == 1) == ["b0"] * 4 + ["b1"] * 4 + ["b2"] * 4
    # TP: step 1 lights forward's region and its AllReduce, step 3 backward's; what each rank holds.
    go(tp, 1)
    assert [i[2] for i in lane_items(browser, tp) if i[3]] == ["AR", "tp.attention.forward"] * 2
    go(tp, 3)
    assert [i[2] for i in lane_items(browser, tp) if i[3]] == ["AR", "tp.attention.backward"] * 2
    assert [t.text for t in tp.find_elements("css selector", "text.rlp-lane-part")] == [
        "holds heads 0–1; qkv columns 0–3, 8–11, 16–19", "holds heads 2–3; qkv columns 4–7, 12–15, 20–23"]
    assert js_errors(browser) == []
