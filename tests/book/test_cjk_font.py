"""The book's Chinese is drawn by a real CJK font (issue 27): Noto Sans CJK SC, Debian's
fonts-noto-cjk, which the Makefile installs.

- in the built book, by the web font book/_ext/cjk_font.py subsets to the characters
  the pages use: a browser asks Chrome which fonts drew each CJK character of three
  pages (run by `make shape`; skipped without a built book, RINGLAB_BOOK_HTML);
- in figures, by matplotlib (ringlab/show/style.py, loaded in every kernel): no box,
  no "Glyph ... missing from font(s)" warning.
"""

import functools
import io
import os
import sys
import time
import warnings
from pathlib import Path

import pytest

from ringlab.show import packed, style
from support import book_ext
from support.chromium import CHROMIUM, DRIVER

ROOT = Path(__file__).resolve().parents[2]
BOOK_HTML = os.environ.get("RINGLAB_BOOK_HTML")
needs_font = pytest.mark.skipif(not os.path.exists(style.CJK_FONT),
                                reason=f"no {style.CJK_FONT} (apt-get install fonts-noto-cjk)")


@functools.cache
def _extension():
    return book_ext.load("cjk_font")


def test_the_makefile_installs_the_font_the_book_uses():
    assert f"CJK_FONT := {style.CJK_FONT}\n" in (ROOT / "Makefile").read_text()


def test_cjk_characters_of_pages_and_their_data(tmp_path):
    """Page text, entities, JSON escapes in scripts and packed explorer data count; the
    Chinese edition's own folder (it has its own _static) and Latin text do not."""
    cjk = _extension()
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "copy.js").write_text("const t = {'zh-CN': '复制'};", "utf-8")
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "a.html").write_text(
        "<h2>Interview questions / 面试题</h2><p>&#20840;规约，all-reduce</p>"
        '<script>mount({"title":"\\u6d41\\u6c34"});</script>'
        f"<script>var b = atob('{packed.pack({'label': '气泡'})}');</script>", "utf-8")
    (tmp_path / "zh" / "_static").mkdir(parents=True)
    (tmp_path / "zh" / "index.html").write_text("<p>中文版</p>", "utf-8")
    assert cjk.cjk_characters(tmp_path) == set("复制面试题全规约，流水气泡")


@needs_font
def test_subset_holds_exactly_the_characters_used(tmp_path):
    from fontTools.ttLib import TTFont
    cjk = _extension()
    (tmp_path / "book").mkdir(parents=True)
    (tmp_path / "book" / "glossary.html").write_text(
        "<dt>all-reduce / 全规约</dt><dd>规约散射（reduce-scatter）后全收集</dd>", "utf-8")
    chars, size = cjk.write(tmp_path, style.CJK_FONT)
    font = TTFont(io.BytesIO((tmp_path / "_static" / cjk.FONT_FILE).read_bytes()))
    assert font.flavor == "woff2" and size < 20_000
    assert set(map(chr, font.getBestCmap())) == chars == set("全规约散射（）后收集")
    assert font["name"].getDebugName(1) == style.CJK_FAMILY
    css = (tmp_path / "_static" / cjk.CSS_FILE).read_text()
    assert f'src: url("{cjk.FONT_FILE}") format("woff2")' in css
    assert "unicode-range: U+2E80-2FFF, " in css and "U+4E00-9FFF" in css   # not Latin


