"""What the grader tests assert about the report of a wrong program, in one place."""

import re


def assert_fails(report, check, phrases, *, exact=True, absent=()):
    """``report`` is a failure (not "not implemented") of ``check`` (the whole name, or a
    part of it with ``exact=False``), its text holds every one of ``phrases`` and none of
    ``absent``. Returns the text."""
    text = str(report)
    assert not report.passed and not report.not_implemented, text
    assert (report.failure.check == check) if exact else (check in report.failure.check), text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} missing from:\n{text}"
    for phrase in absent:
        assert phrase not in text, f"{phrase!r} in:\n{text}"
    # The same report in Chinese (ringlab/grading/kit/language.py) names its check in
    # Chinese: a grader's new check needs its line in zh_CN.json.
    check_line = report.text("zh").split("\n")[3]
    assert check_line.startswith("检查：") and re.search("[\u4e00-\u9fff]", check_line[3:]), (
        f"no Chinese for the check {report.failure.check!r} in zh_CN.json")
    return text
