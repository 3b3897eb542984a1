"""The Chinese edition's catalogs (book/_ext/editions.py, locales/zh_CN/): every page of
_toc.yml has one; a translated message keeps its English message's links, math, code
and URLs, so the two editions cannot disagree on a number, a name or a reference;
and the coverage check counts a paragraph changed since its translation as untranslated.
``make book`` runs that check against the current text (``editions.py html``)."""

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

from support.editions import editions

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = editions.LOCALES / editions.LANGUAGE / "LC_MESSAGES"

ROLE = re.compile(r"\{([a-z:]+)\}`([^`]*)`")        # {doc}`text <target>`, {numref}`label`
MATH = re.compile(r"\$[^$]+\$")
CODE = re.compile(r"``?[^`]+``?")
URL = re.compile(r"https?://[^\s)>\]]+")
# A fenced code block (in an exercise notebook's cell) is kept whole, character for
# character; taken out first, so that its ``` do not throw CODE's backtick pairing off.
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?^[ \t]*\1[ \t]*$", re.M | re.S)


def pages():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [ch["file"] for part in toc["parts"] for ch in part["chapters"]]


def translated(page):
    with open(MESSAGES / f"{page}.po", "rb") as f:
        return [m for m in read_po(f) if m.id and m.string]


def markup(text):
    """What a translation must keep: each role with its target (a {doc} link's text
    may change, not where it points), math, inline code, fenced code blocks and URLs."""
    fences = Counter(m.group(0) for m in FENCE.finditer(text))
    text = FENCE.sub("", text)
    roles = Counter((name, body.rsplit("<", 1)[-1].rstrip(">") if name != "numref" else body)
                    for name, body in ROLE.findall(text))
    rest = ROLE.sub("", text)
    return roles, Counter(MATH.findall(rest)), Counter(CODE.findall(MATH.sub("", rest))), \
        Counter(URL.findall(text)), fences


def test_every_page_has_a_catalog():
    missing = [p for p in pages() if not (MESSAGES / f"{p}.po").exists()]
    assert not missing, f"no catalog (run `make translations`): {missing}"
    extra = sorted(str(p.relative_to(MESSAGES).with_suffix("")) for p in MESSAGES.rglob("*.po")
                   if str(p.relative_to(MESSAGES).with_suffix("")) not in pages()
                   and p.relative_to(MESSAGES).parts[0] != "exercises")    # the notebooks'
    assert not extra, f"catalogs of pages that are not in _toc.yml: {extra}"
    assert editions.UNTRANSLATED <= set(pages())


EXERCISES = sorted(str(p.relative_to(MESSAGES).with_suffix(""))
                   for p in (MESSAGES / "exercises").rglob("*.po"))


@pytest.mark.parametrize("page", pages() + EXERCISES)
def test_translations_keep_the_markup(page):
    """A chapter's, or an exercise notebook's (ringlab/authoring.py: one message a cell)."""
    for m in translated(page):
        assert markup(m.string) == markup(m.id), (page, m.id, m.string)


def test_markup_catches_a_changed_number_link_or_name():
    english = "The ring sends $2(N-1)$ messages ({doc}`ring_allreduce`); see `comm.send`."
    assert markup("环发送 $2(N-1)$ 条消息({doc}`ring_allreduce`);见 `comm.send`。") == markup(english)
    for wrong in ("环发送 $2N$ 条消息({doc}`ring_allreduce`);见 `comm.send`。",
                  "环发送 $2(N-1)$ 条消息({doc}`allgather`);见 `comm.send`。",
                  "环发送 $2(N-1)$ 条消息({doc}`ring_allreduce`);见 `comm.recv`。"):
        assert markup(wrong) != markup(english), wrong
    cell = "Write `f`:\n\n```python\ndef f(comm):   # runs on every rank\n```\n\nthen `comm.send`."
    assert markup("编写 `f`：\n\n```python\ndef f(comm):   # runs on every rank\n```\n\n然后 `comm.send`。") \
        == markup(cell)
    assert markup("编写 `f`：\n\n```python\ndef f(comm):   # 每个 rank 上运行\n```\n\n然后 `comm.send`。") \
        != markup(cell)


def test_markup_takes_a_fenced_block_whole():
    """An exercise cell's fenced code is one piece of markup, so the prose after it may
    change and the inline code after it still counts (not the text between backticks)."""
    english = "Write:\n\n```python\ndef f(comm):\n    ...\n```\n\nThen call `f(comm)` once."
    assert markup("写出：\n\n```python\ndef f(comm):\n    ...\n```\n\n然后调用一次 `f(comm)`。") \
        == markup(english)
    for wrong in ("写出：\n\n```python\ndef g(comm):\n    ...\n```\n\n然后调用一次 `f(comm)`。",
                  "写出：\n\n```python\ndef f(comm):\n    ...\n```\n\n然后调用一次 `f(comm, x)`。"):
        assert markup(wrong) != markup(english), wrong


def test_coverage_counts_changed_or_fuzzy_text_as_untranslated(tmp_path, monkeypatch):
    pot = tmp_path / "gettext" / "book"
    pot.mkdir(parents=True)
    now = Catalog()
    for text in ("One ring.", "Two rings, changed.", "Three rings.", "Four rings."):
        now.add(text)
    with open(pot / "x.pot", "wb") as f:
        write_po(f, now)
    po = tmp_path / "locales" / editions.LANGUAGE / "LC_MESSAGES" / "book"
    po.mkdir(parents=True)
    old = Catalog(locale="zh_CN")
    old.add("One ring.", "一个环。")
    old.add("Two rings.", "两个环。")                      # the English has changed since
    old.add("Three rings.", "三个环。", flags=["fuzzy"])
    old.add("Four rings.", "")                            # not translated
    with open(po / "x.po", "wb") as f:
        write_po(f, old)
    monkeypatch.setattr(editions, "LOCALES", tmp_path / "locales")
    assert editions.coverage(tmp_path / "gettext") == {"book/x": (4, 1, 1)}
    assert editions.check({"book/x": (4, 1, 1)}, untranslated=set()) == [
        "book/x: 1 fuzzy translation(s): the English changed; update them and drop the "
        "fuzzy flag",
        "book/x: 1 of 4 messages translated (25%), below 95%: translate the rest"]
    assert editions.check({"book/x": (20, 19, 0)}, untranslated={"book/x"}) == [
        "book/x: 95% translated: remove it from UNTRANSLATED"]
    assert editions.check({"book/x": (20, 19, 0)}, untranslated=set()) == []


def test_a_translated_node_is_pickled_with_its_page_only():
    """Sphinx parses each translated message as a document of its own, whose settings
    hold the whole environment; a node linked to it carried all of it into its page's
    pickled doctree (editions._page_document unlinks it)."""
    import copy
    import pickle
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    settings = get_default_settings(Parser)
    page, message = new_document("page", settings), new_document("message", settings)
    message.settings = copy.copy(settings)
    message.settings.env = list(range(100_000))     # a stand-in for the environment
    para = nodes.paragraph()
    page += para
    para += nodes.Text("translated")
    text = nodes.literal("", "code")
    para += text
    text.document = message                     # what the translation leaves behind
    before = len(pickle.dumps(page))
    editions._page_document(None, page)
    assert text.document is page and para.document is page
    assert len(pickle.dumps(page)) < before / 10
    assert "code" in page.astext()
