"""Test settings shared by every test file.

Hypothesis's "explain" phase re-runs a failing example many times to say which
parts of it matter. Our examples run whole simulated worlds, some with a time
limit, so that phase can take many minutes after a failure: a real bug would
look like a hang. Without it a failing property fails as soon as it is shrunk.
"""

from hypothesis import Phase, settings

settings.register_profile(
    "ringlab", phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
settings.load_profile("ringlab")


# -- the built book, opened once per session (tests/support/built_book.py) --------------------

import os                                   # noqa: E402

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
