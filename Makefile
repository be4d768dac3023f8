# The two commands of the README:  `make book`  and  `make test`.
# Both create .venv on first use and install the exact pins of constraints.txt.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: book test lint clean clean-stale

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[book,test]'
	touch $(STAMP)

## execute every chapter (quick profile, cached) and build the HTML site into _build/html
book: $(STAMP)
	$(BIN)/attnbook build

## lint, then the whole test suite (unit, theory vs simulation, chapters, site, browser)
test: book
	$(BIN)/ruff check attnlib tests benchmarks
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check attnlib tests benchmarks

clean:
	$(BIN)/attnbook clean

## remove only sweep checkpoints no run needs and leftovers of ended runs (outputs are kept)
clean-stale:
	$(BIN)/attnbook clean --stale
