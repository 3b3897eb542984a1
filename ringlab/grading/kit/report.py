"""The grade report: ``Case`` (one world a grader runs), ``Failure`` (what went
wrong, where, and what to try) and ``Report`` (the grade, as text or HTML).

    >>> print(Report("ring_allreduce", True, seed=1, cases_total=2, world_sizes=(1, 4)))
    ring_allreduce results: All test cases passed! (2 cases, world sizes 1-4)
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Case:
    """One world to run: ``inputs`` per rank, shared ``args``, and a label."""

    world_size: int
    inputs: list
    label: str
    args: tuple = ()
    info: dict = field(default_factory=dict)


@dataclass
class Failure:
    case: str
    check: str
    what: str
    expected: str | None = None
    got: str | None = None
    hint: str | None = None
    # The run's error (RankError, DeadlockError, ...), for a grader that explains it further; not shown.
    error: Exception | None = field(default=None, repr=False, compare=False)


class NotImplementedYet(Exception):
    """The program raised NotImplementedError: the stub is not filled in yet."""


@dataclass
class Report:
    """A grade: ``passed``, and a readable ``str()`` (HTML in a notebook)."""

    exercise: str
    passed: bool
    seed: int
    cases_passed: int = 0
    cases_total: int = 0
    world_sizes: tuple = ()
    failure: Failure | None = None
    not_implemented: bool = False
    backend: str = "sim"

    def __bool__(self):
        return self.passed

    def __str__(self):
        head = f"{self.exercise} results:"
        if self.not_implemented:
            return (f"{head} not implemented yet. Fill in the program (replace the "
                    f"`raise NotImplementedError`) and run the grading cell again.")
        if self.passed:
            sizes = f"{min(self.world_sizes)}-{max(self.world_sizes)}" if self.world_sizes else "-"
            return f"{head} All test cases passed! ({self.cases_total} cases, world sizes {sizes})"
        f = self.failure
        lines = [f"{head} FAILED ({self.cases_passed} of {self.cases_total} cases passed before this one)",
                 "", f"Case:     {f.case}", f"Check:    {f.check}", f"What:     {_indent(f.what)}"]
        if f.expected is not None:
            lines.append(f"Expected: {_indent(f.expected)}")
        if f.got is not None:
            lines.append(f"Got:      {_indent(f.got)}")
        if f.hint:
            lines.append(f"Hint:     {_indent(f.hint)}")
        # The backend too: a failure on real processes may not happen in the simulator.
        backend = "" if self.backend == "sim" else f", backend={self.backend!r}"
        lines += ["", f'Reproduce: ringlab.grade("{self.exercise}", program, seed={self.seed}{backend})']
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self):
        colour = "#1a7f37" if self.passed else ("#9a6700" if self.not_implemented else "#cf222e")
        return (f'<pre class="ringlab-report" style="border-left:4px solid {colour};'
                f'padding-left:8px;white-space:pre-wrap">{html.escape(str(self))}</pre>')


def _indent(text):
    return str(text).replace("\n", "\n          ")


def numbers(values, count=4):
    """Values as plain numbers for a report, "[1.5, -2.25, ...]": never numpy's
    reprs (``np.float64(1.5)``), and at most ``count`` of them."""
    flat = np.ravel(np.asarray(values, dtype=object))
    shown = ", ".join(_number(v) for v in flat[:count])
    return f"[{shown}{', ...' if len(flat) > count else ''}]"


def _number(v):
    try:
        return f"{float(v):.10g}"
    except (TypeError, ValueError):
        return repr(v)[:40]