@pytest.mark.parametrize("font", ["installed", "missing"])
def test_a_build_links_and_writes_the_font_only_when_it_exists(tmp_path, monkeypatch, font):
    """A Sphinx build: the font's CSS linked from the page and the subset written at the
    end; without the font file, nothing linked or written. No warning either way (the
    book builds with -W)."""
    from sphinx.testing.util import SphinxTestApp
    if font == "missing":
        monkeypatch.setattr(style, "CJK_FONT", str(tmp_path / "no-such-font.ttc"))
    elif not os.path.exists(style.CJK_FONT):
        pytest.skip(f"no {style.CJK_FONT}")
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(f"import sys; sys.path.insert(0, {str(ROOT / 'book/_ext')!r})\n"
                                 "extensions = ['cjk_font']\n", "utf-8")
    (src / "index.rst").write_text("Glossary\n========\n\nall-reduce: 全规约\n", "utf-8")
    monkeypatch.delitem(sys.modules, "cjk_font", raising=False)
    app = SphinxTestApp("html", srcdir=src, builddir=tmp_path / "build",
                        status=io.StringIO(), warning=io.StringIO())
    try:
        app.build()
    finally:
        app.cleanup()
    warnings = [w for w in app.warning.getvalue().splitlines()   # an earlier app's nodes
                if "is already registered" not in w]
    assert warnings == []
    out = tmp_path / "build" / "html"
    static = out / "_static"
    linked = "_static/ringlab-cjk.css" in (out / "index.html").read_text("utf-8")
    if font == "missing":
        assert not linked and not list(static.glob("ringlab-cjk.*"))
    else:
        assert linked and (static / "ringlab-cjk.css").exists()
        from fontTools.ttLib import TTFont
        assert set(map(chr, TTFont(static / "ringlab-cjk.woff2").getBestCmap())) == set("全规约")


