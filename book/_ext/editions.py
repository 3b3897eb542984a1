"""The Chinese edition (中文版), built from the same sources as the English one.

Sphinx's own internationalisation: every paragraph, heading, list item and table
cell of a page is a message in a gettext catalog,
``locales/zh_CN/LC_MESSAGES/book/<part>/<chapter>.po``; the Chinese build
(``language = "zh_CN"``) puts each translated message in its place and keeps the
rest in English. Code, outputs and figures are not messages: they come from the
English build's own run of every chapter (myst-nb's execution cache,
``_build/.jupyter_cache``), so a change to a chapter's code or numbers reaches both
editions, and the Chinese build executes nothing.

    python book/_ext/editions.py update   # after a source change: refresh the catalogs
    python book/_ext/editions.py html     # the Chinese edition in _build/html/zh

``make book`` runs ``html`` after the English build, and ``html`` fails when a message
is fuzzy or a translated page's catalog covers less than 95% of its current English
text (``check``): a paragraph changed since its translation counts as untranslated, and
its page shows the new English until it is translated again.

As a Sphinx extension (``_config.yml``, ``local_extensions``) it puts a link to the
same page in the other edition in every page's header.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANGUAGE = "zh_CN"
LOCALES = ROOT / "locales"
BUILD = ROOT / "_build"
EDITION = BUILD / "html" / "zh"          # where the Chinese pages go, beside the English
POT = BUILD / "gettext"                  # the English messages, one .pot file per page


def _sphinx(builder, outdir, doctrees, freshenv=False, **config):
    """One Sphinx build of the book with ``config`` on top of ``_config.yml``
    (jupyter-book's own entry point, as ``jupyter-book build`` calls it); ``freshenv``:
    every page read again, also those whose source has not changed."""
    from jupyter_book.sphinx import build_sphinx
    config = dict(locale_dirs=[str(LOCALES)], gettext_compact=False,
                  latex_individualpages=False, **config)
    return build_sphinx(ROOT, outdir, noconfig=True, path_config=str(ROOT / "_config.yml"),
                        confoverrides=config, doctreedir=doctrees, builder=builder,
                        warningiserror=True, keep_going=True, freshenv=freshenv)


def _messages():
    """The English messages of every page, as .pot files in ``_build/gettext`` (nothing is
    executed: outputs are not messages). Returns the build's exit status."""
    return _sphinx("gettext", POT, BUILD / ".doctrees-gettext", nb_execution_mode="off")


def update():
    """Merge the current English messages into the catalogs, one .po file per page."""
    if _messages():
        return 1
    return subprocess.call([Path(sys.executable).with_name("sphinx-intl"), "update",
                            "-p", str(POT), "-l", LANGUAGE, "-d", str(LOCALES)])


def html():
    """The Chinese edition, from the English build's executed notebooks; then the
    catalogs are checked against the current English text (see ``coverage``)."""
    # Every page read again, as the English build does (``make book``'s --all): a chapter
    # whose source is unchanged may still show new outputs.
    failed = _sphinx("html", EDITION, BUILD / ".doctrees-zh", freshenv=True, language=LANGUAGE,
                     nb_execution_mode="cache",
                     nb_execution_cache_path=str(BUILD / ".jupyter_cache"),
                     # myst-nb's fold buttons ("Show code cell source") are not messages
                     nb_code_prompt_show="显示代码", nb_code_prompt_hide="隐藏代码")
    if failed or _messages():
        return 1
    problems = check(coverage(POT))
    print("\n".join(problems) or "the Chinese catalogs are current")
    return 1 if problems else 0


# Pages whose translation has not been written yet: their Chinese pages show the English
# text. A new page starts here (its catalog is empty) and leaves when its catalog covers
# 95% of its messages. Every page of the book is translated now.
UNTRANSLATED: set[str] = set()
MIN_TRANSLATED = 0.95


def coverage(pot_dir):
    """{page: (messages, translated, fuzzy)}: each page's current English messages (the
    .pot files of a gettext build) against its catalog. A message counts as translated
    only if the catalog has this very English text with a Chinese text that is not
    marked fuzzy: a paragraph changed since its translation counts as untranslated."""
    from babel.messages.pofile import read_po
    pages = {}
    for pot in sorted(Path(pot_dir).rglob("*.pot")):
        page = pot.relative_to(pot_dir).with_suffix("").as_posix()
        with open(pot, "rb") as f:
            wanted = [m.id for m in read_po(f) if m.id]
        po = LOCALES / LANGUAGE / "LC_MESSAGES" / f"{page}.po"
        done, fuzzy = set(), 0
        if po.exists():
            with open(po, "rb") as f:
                for m in read_po(f):
                    if m.id and m.string and m.fuzzy:
                        fuzzy += 1
                    elif m.id and m.string:
                        done.add(m.id)
        pages[page] = (len(wanted), sum(w in done for w in wanted), fuzzy)
    return pages


def check(pages, untranslated=UNTRANSLATED, least=MIN_TRANSLATED):
    """What is wrong with the catalogs, one line each (none: nothing).

    >>> check({"book/a": (10, 10, 0), "book/b": (10, 9, 0), "book/c": (4, 0, 0)},
    ...       untranslated={"book/c"})
    ['book/b: 9 of 10 messages translated (90%), below 95%: translate the rest']
    """
    problems = []
    for page, (total, done, fuzzy) in sorted(pages.items()):
        share = done / total if total else 1.0
        if fuzzy:
            problems.append(f"{page}: {fuzzy} fuzzy translation(s): the English changed; "
                            f"update them and drop the fuzzy flag")
        if page in untranslated and share >= least:
            problems.append(f"{page}: {share:.0%} translated: remove it from UNTRANSLATED")
        elif page not in untranslated and share < least:
            problems.append(f"{page}: {done} of {total} messages translated ({share:.0%}), "
                            f"below {least:.0%}: translate the rest")
    return problems


# -- the language switch ---------------------------------------------------------------------

def _add_switch(app, config):
    options = dict(config.html_theme_options or {})
    end = options.get("article_header_end", ["article-header-buttons.html"])
    options["article_header_end"] = [*end, "edition-switch.html"]
    config.html_theme_options = options
    config.templates_path = [*config.templates_path, str(Path(__file__).with_name("templates"))]


def _switch_link(app, pagename, templatename, context, doctree):
    """The same page in the other edition: the Chinese pages live in ``zh/`` below
    the English ones, at the same paths."""
    up = "../" * pagename.count("/")
    if app.config.language == LANGUAGE:
        context.update(edition_link=f"{up}../{pagename}.html", edition_label="English",
                       edition_lang="en")
    else:
        context.update(edition_link=f"{up}zh/{pagename}.html", edition_label="中文",
                       edition_lang="zh-CN")


def _chinese_notebooks(app, doctree):
    """In the Chinese edition a chapter's exercise download is the notebook's Chinese
    twin, exercises/<part>/zh/X.ipynb (ringlab/authoring.py). Runs before Sphinx
    collects the downloads (its collector's priority is 500)."""
    if app.config.language != LANGUAGE:
        return
    from sphinx import addnodes

    from ringlab.authoring import chinese_twin
    for node in doctree.findall(addnodes.download_reference):
        target = Path(node["reftarget"])
        if "exercises" in target.parts and target.suffix == ".ipynb":
            twin = chinese_twin(target)
            if Path(app.env.relfn2path(str(twin), app.env.docname)[1]).exists():
                node["reftarget"] = twin.as_posix()


def _page_document(app, doctree):
    """Sphinx translates a message by parsing it as a document of its own, and the
    translated nodes keep a link to that document (``node._document``), whose settings
    hold the whole build environment: pickled with the page, a Chinese doctree was ten
    times its English one (the glossary's 2.8 MB against 0.3), and Sphinx loads pages'
    doctrees again and again (figure numbers, each {numref}). Unlinked, a node's
    document is its page's (docutils: ``node._document or node.parent.document``)."""
    for node in doctree.findall():
        if node._document not in (None, doctree):
            node._document = None


def setup(app):
    app.connect("config-inited", _add_switch)
    app.connect("doctree-read", _page_document)
    app.connect("html-page-context", _switch_link)
    app.connect("doctree-read", _chinese_notebooks, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    commands = {"update": update, "html": html}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python {Path(__file__).name} {{{'|'.join(commands)}}}")
    sys.exit(commands[sys.argv[1]]())
