"""Test settings shared by every test file.

Hypothesis's "explain" phase re-runs a failing example many times to say which
parts of it matter. Our examples run whole simulated worlds, some with a time
limit, so that phase can take many minutes after a failure: a real bug would
look like a hang. Without it a failing property fails as soon as it is shrunk.
"""

import os

# One BLAS thread per process. The tests run 3 workers on 2 cores, and many
# start more processes (ranks, kernels); OpenBLAS's own thread per core then
# fights them for the cores: a ZeRO grader's measured case (1000 x 1000
# matmuls) took twice as long. Set before numpy is imported; every process the
# tests start inherits it. A product may differ in its last bits from a
# 2-thread one; the graders' verdicts and reports on tests/programs' ZeRO and
# HSDP programs are the same (tracemalloc's byte counts vary run to run anyway).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from hypothesis import Phase, settings      # noqa: E402

settings.register_profile(
    "ringlab", phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
settings.load_profile("ringlab")


# -- the built book, opened once per session (tests/support/built_book.py) --------------------

import pytest                               # noqa: E402


@pytest.fixture(scope="session")
def book_window(tmp_path_factory):
    """A 1400 x 900 headless chromium (tests/support/built_book.py), for the session."""
    from support.built_book import book_window as start
    driver = start(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def built_book_pages(book_window):
    """{page: Visit}: every page of the book at RINGLAB_BOOK_HTML, opened once."""
    from support.built_book import visit_every_page
    return visit_every_page(book_window, os.environ["RINGLAB_BOOK_HTML"])
