"""Reports in Chinese (issue 27): ``ringlab.grade(..., lang="zh")``, ``RINGLAB_LANG``,
``ringlab grade --lang zh``; the catalog ringlab/grading/kit/zh_CN.json against the
graders' source (tests/support/report_texts.py)."""

import json
import re
import string

import pytest

import ringlab
from ringlab.collectives import ring_allreduce
from ringlab.grading.kit import language
from ringlab.grading.kit.language import say
from ringlab.grading.kit.report import Failure, Report
from support.report_texts import texts

CATALOG = json.loads(language.CATALOG.read_text(encoding="utf-8"))
CJK = re.compile(r"[\u4e00-\u9fff]")


def fields(template):
    return [f for _, f, *_ in string.Formatter().parse(template) if f is not None]


def test_every_text_the_graders_write_has_its_chinese():
    """A grader text added without a translation fails here, with the lines to add."""
    missing = {t: where for t, where in texts().items() if t not in CATALOG}
    assert not missing, ("report texts with no Chinese in zh_CN.json:\n"
                         + "\n".join(f"  {where}: {json.dumps(t)}" for t, where in missing.items()))
    assert len(texts()) > 300                    # the extraction finds the graders' texts


@pytest.mark.parametrize("english", sorted(CATALOG))
def test_each_chinese_template_keeps_what_varies(english):
    """The Chinese has the English's fields (``{}`` in order, or ``{0}``, ``{1}`` to
    reorder; a plural ending like ``node{}`` may go), some Chinese (or only Chinese
    commas and colons, in a text of names and numbers), and the English's code: names with an
    underscore or a dot stay as they are."""
    chinese, n = CATALOG[english], len(fields(english))
    chinese.format(*range(n))                   # no field the English lacks
    used = fields(chinese)
    if any(used):
        numbers = {int(f) for f in used}
        plural = {i for i, part in enumerate(english.split("{}")[:-1]) if part[-1:].isalpha()}
        assert numbers >= set(range(n)) - plural, chinese
    else:
        assert len(used) == n, chinese
    assert CJK.search(chinese) or chinese.replace("，", ", ").replace("：", ": ") == english, chinese
    code = [w for w in re.findall(r"\b\w+(?:\.\w+)*\b", english)
            if "_" in w or re.search(r"[a-z]{2}\.[a-z]{2}", w)]
    assert all(c in chinese for c in code), [c for c in code if c not in chinese]


def _kinds(template, chinese):
    """Which fields a word marks as a rank or a step: the English's field i follows
    "rank"/"step"; the Chinese field follows "rank" or sits in "第 {} 步"."""
    english = [re.search(r"(rank|step)s?\s*$", lit) for lit, f, *_ in
               string.Formatter().parse(template) if f is not None]
    english = [m and m.group(1) for m in english]
    parts, marked, auto = list(string.Formatter().parse(chinese)), {}, 0
    for k, (lit, f, *_) in enumerate(parts):
        if f is None:
            continue
        i, auto = (int(f) if f else auto), auto + 1
        after = parts[k + 1][0] if k + 1 < len(parts) else ""
        kind = ("rank" if re.search(r"rank\s*$", lit)
                else "step" if re.match(r"\s*步", after) else None)
        if kind and i < len(english) and english[i] in ("rank", "step"):
            marked[i] = (english[i], kind)
    return marked


def test_each_field_keeps_its_rank_or_its_step():
    """"received from rank {} at step {}" must not come out as "at step <rank>": where
    the Chinese puts the step before the rank, it numbers the fields ({1} ... {0})."""
    both = [t for t in CATALOG if re.search(r"rank.*step|step.*rank", t)]
    swapped = {t: CATALOG[t] for t in both
               if any(e != z for e, z in _kinds(t, CATALOG[t]).values())}
    assert not swapped, swapped
    assert sum(bool(_kinds(t, CATALOG[t])) for t in both) > 50     # the check reads them


def test_a_text_is_put_into_chinese_whole_with_what_fills_it():
    assert say("every message sent is received", "zh") == "每条发出的消息都被接收"
    # reordered fields, and a field that is itself a catalog text ("4 steps")
    text = "the broadcast took 4 steps: rank 3 received the data only at step 4"
    assert say(text, "zh") == "这次广播用了 4 步：rank 3 直到第 4 步才收到数据"
    assert say("rank 2 has wrong values at 3 of 12 elements", "zh") == "rank 2 的 12 个元素中有 3 个值不对"
    # line by line where the whole is no template; English where nothing matches
    assert say("no deadlock\nsomething new", "zh") == "没有死锁\nsomething new"
    assert say("something new", "zh") == "something new"
    assert say("every message sent is received", "en") == "every message sent is received"



