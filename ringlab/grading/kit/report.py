"""The grade report: ``Case`` (one world a grader runs), ``Failure`` (what went
wrong, where, and what to try) and ``Report`` (the grade, as text or HTML).

    >>> print(Report("ring_allreduce", True, seed=1, cases_total=2, world_sizes=(1, 4)))
    ring_allreduce results: All test cases passed! (2 cases, world sizes 1-4)
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np

from .language import FRAME, say


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
    """A grade: ``passed``, and a readable ``str()`` (HTML in a notebook), in the
    language ``lang`` ("en" or "zh")."""

    exercise: str
    passed: bool
    seed: int
    cases_passed: int = 0
    cases_total: int = 0
    world_sizes: tuple = ()
    failure: Failure | None = None
    not_implemented: bool = False
    backend: str = "sim"
    lang: str = "en"

    def __bool__(self):
        return self.passed

    def __str__(self):
        return self.text(self.lang)

    def text(self, lang="en"):
        """The report in ``lang`` ("en" or "zh": language.py)."""
        words = FRAME[lang]
        head = words["head"].format(exercise=self.exercise)
        if self.not_implemented:
            return head + words["not_implemented"]
        if self.passed:
            sizes = f"{min(self.world_sizes)}-{max(self.world_sizes)}" if self.world_sizes else "-"
            return head + words["passed"].format(total=self.cases_total, sizes=sizes)
        f = self.failure
        case, check, what, expected, got, hint, reproduce = words["labels"]
        lines = [head + words["failed"].format(passed=self.cases_passed, total=self.cases_total),
                 "", case + say(f.case, lang), check + say(f.check, lang),
                 what + _indent(say(f.what, lang))]
        for label, value in ((expected, f.expected), (got, f.got), (hint, f.hint or None)):
            if value is not None:
                lines.append(label + _indent(say(value, lang)))
        # The backend too: a failure on real processes may not happen in the simulator.
        backend = "" if self.backend == "sim" else f", backend={self.backend!r}"
        backend += "" if lang == "en" else f', lang="{lang}"'
        lines += ["", f'{reproduce}ringlab.grade("{self.exercise}", program, seed={self.seed}{backend})']
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self):
        colour = "#1a7f37" if self.passed else ("#9a6700" if self.not_implemented else "#cf222e")
        lang = "" if self.lang == "en" else ' lang="zh-CN"'
        return (f'<pre class="ringlab-report"{lang} style="border-left:4px solid {colour};'
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
