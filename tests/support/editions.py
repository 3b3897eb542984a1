"""book/_ext/editions.py (the Chinese edition's machinery) as a module for the tests: it is
a Sphinx extension and a script, not part of the ringlab package."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "editions", Path(__file__).resolve().parents[2] / "book" / "_ext" / "editions.py")
editions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(editions)
