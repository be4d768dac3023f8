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
## On two or more cores chapter 3 (the longest) executes beside the others, one after the other,
## each with one thread (OMP_NUM_THREADS=1: two multi-threaded kernels on two cores slow each
## other down many times over; the quick chapters are small enough for one core), and chapter 3
## in this process (--scheduler serial: on its own it would start one Dask worker per core). The execution
## records are written under a lock; `attnbook build` then renders the site and executes whatever
## is still not current.
LONG   := 03-positional-semantic
OTHERS := 00-attention 01-random-features 02-provable-mha 04-attention-paths
book: $(STAMP)
	@if [ "$$(nproc)" -ge 2 ]; then \
	  OMP_NUM_THREADS=1 $(BIN)/attnbook run $(LONG) --scheduler serial & long=$$!; \
	  rest=0; for c in $(OTHERS); do OMP_NUM_THREADS=1 $(BIN)/attnbook run $$c || rest=1; done; \
	  wait $$long || rest=1; \
	  if [ $$rest -ne 0 ]; then echo "a chapter failed: see its log above"; exit 1; fi; \
	fi
	$(BIN)/attnbook build

## lint, then the whole test suite (unit, theory vs simulation, chapters, site, browser).
## On two or more cores pytest-xdist runs it on two workers, one test file each at a time
## (--dist loadfile: a file's module fixtures, e.g. the student edition, are built once), each
## worker with one thread; TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell [ "$$(nproc)" -ge 2 ] && echo 2 || echo 0)
test: book
	$(BIN)/ruff check attnlib tests benchmarks
	$(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

## every chapter notebook (chapters/*.ipynb) executed in a fresh venv from attnlib's wheel, the way
## Colab runs it (the whole quick profile of each chapter; `make test` runs chapter 0 only)
test-colab: $(STAMP)
	ATTNBOOK_TEST_COLAB=all $(BIN)/python -m pytest tests/test_colab.py

## the book as a PDF through Jupyter Book's LaTeX builder (XeLaTeX): needs TeX Live, e.g. on Debian
## `apt-get install texlive-xetex texlive-latex-extra texlive-fonts-recommended latexmk fonts-freefont-otf`;
## not part of CI. Staged apart from the site (_build/pdf/src); the PDF is _build/pdf/_build/latex/book.pdf
pdf: book
	$(BIN)/python book/_ext/stage_pdf.py
	$(BIN)/jupyter-book build _build/pdf/src --path-output _build/pdf --builder pdflatex

lint: $(STAMP)
	$(BIN)/ruff check attnlib tests benchmarks

clean:
	$(BIN)/attnbook clean

## remove only sweep checkpoints no run needs and leftovers of ended runs (outputs are kept)
clean-stale:
	$(BIN)/attnbook clean --stale
