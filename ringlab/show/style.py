"""The book's figure style, and the measure that keeps figure text readable.

A figure's words must be as large on the page as the words around it: the
book's body text is 16 px (the theme's 1 rem), and a matplotlib figure drawn at
100 dpi shows a ``p``-point text at ``p * 100 / 72`` px times the scale the page
shrinks it by. So the book's kernel (``make`` installs the setting, see the
Makefile) loads this module as an IPython extension, which

* sets ``RC``: 12-point text, 16.7 px at full size;
* draws every figure's PNG itself, writing into the file the size of the
  smallest text the figure shows (a PNG text chunk, ``KEY``), so that the shape
  check on the built book can measure each figure's smallest text on screen
  (its points x dpi / 72 x its shown scale) without running it again;
* draws Chinese words in ``CJK_FAMILY`` from ``CJK_FONT`` (Debian's fonts-noto-cjk,
  which ``make`` installs; ``use_cjk_font``), the font the built book ships
  subset to its own characters (book/_ext/cjk_font.py): without it matplotlib
  draws boxes and warns "Glyph ... missing from font(s) DejaVu Sans".

All of that happens when the kernel's code first imports matplotlib, not when the
kernel starts: a kernel that draws nothing (``ringlab grade`` runs a notebook in one,
the tests start dozens) does not load matplotlib and its fonts (0.6 s of CPU each).

    >>> import matplotlib; matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> _ = ax.set_title("twelve", fontsize=12); _ = ax.text(0.5, 0.5, "tiny", fontsize=7)
    >>> smallest_text_pt(fig)
    7.0
    >>> import io, PIL.Image
    >>> PIL.Image.open(io.BytesIO(png(fig))).text[KEY]
    '7'
"""

from __future__ import annotations

import importlib.util
import os
import sys

BODY_PX = 16                  # the book's body text, in CSS pixels
PT = 12                       # the smallest text a figure draws, in points: 16.7 px at 100 dpi
KEY = "ringlab:smallest-text-pt"
RC = {"font.size": PT, "axes.titlesize": PT, "axes.labelsize": PT, "xtick.labelsize": PT,
      "ytick.labelsize": PT, "legend.fontsize": PT, "legend.title_fontsize": PT,
      "figure.titlesize": PT + 1}
# Debian's fonts-noto-cjk (the Makefile installs it): a collection whose faces
# include the Simplified Chinese one, CJK_FAMILY.
CJK_FONT = "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"
# Its bold faces, same package: without them every bold label (a title, a legend's
# heading) makes matplotlib log "Failed to find font weight bold" into the cell.
CJK_FONT_BOLD = "/usr/share/fonts/opentype/noto/NotoSansCJK-Bold.ttc"
CJK_FAMILY = "Noto Sans CJK SC"


def _drawn(text, renderer):
    """Whether ``text`` puts ink on the figure: visible, not empty, not clipped away."""
    if not (text.get_visible() and text.get_text().strip()):
        return False
    if text.get_alpha() == 0:
        return False
    box = text.get_window_extent(renderer)
    if box.width == 0 or box.height == 0:
        return False
    clip = text.get_clip_box() if text.get_clip_on() else None
    return clip is None or box.overlaps(clip)


def smallest_text_pt(fig):
    """The font size, in points, of the smallest text ``fig`` shows (None if none)."""
    from matplotlib.text import Text
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()                  # places tick labels and legends
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if _drawn(t, renderer)]
    return min(sizes) if sizes else None


def png(fig):
    """The figure as PNG bytes, as the notebook shows it (tight box, the figure's
    dpi), with its smallest text size written under ``KEY``."""
    from IPython.core.pylabtools import print_figure
    pt = smallest_text_pt(fig)
    return print_figure(fig, "png", metadata={KEY: "" if pt is None else f"{pt:g}"})


def use_cjk_font(rc=None):
    """Draw CJK characters in ``CJK_FAMILY``: register ``CJK_FONT`` with matplotlib and
    add the family after the current ones in ``rc`` (``matplotlib.rcParams``), so that
    Latin text keeps its font and figures without CJK stay the same bytes. Returns the
    family, or None (and changes nothing) when the font file is not there."""
    import matplotlib
    rc = matplotlib.rcParams if rc is None else rc
    if not os.path.exists(CJK_FONT):
        return None
    from matplotlib import font_manager
    registered = {(f.name, f.weight) for f in font_manager.fontManager.ttflist}
    if (CJK_FAMILY, 400) not in registered:
        font_manager.fontManager.addfont(CJK_FONT)        # every face of the collection
    if (CJK_FAMILY, 700) not in registered and os.path.exists(CJK_FONT_BOLD):
        font_manager.fontManager.addfont(CJK_FONT_BOLD)
    if CJK_FAMILY not in rc["font.family"]:
        rc["font.family"] = [*rc["font.family"], CJK_FAMILY]
    return CJK_FAMILY


def load_ipython_extension(ip):
    """Use the book's style in this kernel and show figures through ``png``: at once if
    matplotlib is loaded, else right after the kernel's code first imports it."""
    if "matplotlib" in sys.modules:
        _use_in(ip)
    else:
        sys.meta_path.insert(0, _AfterImport("matplotlib", lambda: _use_in(ip)))


def _use_in(ip):
    import matplotlib
    from matplotlib.figure import Figure
    # Importing the inline backend sets it up in this kernel, with its PNG
    # formatter, once (it does not set it up again): ours then replaces it.
    import matplotlib_inline.backend_inline  # noqa: F401
    matplotlib.rcParams.update(RC)
    use_cjk_font()
    ip.display_formatter.formatters["image/png"].for_type(Figure, png)


class _AfterImport:
    """An import hook (``sys.meta_path``) that calls ``then()`` once, right after the
    module ``name`` has run, before the ``import`` that asked for it returns."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)     # the module's own, found without us
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.then()
        spec.loader.exec_module = exec_module
        return spec
