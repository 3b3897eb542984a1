"""Sphinx extension: the book's Chinese drawn by a real CJK font, on any machine, offline.

Why: the glossary's terms, every chapter's "Interview questions / 面试题" and the
Chinese edition are Chinese text, and a browser on a machine without a CJK font (a
fresh Debian has DejaVu and Liberation only) draws each of those characters as an
empty box. So the book carries its own font: Noto Sans CJK SC from Debian's
fonts-noto-cjk (the Makefile installs it; the figures use the same file, see
``ringlab.show.style.CJK_FONT``), cut down at the end of each build to exactly the
CJK characters of the pages written (their text, and the player and explorer data
in their scripts): ``_static/ringlab-cjk.woff2``, tens of KB instead of the
collection's 19 MB, and no font service to reach.

``_static/ringlab-cjk.css``, linked from every page, declares it with a
``unicode-range`` of the CJK blocks and puts it first in the theme's body, heading
and code fonts: the browser takes it for CJK characters only, Latin text keeps the
theme's fonts. Without the font file (a machine ``make`` could not install it on)
the build says so and goes on; the pages then use whatever fonts the reader has.
"""

import base64
import gzip
import html
import io
import os
import re
from pathlib import Path

from sphinx.util import logging

from ringlab.show import style             # CJK_FONT, CJK_FAMILY: the figures use them too

logger = logging.getLogger(__name__)
FAMILY = "ringlab CJK"                      # the @font-face name the pages use
FONT_FILE, CSS_FILE = "ringlab-cjk.woff2", "ringlab-cjk.css"
# Radicals, punctuation, kana, bopomofo, strokes, enclosed and compatibility forms,
# ideographs (extension A, unified, compatibility), Hangul syllables, vertical and
# full-width forms, ideographs of the supplementary planes.
RANGES = [(0x2E80, 0x2FFF), (0x3000, 0x33FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
          (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF),
          (0x20000, 0x3FFFF)]
CJK = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in RANGES) + "]")
ESCAPED = re.compile(r"\\u([0-9a-fA-F]{4})")          # JSON in a script: "\u5168"
PACKED = re.compile(r"atob\('([A-Za-z0-9+/=]+)'\)")    # ringlab.show.packed: gzip + base64


def page_text(text):
    """The text of a page and of the data its scripts carry: JSON escapes decoded,
    and the gzipped payloads the explorers unpack in the browser."""
    parts = [html.unescape(text)]
    for packed in PACKED.findall(text):
        try:
            parts.append(gzip.decompress(base64.b64decode(packed)).decode("utf-8"))
        except (ValueError, OSError):
            pass                                        # not ringlab.show.packed's data
    joined = "".join(parts)
    return joined + ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), joined)


def cjk_characters(outdir):
    """Every CJK character in the HTML pages under ``outdir`` and in its _static
    scripts (copybutton's Chinese tooltips). A folder holding another build (the
    Chinese edition in ``zh/``, with its own ``_static``) is that build's business."""
    outdir, chars = Path(outdir), set()
    for folder, subfolders, files in os.walk(outdir):
        subfolders[:] = [d for d in subfolders if d != "_static"
                         and not (Path(folder, d) / "_static").is_dir()]
        for name in files:
            if name.endswith(".html"):
                chars |= set(CJK.findall(page_text(Path(folder, name).read_text("utf-8"))))
    for js in (outdir / "_static").glob("*.js"):
        chars |= set(CJK.findall(page_text(js.read_text("utf-8", errors="replace"))))
    return chars


def subset(chars, font, family=style.CJK_FAMILY):
    """woff2 bytes of the face ``family`` of ``font`` (a collection or one font) with
    the glyphs of ``chars`` only: no hinting and no OpenType layout features (neither
    matters for horizontal CJK text on screen; together they are half the size)."""
    from fontTools import subset as ft_subset
    from fontTools.ttLib import TTFont
    number = 0
    if Path(font).suffix.lower() == ".ttc":
        from fontTools.ttLib import TTCollection
        names = [f["name"].getDebugName(1) for f in TTCollection(font, lazy=True).fonts]
        number = names.index(family)
    face = TTFont(font, fontNumber=number)
    options = ft_subset.Options(layout_features=[], hinting=False, desubroutinize=True)
    subsetter = ft_subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(map(ord, chars)))
    subsetter.subset(face)
    face.flavor = "woff2"                               # brotli-compressed
    out = io.BytesIO()
    face.save(out)
    return out.getvalue()


def css():
    """The @font-face, and the font put first in the theme's font lists."""
    ranges = ", ".join(f"U+{a:X}-{b:X}" for a, b in RANGES)
    first = f'"{FAMILY}"'
    return (f"/* {style.CJK_FAMILY}, subset to the book's CJK (book/_ext/cjk_font.py) */\n"
            f'@font-face {{\n  font-family: {first};\n  src: url("{FONT_FILE}") format("woff2");\n'
            f"  unicode-range: {ranges};\n  font-display: swap;\n}}\n"
            f":root {{\n"
            f"  --pst-font-family-base: {first}, var(--pst-font-family-base-system);\n"
            f"  --pst-font-family-heading: {first}, var(--pst-font-family-base-system);\n"
            f"  --pst-font-family-monospace: {first}, var(--pst-font-family-monospace-system);\n"
            f"}}\n")


def write(outdir, font):
    """Subset ``font`` to the CJK characters under ``outdir``; write the font and its
    CSS into ``outdir``/_static. Returns (characters, bytes of the font)."""
    chars = cjk_characters(outdir)
    data = subset(chars, font)
    static = Path(outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    (static / FONT_FILE).write_bytes(data)
    (static / CSS_FILE).write_text(css(), encoding="utf-8")
    return chars, len(data)


def _write(app, exception):
    if exception is None and app.builder.format == "html" and os.path.exists(style.CJK_FONT):
        chars, size = write(app.outdir, style.CJK_FONT)
        logger.info(f"cjk_font: {len(chars)} CJK characters, {size / 1024:.0f} KB "
                    f"in _static/{FONT_FILE}")


def setup(app):
    if os.path.exists(style.CJK_FONT):
        app.add_css_file(CSS_FILE)          # every page links it; _write writes it
    else:                                   # not a warning: the book builds with -W
        logger.info(f"cjk_font: no {style.CJK_FONT} (Debian's fonts-noto-cjk): the pages' "
                    f"Chinese is left to the reader's fonts")
    app.connect("build-finished", _write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
