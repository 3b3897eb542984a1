"""The chapters run before the build, several at once (book/_ext/execute.py), and the
build finds their runs in its cache instead of executing them again."""
import re
import subprocess
import sys
from pathlib import Path

import yaml

from support import book_ext

ROOT = Path(__file__).resolve().parents[2]
HEADER = Path(ROOT / "book/start/world.md").read_text().split("---\n")[1]   # a chapter's top matter


def test_every_chapter_with_code_is_run_in_the_order_of_the_book():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    docs = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    with_code = [ROOT / f"{d}.md" for d in docs
                 if re.search(r"^```\{code-cell\}", (ROOT / f"{d}.md").read_text(), re.M)]
    assert book_ext.load("execute").chapters() == with_code
    assert len(with_code) >= 30 and ROOT / "book/glossary.md" not in with_code


def chapter(code):
    return f"---\n{HEADER}---\n\n# A chapter\n\n```{{code-cell}} ipython3\n{code}\n```\n"


def test_runs_land_in_the_cache_the_build_reads_and_a_failure_is_left_to_the_build(tmp_path):
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n"
                                       "  - file: good\n  - file: bad\n")
    (tmp_path / "_config.yml").write_text("execute:\n  timeout: 60\n")
    (tmp_path / "intro.md").write_text("# No code here\n")
    (tmp_path / "good.md").write_text(chapter("import os\nprint(6 * 7, os.getcwd())"))
    (tmp_path / "bad.md").write_text(chapter("raise ValueError('on purpose')"))
    # A process of its own: the script forks its workers, which a test worker must not.
    run = subprocess.run([sys.executable, "-c",
                          "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
                          "import execute; sys.exit(execute.main(2, Path(sys.argv[2])))",
                          str(ROOT / "book/_ext"), str(tmp_path)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert "bad.md: raised (ValueError: on purpose)" in run.stdout, run.stdout
    assert "1 of 2 chapters executed" in run.stdout, run.stdout

    from jupyter_cache import get_cache
    from myst_nb.core.read import read_myst_markdown_notebook
    cache = get_cache(str(tmp_path / "_build" / ".jupyter_cache"))
    # what the build asks the cache for: the chapter as myst-nb reads it
    good = read_myst_markdown_notebook((tmp_path / "good.md").read_text())
    _, merged = cache.merge_match_into_notebook(good)
    assert merged.cells[-1].outputs[0].text.split() == ["42", str(tmp_path)]   # ran in its folder
    assert len(cache.list_cache_records()) == 1          # nothing cached for bad.md