def test_a_field_stops_at_the_end_of_its_line():
    """A template on one line ending in ``{}`` does not swallow the lines after it (they
    were put inside its Chinese, "形状为 (3,)\n没有死锁 的数组"): each line is said apart."""
    assert say("rank 1 returned an array of shape (3,)\nno deadlock", "zh") == \
        "rank 1 返回了形状为 (3,) 的数组\n没有死锁"
    assert say("a numpy array of shape (3, 4)\nrank 2 returned None", "zh") == \
        "形状为 (3, 4) 的 numpy 数组\nrank 2 返回了 None"
    # English is never touched, on one line or several
    text = "rank 1 returned an array of shape (3,)\nno deadlock"
    assert say(text, "en") is text


def test_a_field_holds_a_bracketed_value_whole():
    """"model {}, {}" over "model [5, 7, 2], sgd" once split inside the brackets ("模型
    [5，7, 2], sgd"): a field ends after a whole [...] where the template allows it."""
    assert say("world_size=4, global batch=8, model [5, 7, 2], sgd", "zh") == \
        "world_size=4，全局批次=8，模型 [5, 7, 2]，sgd"
    # a text with a lone bracket still finds its template
    assert say("world_size=4, global batch=8, model [5, 7, sgd", "zh").startswith(
        "world_size=4，全局批次=8，模型 [5")


def test_clauses_and_sentences_are_said_one_by_one():
    """A field between fixed words holds neither a "; " nor a sentence's end: a text of
    several clauses or sentences is said piece by piece, each with its own template."""
    assert say("rank 2's contribution is missing; rank 0's contribution is counted twice",
               "zh") == "缺少 rank 2 的贡献；rank 0 的贡献被计入了两次"
    assert say("In plain words: rank 0 waits for a message from rank 1; rank 1 waits for a "
               "message from rank 0: a cycle, so none of them can go on.", "zh") == (
        "简单地说：rank 0 在等待来自 rank 1 的消息；rank 1 在等待来自 rank 0 的消息："
        "形成了环，所以它们都无法继续。")
    # a one-sentence template does not take the next sentence into its last field
    hint = ("Rank 2 is position 2, whose child positions 2i+1 = 5 and 2i+2 = 6 exist only "
            "below N = 4. Positions past N - 1 = 3 are not in the tree; wrapping them around "
            "with % N makes them real ranks (5 -> rank 1, 6 -> rank 2).")
    assert "Positions" not in say(hint, "zh") and "5 -> rank 1" in say(hint, "zh")
    # an English clause keeps the whole text English
    assert say("rank 2's contribution is missing; something new", "zh") == \
        "rank 2's contribution is missing; something new"


# Wrong programs of tests/programs whose reports have several lines (What, Got); none
# of their lines may stay English. (A line that quotes the program's own exception is
# the program's, and is not among these.)
WRONG = [("ring_allreduce", "ring_variants", "one_step_too_few"),
         ("ring_allreduce", "ring_variants", "receives_first_deadlock"),
         ("ring_allreduce", "ring_variants", "accumulates_in_all_gather"),
         ("one_f_one_b", "pipeline", "ofob_gpipe"),
         ("one_f_one_b", "pipeline", "ofob_swapped"),
         ("one_f_one_b", "pipeline", "ofob_warmup_short")]
# Three English words in a row: a sentence left untranslated (code and numbers break a run).
ENGLISH = re.compile(r"(?<![\w.'])(?:[A-Za-z][a-z]+|a)(?:[,;:]? (?:[A-Za-z][a-z]+|a)){2}(?![\w(.])")


@pytest.mark.parametrize("exercise, module, name", WRONG)
def test_real_multi_line_reports_read_chinese_whole(exercise, module, name):
    import importlib
    program = getattr(importlib.import_module(f"programs.{module}"), name)
    report = ringlab.grade(exercise, program, seed=1, lang="zh")
    f = report.failure
    assert f is not None and "\n" in f.what + (f.got or ""), report.text("en")
    for field in (f.what, f.expected, f.got):
        for line in say(field or "", "zh").split("\n"):
            if line.startswith("rank ") and ": " in line and "F0" in line:
                continue                  # a schedule's row: "rank 0: 0F0 0F1 0B0 ..."
            assert not ENGLISH.search(line), (name, line)
    # and the English report is the graders' text, untouched
    assert f.what.replace("\n", "\n          ") in report.text("en")

def test_what_a_program_printed_is_left_alone_and_quickly():
    """A field can hold a learner's text (a repr, an exception's message): one over
    language.TOO_LONG stays as it is, and no text makes the matching backtrack for long."""
    import random
    import time
    rng = random.Random(0)
    words = ["rank", "1", "sent", "bytes", "between", "nodes,", "at", "step", ":", ".", "A", "\n"]
    for n in (50, 300, 3000):
        text = " ".join(rng.choice(words) for _ in range(n))
        start = time.perf_counter()
        said = say(text, "zh")
        assert time.perf_counter() - start < 1.0, n
        if len(text) > language.TOO_LONG:
            assert said == text


