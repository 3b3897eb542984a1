"""Errors a ringlab run can raise.

Every error names the rank and the step where it happened, because that is
what you need to find the bug: "rank 2, step 3: recv(src=1) expected ..." .
"""


from typing import NamedTuple

from . import deadlock


class Wait(NamedTuple):
    """What one blocked rank waits in: ``kind`` ("recv", "send", "recv_any",
    "work", "barrier", "split"), the global rank it waits for (``peer``, for
    "recv" and "send"), and the sentence that says so (``str(wait)``)."""

    kind: str
    peer: int | None
    text: str

    def __str__(self):
        return self.text

    def __contains__(self, part):      # "recv(src=1" in wait, as with the sentence
        return part in self.text


def said(exc):
    """What an exception says (``str(exc)``), even when saying it fails: a
    program's own exception class may have a ``__str__`` that raises."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - any failure of the program's __str__
        return f"<a {type(exc).__name__} whose str() fails>"


class RinglabError(Exception):
    """Base class of every error ringlab raises on purpose."""


class CommError(RinglabError):
    """A communication call was used wrongly (bad rank, not an array, wrong shape).

    Raised *inside* the rank's program, at the call, so the traceback points
    at the learner's own line.
    """


class RankError(RinglabError):
    """A rank's program raised an exception.

    ``rank`` and ``step`` say where, ``exc`` is the original exception and
    ``program_traceback`` is the traceback with ringlab's own frames removed.
    ``trace``: the messages sent until then (a ``Trace``; its ``unreceived``
    are those still in flight), or None if the backend cannot tell.
    """

    def __init__(self, rank, step, exc, program_traceback, trace=None):
        self.rank, self.step, self.exc = rank, step, exc
        self.program_traceback, self.trace = program_traceback, trace
        # A CommError already says "rank r, step s: ..."; don't say it twice.
        self.headline = said(exc) if isinstance(exc, CommError) else (
            f"rank {rank} raised {type(exc).__name__} at step {step}: {said(exc)}")
        super().__init__(f"{self.headline}\n{program_traceback}")


class DeadlockError(RinglabError):
    """Every rank that has not finished is blocked and no message can unblock it.

    ``waiting`` maps each blocked rank to a ``Wait`` (what it waits for;
    ``str()`` of it is the sentence);
    ``trace``, as for ``RankError``, holds the messages sent until then.
    """

    def __init__(self, waiting, finished, trace=None):
        self.waiting, self.finished, self.trace = waiting, finished, trace
        lines = [f"  rank {r}: {what}" for r, what in sorted(waiting.items())]
        done = f"\n  (finished: ranks {sorted(finished)})" if finished else ""
        super().__init__(
            "deadlock: every unfinished rank is blocked and no message can arrive\n"
            + "\n".join(lines) + done
        )

    def explain(self):
        """``(words, hint)``: the deadlock in plain words ("In plain words: rank 2
        waits for a message from rank 1, which has finished without sending it.",
        or "" where the waits say nothing plainer) and what to try; see
        ``ringlab.deadlock``."""
        return deadlock.explain(self)


class ProgramTimeout(RinglabError):
    """The program did not finish within the time limit (an infinite loop?)."""

    def __init__(self, seconds, rank, step, where):
        self.seconds, self.rank, self.step = seconds, rank, step
        at = f"rank {rank} was running at step {step}" if rank is not None else "no rank was running"
        super().__init__(
            f"timeout: the program did not finish within {seconds:g} s; {at}"
            + (f"\n{where}" if where else "")
            + "\nHint: look for a loop whose exit condition is never met, or a call that waits"
            " for something no rank will do (sleep, a lock, input)."
        )


class UnreceivedMessagesError(RinglabError):
    """The program ended with messages that nobody received.

    In a correct program every send has a matching receive; a leftover message
    usually means one rank sent one time too many (or its peer received one
    time too few).
    """

    def __init__(self, leftovers):
        self.leftovers = leftovers
        lines = [f"  {e.describe()}" for e in leftovers[:10]]
        more = f"\n  ... and {len(leftovers) - 10} more" if len(leftovers) > 10 else ""
        super().__init__(
            f"{len(leftovers)} message(s) were sent but never received:\n"
            + "\n".join(lines) + more
        )
