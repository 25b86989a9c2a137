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

# The main job: train the nano preset on the embedded default corpus for a few minutes on the CPU,
# then continue a prompt with its best checkpoint. A fixed number of steps (not a time budget), so the
# result on a given machine does not depend on its speed: the README quotes what it gave here. The demo
# reads less than one pass of its corpus, so the Engram memory, which wins where its tables cannot
# memorise the corpus, is on, and so is the Sinkhorn optimizer, which wins on top of it there (docs/arms.md).
DEMO_TIME := $(shell date +%Y%m%d-%H%M%S)
DEMO_RUN ?= runs/demo-$(DEMO_TIME)
demo: $(STAMP)
	$(BIN)/dormouse train --preset nano --steps 800 --warmup-steps 40 --eval-every 200 \
		--eval-bytes 65536 --engram --opt sinkhorn --sinkhorn-lr-scale 0.1 --out $(DEMO_RUN)
	$(BIN)/dormouse generate $(DEMO_RUN) --prompt "def main(" --max-bytes 200 --temperature 0.7

lint: $(STAMP)
	$(BIN)/ruff check dormouse tests benches
	$(BIN)/ruff format --check dormouse tests benches

test: lint
	$(BIN)/python -m pytest