def test_the_report_frame_in_both_languages():
    failed = Report("ring_allreduce", False, seed=7, cases_passed=2, cases_total=18,
                    failure=Failure("world_size=4, length=12", "no deadlock", "rank 0 waits",
                                    expected="1 sent and 1 received, at every step, on every rank",
                                    hint="Something only English."), lang="zh")
    assert str(failed).splitlines() == [
        "ring_allreduce 评分结果：未通过（在此之前 18 个用例中通过了 2 个）", "",
        "用例：    world_size=4，length=12", "检查：    没有死锁", "问题：    rank 0 waits",
        "期望：    每一步、每个 rank 上发送 1 条、接收 1 条", "提示：    Something only English.", "",
        '复现：ringlab.grade("ring_allreduce", program, seed=7, lang="zh")']
    assert failed.text("en").splitlines()[:4] == [
        "ring_allreduce results: FAILED (2 of 18 cases passed before this one)", "",
        "Case:     world_size=4, length=12", "Check:    no deadlock"]
    assert 'lang="zh-CN"' in failed._repr_html_()
    done = Report("ring_allreduce", True, seed=1, cases_total=18, world_sizes=(1, 8), lang="zh")
    assert str(done) == "ring_allreduce 评分结果：全部测试用例通过！（18 个用例，进程数 1-8）"
    todo = Report("ring_allreduce", False, seed=1, not_implemented=True, lang="zh")
    assert str(todo).startswith("ring_allreduce 评分结果：尚未实现（not implemented yet）")


def test_grade_takes_the_language_from_its_argument_or_the_environment(monkeypatch):
    assert "全部测试用例通过" in str(ringlab.grade("ring_allreduce", ring_allreduce, seed=1, lang="zh"))
    monkeypatch.setenv("RINGLAB_LANG", "zh_CN")
    assert "全部测试用例通过" in str(ringlab.grade("ring_allreduce", ring_allreduce, seed=1))
    assert "All test cases passed" in str(ringlab.grade("ring_allreduce", ring_allreduce, seed=1,
                                                        lang="en"))
    with pytest.raises(ValueError, match="lang must be one of en, zh, not 'fr'"):
        ringlab.grade("ring_allreduce", ring_allreduce, seed=1, lang="fr")


def test_a_wrong_program_in_chinese_keeps_every_number():
    def forgets_the_allgather(comm, x):
        return x
    report = ringlab.grade("ring_allreduce", forgets_the_allgather, seed=3, lang="zh")
    english, chinese = report.text("en"), str(report)
    assert "检查：" in chinese and CJK.search(chinese.split("检查：")[1].splitlines()[0])
    assert sorted(re.findall(r"\d+", english)) == sorted(re.findall(r"\d+", chinese))


def test_ringlab_grade_lang_zh_on_a_renamed_notebook(tmp_path, monkeypatch, capsys):
    """``ringlab grade --lang zh``: the printed report and the grading cells of the
    notebook as it ran are Chinese; the rows (an instructor's table) stay as they were."""
    import shutil
    from pathlib import Path

    import nbformat

    from ringlab import cli
    root = Path(__file__).resolve().parents[2]
    shutil.copy(root / "exercises" / "collectives" / "01_ring_allreduce.ipynb",
                tmp_path / "homework.ipynb")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["grade", "homework.ipynb", "--lang", "zh", "--json", "rows.json",
                     "--executed", "ran"])
    printed = capsys.readouterr().out
    assert code == 1 and "ring_allreduce 评分结果：尚未实现" in printed
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["result"] == "not implemented" and row["reason"] == ""
    ran = nbformat.read(tmp_path / "ran" / "homework.ipynb", as_version=4)
    shown = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                    for c in ran.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "评分结果：尚未实现" in shown and "results: not implemented" not in shown


def test_the_chinese_twin_of_an_exercise_grades_in_chinese(tmp_path, monkeypatch, capsys):
    """exercises/<part>/zh/X.ipynb, renamed, through ``ringlab grade`` without --lang:
    its metadata says "zh", and its first cell asks ringlab.grade for Chinese; the
    Try-it and grading cells run clean, and the report is Chinese."""
    import shutil
    from pathlib import Path

    import nbformat

    from ringlab import cli
    root = Path(__file__).resolve().parents[2]
    shutil.copy(root / "exercises" / "data_parallel" / "zh" / "07_sync_sgd_step.ipynb",
                tmp_path / "作业.ipynb")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RINGLAB_LANG", raising=False)
    assert cli.main(["grade", "作业.ipynb", "--executed", "ran"]) == 1
    assert "sync_sgd_step 评分结果：尚未实现" in capsys.readouterr().out
    ran = nbformat.read(tmp_path / "ran" / "作业.ipynb", as_version=4)
    outputs = [o for c in ran.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "评分结果：尚未实现" in shown and "results: not implemented" not in shown
