"""Every page of a built book (RINGLAB_BOOK_HTML), opened once in a 1400 x 900 window.

Two tests look at every page of the book `make book` built: the chapter heights,
panels and figure scales (tests/book/test_book_shape.py) and the JavaScript console
(tests/show/test_browser.py::test_player_runs_in_the_built_book). Opening each page
once for both (``visit_every_page``, through the session fixture ``built_book_pages``
of tests/conftest.py) halves the page loads of `make shape`; each page's console is
read after it has loaded and MathJax has typeset it, so an error logged then is seen.
"""

import math
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import PIL.Image

from ringlab.show import style
from support.chromium import headless_chromium

WINDOW = (1400, 900)
PANELS = ".ringlab-player, .ringlab-pipeline, .ringlab-analysis, .ringlab-quiz"


def book_window(profile):
    """Debian's chromium with a 1400 x 900 viewport, no scroll bars, console kept."""
    driver = headless_chromium(profile, "--disable-background-networking", "--disable-component-update",
                               "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}")
    driver.set_window_size(*WINDOW)
    # --window-size sets the outer window; make the viewport itself 1400 x 900
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    driver.set_window_size(2 * WINDOW[0] - inner[0], 2 * WINDOW[1] - inner[1])
    return driver


def rendered_height(driver, page):
    driver.get(page.as_uri())
    end = time.monotonic() + 20
    while driver.execute_script("return document.readyState") != "complete":
        if time.monotonic() > end:
            raise AssertionError(f"{page} did not load")
        time.sleep(0.1)
    # MathJax typesets after the load and changes the heights: wait for it
    driver.set_script_timeout(20)
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const p = window.MathJax && MathJax.startup && MathJax.startup.promise;"
        "(p || Promise.resolve()).then(() => done(true), () => done(false));")
    time.sleep(0.3)
    return driver.execute_script("return document.documentElement.scrollHeight")


def figure_scales(driver):
    """(file, shown width / drawn width) of every figure in the page's cell outputs."""
    return [(src.rsplit("/", 1)[-1], round(scale, 2)) for src, scale in driver.execute_script(
        "return Array.from(document.querySelectorAll('.cell_output img')).filter("
        "i => i.naturalWidth > 0).map(i => [i.src, i.clientWidth / i.naturalWidth])")]


def text_px(png, shown_width):
    """CSS px of the smallest text of the figure in the file ``png`` shown
    ``shown_width`` px wide: the points the kernel wrote into it (ringlab.show.style)
    at the file's dpi, times its shown scale. None: the file carries no size (the
    book's kernel did not draw it); inf: the figure has no text."""
    with PIL.Image.open(png) as im:
        pt, dpi = im.text.get(style.KEY), im.info.get("dpi", (72, 72))[0]
        if pt is None:
            return None
        return float(pt) * dpi / 72 * shown_width / im.width if pt else math.inf


def smallest_texts(driver):
    """(file, CSS px of its smallest text on the page, or None: see text_px) of
    every figure in the page's cell outputs."""
    return [(src.rsplit("/", 1)[-1],
             text_px(Path(urllib.parse.urlparse(urllib.parse.unquote(src)).path), shown))
            for src, shown in driver.execute_script(
                "return Array.from(document.querySelectorAll('.cell_output img')).filter("
                "i => i.naturalWidth > 0).map(i => [i.src, i.clientWidth])")]


def body_px(driver):
    """The CSS font size of the page's body text (its first paragraph), e.g. '16px'."""
    return driver.execute_script(
        "return getComputedStyle(document.querySelector('article p')).fontSize")


def panel_heights(driver):
    """(class, height in px) of every player, explorer and quiz on the page."""
    return [tuple(p) for p in driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => "
        "[e.className, Math.round(e.getBoundingClientRect().height)])", PANELS)]


@dataclass
class Visit:
    height: int          # px, folded content closed
    panels: list         # panel_heights
    scales: list         # figure_scales
    texts: list          # smallest_texts
    body: str            # body_px
    console: list        # the page's SEVERE console messages


def visit_every_page(driver, html):
    """{page: Visit} for every .html file under ``html``/book, in sorted order."""
    visits = {}
    for page in sorted((Path(html) / "book").rglob("*.html")):
        driver.get_log("browser")              # what earlier pages left in the log
        height = rendered_height(driver, page)
        visits[page] = Visit(height, panel_heights(driver), figure_scales(driver),
                             smallest_texts(driver), body_px(driver),
                             [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"])
    return visits
