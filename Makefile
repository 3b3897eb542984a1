# The two commands of the README: `make book` and `make test`. Both create .venv.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: book book-shape test unit notebooks lab grade bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# Reinstall whenever pyproject.toml changes.
$(STAMP): pyproject.toml | $(BIN)/python
	@# The browser test (tests/test_browser.py) drives Debian's chromium; CI is root on Debian.
	if ! { command -v chromium && command -v chromedriver; } >/dev/null && [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; fi
	$(BIN)/python -m pip install -e '.[test,book,torch]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . --builder html -W --keep-going
	@echo "Open _build/html/index.html in a browser."

# Two worker processes, each running whole files (tests in a file share fixtures).
XDIST   := -n 2 --dist loadfile

unit: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST)

notebooks: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) --nbval-lax -p no:cacheprovider exercises solutions

# Checks on the built book: chapter heights in a 1400 x 900 browser, output widths
# (tests/test_book_shape.py; skipped by `make unit`, which builds no book).
book-shape: book
	RINGLAB_BOOK_HTML=$(CURDIR)/_build/html $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_book_shape.py

test: unit notebooks book book-shape

lab: $(STAMP)
	$(BIN)/python -m pip install -e '.[lab]'
	$(BIN)/jupyter lab exercises

bench: $(STAMP)
	$(BIN)/python bench/ring_allreduce.py
	$(BIN)/python bench/sim_overhead.py
	$(BIN)/python bench/nn_vs_torch.py
	$(BIN)/python bench/torch_allreduce.py
	$(BIN)/python bench/grade_data_parallel.py

clean:
	rm -rf _build
