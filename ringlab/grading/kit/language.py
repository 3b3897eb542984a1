"""Reports in the learner's language: ``ringlab.grade(..., lang="zh")``, or the
environment variable ``RINGLAB_LANG=zh`` for every grade (``ringlab grade --lang zh``
sets it for the notebooks it runs).

Graders write English. ``say`` puts one of their texts into Chinese with the catalog
``zh_CN.json`` beside this file: an English template and its Chinese, where ``{}``
stands for what varies (a rank, a number, a name) and ``{0}``, ``{1}`` reorder it. What
fills a ``{}`` is put into Chinese too when the catalog has it, so that texts built
from texts read whole. A text no template matches stays English: a report is never
wrong for want of a translation.

    >>> say("every message sent is received", "zh")
    '每条发出的消息都被接收'
    >>> say("rank 3 returned None", "zh")
    'rank 3 返回了 None'
    >>> say("rank 3 returned None", "en")
    'rank 3 returned None'
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
from pathlib import Path

LANGUAGES = ("en", "zh")
CATALOG = Path(__file__).with_name("zh_CN.json")

# The report's own words (report.py), by language.
FRAME = {
    "en": {"head": "{exercise} results: ",
           "not_implemented": "not implemented yet. Fill in the program (replace the "
                              "`raise NotImplementedError`) and run the grading cell again.",
           "passed": "All test cases passed! ({total} cases, world sizes {sizes})",
           "failed": "FAILED ({passed} of {total} cases passed before this one)",
           "labels": ("Case:     ", "Check:    ", "What:     ", "Expected: ", "Got:      ",
                      "Hint:     ", "Reproduce: ")},
    "zh": {"head": "{exercise} 评分结果：",
           "not_implemented": "尚未实现（not implemented yet）。请把程序填写完整（替换 "
                              "`raise NotImplementedError`），再运行评分单元格。",
           "passed": "全部测试用例通过！（{total} 个用例，进程数 {sizes}）",
           "failed": "未通过（在此之前 {total} 个用例中通过了 {passed} 个）",
           # CJK characters are two columns wide: each label is ten columns, as in English.
           "labels": ("用例：    ", "检查：    ", "问题：    ", "期望：    ", "实际：    ",
                      "提示：    ", "复现："),
           },
}


def language(lang=None):
    """``lang``, else ``$RINGLAB_LANG``, else English; "zh_CN", "zh-CN" mean "zh"."""
    lang = (lang or os.environ.get("RINGLAB_LANG") or "en").lower().replace("-", "_")
    lang = "zh" if lang.startswith("zh") else lang.split("_")[0]
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {', '.join(LANGUAGES)}, not {lang!r}")
    return lang


# Where a text made of several sentences (a hint and the hint every error adds) may be
# cut: after a full stop or question mark and before a capital letter or a bracket.
SENTENCE_END = re.compile(r"(?<=[.?])\s+(?=[A-Z(])")
# Longer texts (a traceback, a program's printed value) and longer runs of sentences are
# not matched whole: no grader text is that long, and a report is made in milliseconds.
# A field longer than TOO_LONG stays as it is (it holds what a program printed).
LONGEST, MOST_SENTENCES, TOO_LONG = 800, 4, 3000


def say(text, lang, depth=3):
    """``text`` in ``lang``: its whole text by a template, else line by line, else
    clause by clause ("; "), else sentence by sentence (the longest run of sentences one
    template matches first)."""
    if lang == "en" or not text or len(text) > TOO_LONG:
        return text
    whole = _by_template(text, depth)
    if whole is not None:
        return whole
    if "\n" in text:
        return "\n".join(say(line, lang, depth) for line in text.split("\n"))
    # Clauses a grader joins with "; " (each a text of its own): Chinese only if all are.
    clauses = text.split("; ")
    if len(clauses) > 1:
        said = [say(clause, lang, depth) for clause in clauses]
        if all(zh != en for zh, en in zip(said, clauses)):
            return "；".join(said)
    sentences = SENTENCE_END.split(text)
    if not 1 < len(sentences) <= 3 * MOST_SENTENCES:
        return text
    said, start = [], 0
    while start < len(sentences):
        for end in range(min(len(sentences), start + MOST_SENTENCES), start, -1):
            run = " ".join(sentences[start:end])
            found = _by_template(run, depth)
            if found is not None or end == start + 1:
                said.append((found, run))
                start = end
                break
    # Chinese sentences follow each other without a space; English ones keep theirs.
    out = said[0][0] if said[0][0] is not None else said[0][1]
    for (before, _), (zh, en) in zip(said, said[1:]):
        out += zh if zh is not None and before is not None else " " + (zh if zh is not None else en)
    return out


def _by_template(text, depth):
    if len(text) > LONGEST:
        return None
    for pieces, patterns, chinese in _templates():
        if not _in_order(pieces, text):      # cheap, and no regex backtracks over a text
            continue                          # that lacks the template's fixed words
        found = next(filter(None, (p.fullmatch(text) for p in patterns)), None)
        # A field holding the template's own words again is two texts made into one
        # ("rank {} waits for rank {}" over "rank 1 waits for rank 2; rank 2 waits for
        # rank 1"): each is said on its own instead.
        if found and not any(piece in value for value in found.groups()
                             for piece in pieces if len(piece.strip()) >= 6):
            filled = [say(v, "zh", depth - 1) if depth > 0 else v for v in found.groups()]
            return chinese.format(*filled)
    return None


def _in_order(pieces, text):
    at = 0
    for piece in pieces:
        at = text.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return True


@functools.cache
def _templates():
    """[(fixed pieces, regex of an English template, its Chinese)], the most specific
    first: the template with the most fixed text wins where two match."""
    table = json.loads(CATALOG.read_text(encoding="utf-8"))
    compiled = []
    for english, chinese in table.items():
        parts = list(string.Formatter().parse(english))
        fixed = "".join(literal for literal, *_ in parts)
        # A field between fixed words holds no "; " (the clauses of a text joined so are
        # said one by one, not as rank "1 waits ...; rank 0"), and no sentence's end unless
        # the template has one: a run of sentences is not one sentence's template.
        edges = {0} if parts and not parts[0][0] else set()
        edges |= {len(parts) - 1} if parts and parts[-1][1] is not None else set()
        sentences = bool(SENTENCE_END.search(english.replace("{}", "X.")))
        regexes = ["".join(re.escape(literal) + ("" if field is None else _field(
            i in edges, sentences, glued=not literal[-1:].isspace(), balanced=balanced))
            for i, (literal, field, *_) in enumerate(parts)) for balanced in (True, False)]
        pieces = [literal for literal, *_ in parts if literal]
        # A field does not run past the end of a line unless the template has several lines:
        # else "... {}" would swallow the lines after it and leave them English.
        flags = re.DOTALL if "\n" in english else 0
        patterns = [re.compile(regex, flags) for regex in regexes]
        compiled.append((len(fixed), pieces, patterns, chinese))
    compiled.sort(key=lambda t: -t[0])
    return [(pieces, patterns, chinese) for _, pieces, patterns, chinese in compiled]


# One character of a field, or a whole [...] group: a field tried "balanced" first does
# not end inside brackets ("model {}, {}" over "model [5, 7, 2], sgd" splits after "]").
BRACKETS = r"\[(?:(?![\[\]]).)*\]|"


def _field(at_an_edge, sentences, glued, balanced=False):
    """The regex of one ``{}``: any text, lazily, but within limits (see _templates). A
    field glued to what comes before it ("node{}", "({}){}") may be empty: a plural's
    "s", or an optional note the grader adds. ``balanced``: [...] is taken whole and no
    other bracket is, so the field holds whole bracketed values."""
    stops = ([] if at_an_edge else ["; "]) + ([] if sentences else [r"[.?]\s+[A-Z(]"])
    count = "*?" if glued else "+?"
    char = r"(?![\[\]])." if balanced else "."
    if stops:
        char = f"(?!{'|'.join(stops)}){char}"
    return f"((?:{BRACKETS if balanced else ''}{char}){count})"
