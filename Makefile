# The two commands of the README:  `make book`  and  `make test`.
# Both create .venv on first use and install the exact pins of constraints.txt.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: book test test-colab pdf lint clean clean-stale

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[book,test]'
	touch $(STAMP)

## execute every chapter (quick profile, cached) and build the HTML site into _build/html.
## On two or more cores the chapters execute side by side, one per core, longest first (their quick-profile
## times on a 2-core CPU: 03 ~480 s, 04 ~250 s, 02 ~230 s, 01 ~135 s, 00 ~10 s), each with one
## thread and its sweeps in its own process (OMP_NUM_THREADS=1, --scheduler serial: two
## multi-threaded kernels on two cores slow each other down many times over). The execution
## records are written under a lock; `attnbook build` then renders the site and executes whatever
## is still not current (a chapter missing from this list included).
LONGEST_FIRST := 03-positional-semantic 04-attention-paths 02-provable-mha 01-random-features 00-attention
book: $(STAMP)
	@if [ "$$(nproc)" -ge 2 ]; then \
	  printf '%s\n' $(LONGEST_FIRST) | OMP_NUM_THREADS=1 xargs -P "$$(nproc)" -I{} \
	    $(BIN)/attnbook run {} --scheduler serial \
	  || { echo "a chapter failed: see its log above"; exit 1; }; \
	fi
	$(BIN)/attnbook build

## lint, then the whole test suite (unit, theory vs simulation, chapters, site, browser).
## On two or more cores pytest-xdist runs it on two workers, one test file each at a time
## (--dist loadfile: a file's module fixtures, e.g. the student edition, are built once), each
## worker with one thread, the longest files first (tests/conftest.py orders them;
## --no-loadscope-reorder keeps that order instead of xdist's most-tests-first); TEST_WORKERS=0
## runs it in this process.
TEST_WORKERS ?= $(shell [ "$$(nproc)" -ge 2 ] && echo 2 || echo 0)
test: book
	$(BIN)/ruff check attnlib attnbook tests benchmarks
	$(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

## every chapter notebook (chapters/*.ipynb) executed in a fresh venv from attnlib's wheel, the way
## Colab runs it (the whole quick profile of each chapter; `make test` runs chapter 0 only)
test-colab: $(STAMP)
	ATTNBOOK_TEST_COLAB=all $(BIN)/python -m pytest tests/site/test_colab.py

## the book as a PDF through Jupyter Book's LaTeX builder (XeLaTeX): needs TeX Live, e.g. on Debian
## `apt-get install texlive-xetex texlive-latex-extra texlive-fonts-recommended latexmk fonts-freefont-otf`;
## not part of CI. Staged apart from the site (_build/pdf/src); the PDF is _build/pdf/_build/latex/book.pdf
pdf: book
	$(BIN)/python book/_ext/stage_pdf.py
	$(BIN)/jupyter-book build _build/pdf/src --path-output _build/pdf --builder pdflatex

lint: $(STAMP)
	$(BIN)/ruff check attnlib attnbook tests benchmarks

clean:
	$(BIN)/attnbook clean

## remove only sweep checkpoints no run needs and leftovers of ended runs (outputs are kept)
clean-stale:
	$(BIN)/attnbook clean --stale
