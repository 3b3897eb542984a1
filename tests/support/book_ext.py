"""The book's build scripts and Sphinx extensions (book/_ext/), loaded by path: the
folder is not a package, and putting it on sys.path would leak into other tests."""
import importlib.util
from pathlib import Path

EXT = Path(__file__).resolve().parents[2] / "book" / "_ext"


def load(name):
    """A fresh module object of ``book/_ext/<name>.py``."""
    spec = importlib.util.spec_from_file_location(name, EXT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
