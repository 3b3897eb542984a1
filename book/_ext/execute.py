"""Run the book's chapters before the build, several at a time, into the execution cache.

myst-nb executes each chapter when Sphinx reads it, one after the other: the build
waits on one kernel at a time while the other cores idle (about 155 of the English
build's 205 s here). ``make book`` first runs this script, which executes every chapter
of ``_toc.yml`` in its own kernel, as many at once as the machine has cores, and stores
each run in ``_build/.jupyter_cache``, the cache the build reads
(``execute_notebooks: cache`` in ``_config.yml``). The build then finds every chapter
there and executes nothing; the Chinese edition reads the same cache
(``editions.py``).

The run is the build's own, made earlier: the same reader (myst-nb's), the same
executor (jupyter-cache's ``single_nb_execution``, in the chapter's folder, with the
``_config.yml`` timeout), the same kernels (``ipc_kernels.py``). A chapter is found in
the cache by the hash of its code cells, so one changed after this ran is executed by
the build as before. A chapter that raises is not cached: the build runs it again and
fails on the cell that raised, with its traceback.

    python book/_ext/execute.py          # before `jupyter-book build .`
"""

import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MYST = {"type": "plugin", "name": "myst_nb_md"}     # myst-nb's reader, as the build's


def chapters(root=ROOT):
    """The files of ``_toc.yml`` that myst-nb executes: notebooks, and Markdown files with
    a notebook's top matter, in the order of the book."""
    from myst_nb.core.read import is_myst_markdown_notebook
    from sphinx_external_toc.parsing import parse_toc_yaml
    found = []
    for doc in parse_toc_yaml(root / "_toc.yml"):          # the docnames, in order
        for suffix in (".md", ".ipynb"):
            path = root / f"{doc}{suffix}"
            if path.exists() and (suffix == ".ipynb"
                                  or is_myst_markdown_notebook(path.read_text("utf8"))):
                found.append(path)
    return found


def _reader(path):
    """jupyter-cache's ``read_data`` for ``path``: myst-nb's for Markdown, else its default."""
    return MYST if path.suffix == ".md" else None


def _execute(path, timeout):
    """One chapter's run, in a worker process: (path, executed notebook or None, seconds,
    the error's text)."""
    from jupyter_cache.executors.utils import single_nb_execution
    from jupyter_cache.readers import get_reader
    nb = get_reader(_reader(path))(str(path))
    result = single_nb_execution(nb, cwd=str(path.parent), timeout=timeout, allow_errors=False)
    return path, None if result.err else nb, result.time, result.exc_string


def main(workers=None, root=ROOT):
    import ipc_kernels                      # the build's kernels: local sockets, one BLAS thread
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    ipc_kernels.setup(None)
    timeout = yaml.safe_load((root / "_config.yml").read_text())["execute"]["timeout"]
    todo = chapters(root)
    workers = workers or len(os.sched_getaffinity(0))
    start, failed = time.monotonic(), 0
    # The workers are forked before this process opens the cache (a SQLite file, which
    # only this process writes) and inherit the kernels' settings made above.
    with ProcessPoolExecutor(workers) as pool:
        runs = [pool.submit(_execute, path, timeout) for path in todo]
        cache = root / "_build" / ".jupyter_cache"
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache = get_cache(str(cache))
        for run in as_completed(runs):
            path, nb, seconds, error = run.result()
            name = path.relative_to(root)
            if nb is None:
                failed += 1
                plain = re.sub(r"\x1b\[[0-9;]*m", "", error or "")     # the kernel's colours
                last = plain.strip().splitlines()[-1:] or ["?"]
                print(f"{name}: raised ({last[0]}); the build runs it again and shows where")
                continue
            record = cache.add_nb_to_project(str(path), read_data=_reader(path))
            cache.cache_notebook_bundle(CacheBundleIn(nb, record.uri,
                                                      data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"{name}: executed in {seconds:.1f} s")
    print(f"{len(todo) - failed} of {len(todo)} chapters executed in "
          f"{time.monotonic() - start:.0f} s, {workers} at a time")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main(*map(int, sys.argv[1:])))
