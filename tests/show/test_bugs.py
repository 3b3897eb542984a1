"""``with_bug``: the pitfalls' buggy programs and the diffs the book shows of them."""

import pytest

from ringlab.show.bugs import with_bug


def _scale(x):
    return 2 * x


def doubled(x):
    return _scale(x) + 1


def test_the_bug_runs_the_edited_text_and_the_diff_shows_it():
    bug, diff = with_bug(doubled, ("_scale(x) + 1", "_scale(x) - 1"))
    assert (doubled(3), bug(3)) == (7, 5)
    assert diff.data == "```diff\n-    return _scale(x) + 1\n+    return _scale(x) - 1\n```"


def test_helpers_go_before_the_program_and_may_be_edited():
    bug, diff = with_bug(doubled, ("return 2 * x", "return 3 * x"), helpers=(_scale,))
    assert bug(3) == 10 and _scale(3) == 6
    assert "-    return 2 * x\n+    return 3 * x" in diff.data


def test_an_edit_that_is_not_in_the_source_once_is_refused():
    with pytest.raises(AssertionError, match="exactly once"):
        with_bug(doubled, ("x * 2", "x * 3"))