@needs_font
def test_bold_text_finds_a_bold_face_and_logs_nothing(caplog):
    """A bold label looks for a bold face in every family of the list: without the
    collection's bold faces matplotlib logs "findfont: Failed to find font weight bold
    for Noto Sans CJK SC", and a chapter's cell shows it under its figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with matplotlib.rc_context(style.RC):
        style.use_cjk_font()
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.set_title("bold title", fontweight="bold")
        ax.set_xlabel("粗体 label", fontweight="bold")
        with caplog.at_level("INFO", logger="matplotlib.font_manager"):
            style.png(fig)
        plt.close(fig)
    assert [r.getMessage() for r in caplog.records if "findfont" in r.getMessage()] == []


@needs_font
def test_a_figure_draws_chinese_without_missing_glyphs():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with matplotlib.rc_context():
        assert style.use_cjk_font() == style.CJK_FAMILY
        assert matplotlib.rcParams["font.family"][-1] == style.CJK_FAMILY
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.set_title("全规约 all-reduce")
        ax.set_xlabel("规约散射，全收集")
        with warnings.catch_warnings():
            warnings.simplefilter("error")             # "Glyph ... missing from font(s)"
            style.png(fig)
        plt.close(fig)


# -- in the built book -------------------------------------------------------------------

# The glossary (its terms are bilingual) and two chapters with players: from the Chinese
# edition when it was built (book/_ext/editions.py), else their English pages ("Interview
# questions / 面试题"). Three pages: each takes about a second to load.
GLOSSARY, CHAPTERS = "book/glossary", ["book/collectives/ring_allreduce", "book/data_parallel/sync_sgd"]
THEME_RESET = "Got invalid theme mode: . Resetting to auto."     # the theme's, on file:// pages

# Marks the parent of every shown text node that brings a CJK character not yet seen in
# its font context (family list, weight, style, language): the same character in the same
# context is drawn by the same font, so one DevTools call each is enough (a Chinese
# chapter has thousands of characters, a few hundred distinct ones). Not laid out
# (folded, hidden): not drawn, not marked.
MARK = """
const cjk = new RegExp(arguments[0], "gu"), seen = new Map(), range = document.createRange();
const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let t = walk.nextNode(); t; t = walk.nextNode()) {
  const chars = t.nodeValue.match(cjk);
  range.selectNodeContents(t);
  if (!chars || !range.getClientRects().length) continue;
  const el = t.parentElement, s = getComputedStyle(el);
  const key = [s.fontFamily, s.fontWeight, s.fontStyle, el.closest("[lang]")?.lang].join("|");
  const known = seen.get(key) || new Set();
  seen.set(key, known);
  if (chars.some(c => !known.has(c))) el.setAttribute("data-cjk-check", "");
  chars.forEach(c => known.add(c));
}"""


def marked_text_nodes(node, marked=False):
    """(nodeId, CJK characters, text) of the CJK text nodes whose parent MARK marked, in
    the DevTools DOM tree ``node`` (DOM.getDocument)."""
    cjk = _extension().CJK
    if node.get("nodeType") == 3 and marked and (chars := cjk.findall(node["nodeValue"])):
        yield node["nodeId"], chars, node["nodeValue"].strip()
    here = "data-cjk-check" in node.get("attributes", [])[::2]
    for child in node.get("children", []):
        yield from marked_text_nodes(child, here)


def fonts_of_cjk_text(driver, page):
    """For each text node of ``page`` that MARK picked: (its text, its CJK characters,
    glyphs the book's web font drew, every font that drew part of it)."""
    driver.get_log("browser")                  # what earlier pages left in the log
    driver.get(page.as_uri())
    driver.set_script_timeout(20)
    assert driver.execute_async_script(            # the web font loaded (or failed)
        "const done = arguments[arguments.length - 1];"
        "document.fonts.ready.then(() => done(document.readyState));") == "complete"
    driver.execute_script(MARK, _extension().CJK.pattern)
    driver.execute_cdp_cmd("DOM.enable", {})
    driver.execute_cdp_cmd("CSS.enable", {})
    root = driver.execute_cdp_cmd("DOM.getDocument", {"depth": -1})["root"]
    marked = driver.execute_cdp_cmd("DOM.querySelectorAll",
                                    {"nodeId": root["nodeId"], "selector": "[data-cjk-check]"})
    found = []
    for node_id, chars, text in marked_text_nodes(root):
        fonts = driver.execute_cdp_cmd("CSS.getPlatformFontsForNode", {"nodeId": node_id})["fonts"]
        ours = sum(f["glyphCount"] for f in fonts
                   if f["isCustomFont"] and f["familyName"] == style.CJK_FAMILY)
        found.append((text[:40], chars, ours, [(f["familyName"], f["isCustomFont"],
                                                 f["glyphCount"]) for f in fonts]))
    assert len(found) >= len(marked["nodeIds"]), page     # each marked element was looked at
    return found


@pytest.mark.skipif(not BOOK_HTML,
                    reason="set RINGLAB_BOOK_HTML to a built book (make test does, after make book)")
@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
@needs_font                               # the build had no font to subset either
def test_built_book_draws_chinese_in_its_font(book_window):
    """Every CJK character shown on three pages is drawn by the subset web font (Chrome
    says which font drew each text: CSS.getPlatformFontsForNode), none by a machine
    font or as a missing glyph."""
    html = Path(BOOK_HTML)
    edition = html / "zh" if (html / "zh" / "index.html").exists() else html
    pages = [edition / f"{md}.html" for md in (GLOSSARY, *CHAPTERS)]
    start, wrong, shown = time.monotonic(), [], {}
    for page in pages:
        found = fonts_of_cjk_text(book_window, page)
        shown[page.relative_to(html).as_posix()] = len({c for f in found for c in f[1]})
        wrong += [f"{page.relative_to(html)}: {text!r}: {ours} of {len(chars)} CJK characters "
                  f"in {style.CJK_FAMILY}: {fonts}"
                  for text, chars, ours, fonts in found if ours != len(chars)]
        if page.stem != "glossary":
            wrong += players_that_do_not_work(book_window, page.relative_to(html))
    print(f"\ndistinct CJK characters shown, checked in {time.monotonic() - start:.1f} s: {shown}")
    assert not wrong, "CJK text not drawn by the book's web font, or a player broken:\n" + "\n".join(wrong[:20])
    assert all(n >= 3 for n in shown.values()), f"pages with (almost) no Chinese shown: {shown}"


def players_that_do_not_work(driver, name):
    """What is wrong with the players of the page ``driver`` shows (``name``): each one
    mounted (``data-ready``), the first one steps forward, and nothing on the page
    logged an error."""
    ready, total = driver.execute_script(
        "return [document.querySelectorAll('.ringlab-player[data-ready]').length,"
        " document.querySelectorAll('.ringlab-player').length]")
    if not total or ready != total:
        return [f"{name}: {ready} of {total} players mounted"]
    player = driver.find_element("css selector", ".ringlab-player[data-ready]")
    before = player.find_element("css selector", ".rlp-stepno").text
    driver.execute_script("arguments[0].click()",
                          player.find_element("css selector", "button.rlp-forward"))
    after = player.find_element("css selector", ".rlp-stepno").text
    errors = [e["message"] for e in driver.get_log("browser")
              if e["level"] == "SEVERE" and THEME_RESET not in e["message"]]
    return ([f"{name}: the player's step stays {before!r} after a step forward"] * (before == after)
            + [f"{name}: JavaScript error {m}" for m in errors])
