"""The book's figure style in a kernel (ringlab/show/style.py, which `make` loads in
every kernel): not loaded until the kernel's code imports matplotlib, and then in
force before the first figure is drawn, as if it had been loaded at the start."""
import base64
import io

import PIL.Image
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from ringlab.show import style

SETUP = ("from ringlab.show import style\n"
         "style.load_ipython_extension(get_ipython())\n"
         "import sys; print('matplotlib' in sys.modules)")
DRAW = ("import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(); ax.plot([1, 2]); ax.set_title('small', fontsize=9)\n"
        "import matplotlib; print(matplotlib.rcParams['font.size'])")


def kernel(*cells):
    nb = new_notebook(cells=[new_code_cell(c) for c in cells],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    # no extension from the kernel's config: only what the cells load
    NotebookClient(nb, timeout=120, extra_arguments=["--InteractiveShellApp.extensions=[]"]
                   ).execute()
    return [c.outputs for c in nb.cells]


def printed(outputs):
    return [o.text.strip() for o in outputs if o.output_type == "stream"]


def pngs(outputs):
    return [PIL.Image.open(io.BytesIO(base64.b64decode(o.data["image/png"])))
            for o in outputs if "image/png" in o.get("data", {})]


def test_the_style_waits_for_matplotlib_and_holds_for_the_first_figure():
    setup, draw = kernel(SETUP, DRAW)
    assert printed(setup) == ["False"]                  # loading it loaded no matplotlib
    assert printed(draw) == [str(float(style.PT))]
    (png,) = pngs(draw)
    assert png.text[style.KEY] == "9"                  # drawn through style.png


def test_loaded_after_matplotlib_it_applies_at_once():
    setup, draw = kernel("import matplotlib\n" + SETUP, DRAW)
    assert printed(setup) == ["True"]
    assert printed(draw) == [str(float(style.PT))]
    assert pngs(draw)[0].text[style.KEY] == "9"
