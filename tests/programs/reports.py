"""What the grader tests assert about the report of a wrong program, in one place."""


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
    return text
