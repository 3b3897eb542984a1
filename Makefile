# The two commands of the README: `make book` and `make test`. Both create .venv.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
CJK_FONT := /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc

.PHONY: book translations book-shape book-then-shape shape test unit notebooks lab grade bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# Reinstall whenever pyproject.toml changes.
$(STAMP): pyproject.toml | $(BIN)/python
	@# The browser test (tests/show/test_browser.py) drives Debian's chromium; the book's and
	@# the figures' Chinese is drawn in Debian's Noto Sans CJK (CJK_FONT: book/_ext/cjk_font.py,
	@# ringlab/show/style.py). CI is root on Debian.
	missing=; { command -v chromium && command -v chromedriver; } >/dev/null \
		|| missing="chromium chromium-driver"; \
	[ -f $(CJK_FONT) ] || missing="$$missing fonts-noto-cjk"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; fi
	@# pip byte-compiles what it installs on one core (torch is most of it); compileall does
	@# the same files on every core. Its errors are ignored, as pip ignores them: a few files
	@# of torch's own tests are Python 3.12.
	$(BIN)/python -m pip install --no-compile -e '.[test,book,torch]'
	$(BIN)/python -c "import compileall, sysconfig; \
		compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@# Every kernel here draws figures in the book's style and records their smallest text
	@# (ringlab/show/style.py), which the shape check on the built book measures.
	mkdir -p $(VENV)/etc/ipython
	echo 'c.InteractiveShellApp.extensions = ["ringlab.show.style"]' \
		> $(VENV)/etc/ipython/ipython_kernel_config.py
	touch $(STAMP)

# The English book, every chapter executed (an empty cache: nothing stale is reused), then
# the Chinese edition from that same run, in _build/html/zh (book/_ext/editions.py). The
# chapters run first, one per core (book/_ext/execute.py); the build reads their runs, for
# every page (--all: a chapter whose source is unchanged may still show new outputs).
book: $(STAMP)
	rm -rf _build/.jupyter_cache
	$(BIN)/python book/_ext/execute.py
	$(BIN)/jupyter-book build . --builder html -W --keep-going --all
	$(BIN)/python book/_ext/editions.py html
	@echo "Open _build/html/index.html (中文版: _build/html/zh/index.html) in a browser."

# After changing a chapter's text: refresh its catalog under locales/ and translate what
# changed (book/_ext/editions.py says how).
translations: $(STAMP)
	$(BIN)/python book/_ext/editions.py update

# Most tests wait on processes they start (ranks, kernels, gloo, a browser):
# three workers keep two cores busy. Tests go to whichever worker is free.
XDIST   := -n 3 --dist worksteal

unit: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST)

# nbval on every notebook. Not part of `make test`: tests/book/test_learner_path.py runs
# each of these notebooks top to bottom in a kernel of its own and fails on any cell that
# raises (all that --nbval-lax checks), so `make test` does not run them twice.
# A notebook's cells run in order in one kernel: each notebook stays on one worker.
notebooks: $(STAMP)
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --nbval-lax -p no:cacheprovider \
		exercises solutions

# Checks on the built book: chapter heights in a 1400 x 900 browser, output widths,
# the player on its page and no JavaScript errors (skipped by `make unit`, which
# builds no book).
book-shape: book shape

shape:
	RINGLAB_BOOK_HTML=$(CURDIR)/_build/html $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/book/test_book_shape.py tests/show/test_browser.py::test_player_runs_in_the_built_book \
		tests/book/test_cjk_font.py

# The tests (the notebooks' included, see `notebooks`), while the book builds beside them
# (it keeps a core busy while the tests wait), followed there by the checks on the built book.
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 --output-sync=target unit book-then-shape

book-then-shape: $(STAMP)
	$(MAKE) --no-print-directory book
	$(MAKE) --no-print-directory shape

lab: $(STAMP)
	$(BIN)/python -m pip install -e '.[lab]'
	$(BIN)/jupyter lab exercises

bench: $(STAMP)
	$(BIN)/python bench/sim_targets.py
	$(BIN)/python bench/ring_allreduce.py
	$(BIN)/python bench/sim_overhead.py
	$(BIN)/python bench/nn_vs_torch.py
	$(BIN)/python bench/torch_allreduce.py
	$(BIN)/python bench/grade_data_parallel.py
	$(BIN)/python bench/isolated_start.py

clean:
	rm -rf _build
