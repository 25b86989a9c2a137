# The two set-up commands of the README. Each creates or reuses .venv in the repo.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dormouse-installed

.PHONY: demo test lint venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull a CUDA build of several GB.
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	# Until the trainer lands, the demo prepares the embedded default corpus and inspects it.
	$(BIN)/dormouse inspect

lint: $(STAMP)
	$(BIN)/ruff check dormouse tests

test: lint
	$(BIN)/python -m pytest
