"""The book's chapters run in kernels on local sockets (book/_ext/ipc_kernels.py).

With TCP, a kernel binds five ports its manager found free a moment before; a process
beside the build that takes one kills the kernel at start, and `make test` runs the
unit tests beside the build. These tests run a chapter's way: through jupyter-cache's
``single_nb_execution``, as myst-nb does, once the extension is set up.
"""
import importlib.util
import os
from pathlib import Path

import pytest
from jupyter_cache.executors import utils
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]
ASK = ("from ipykernel.kernelapp import IPKernelApp\n"
       "app = IPKernelApp.instance()\n"
       "print(app.transport, app.ip)")


class App:
    """The one call of Sphinx's application the extension makes."""
    def connect(self, *args, **kwargs):
        pass


@pytest.fixture
def extension(monkeypatch):
    return set_up(monkeypatch)


def set_up(monkeypatch):
    monkeypatch.setattr(utils, "executenb", utils.executenb)     # undone after the test
    spec = importlib.util.spec_from_file_location("ipc_kernels", ROOT / "book/_ext/ipc_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.setup(App())
    module.setup(App())                                          # Sphinx may set it up twice
    return module


def kernel_says(tmp_path, code=ASK):
    nb = new_notebook(cells=[new_code_cell(code)],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    result = utils.single_nb_execution(nb, cwd=str(tmp_path), timeout=60, allow_errors=False)
    assert result.err is None, result.exc_string
    return nb.cells[0].outputs[0].text.split()


def test_a_chapter_kernel_binds_local_sockets_in_a_folder_of_its_own(extension, tmp_path):
    transport, ip = kernel_says(tmp_path)
    assert transport == "ipc"
    folder = Path(ip).parent
    assert folder.name.startswith("ringlab-kernel-") and folder != tmp_path
    assert not folder.exists(), "the kernel's sockets are removed with their folder"
    assert list(tmp_path.iterdir()) == [], "no socket file is left where the chapter runs"
    _, other = kernel_says(tmp_path)
    assert Path(other).parent != folder, "each kernel has its own folder"


def test_without_the_extension_the_kernel_would_use_tcp(tmp_path):
    """What the extension changes: the default is TCP (the test above could not pass
    by the default alone)."""
    transport, _ = kernel_says(tmp_path)
    assert transport == "tcp"


def test_a_chapter_kernel_gets_one_openblas_thread(monkeypatch, tmp_path):
    """The chapters' small products are slower with a BLAS thread per core on a
    loaded machine (the extension's docstring). tests/conftest.py sets the variable
    for the tests themselves: removed here (and put back after the test)."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    set_up(monkeypatch)
    ask = "import os, numpy\nprint(os.environ.get('OPENBLAS_NUM_THREADS'))"
    assert kernel_says(tmp_path, ask) == ["1"]


def test_an_openblas_setting_of_ones_own_is_kept(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    set_up(monkeypatch)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"
