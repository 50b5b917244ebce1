# Two commands set everything up on a fresh machine:
#   make quickstart   create .venv, install, pretrain -> fine-tune -> eval on data/quickstart (CPU, minutes)
#   make test         install the dev dependencies, run the checks (make lint), then the test suite (not the slow tests)
#   make test-slow    the slow tests alone (several processes, killed runs, fresh interpreters, a server, a wheel)
#   make test-all     the checks, then every test (what CI runs: .ci/run)
#   make lint         ruff (lint and format) on the whole tree, mypy on finetune/
#   make docs-check   run every shell command of README.md and docs/ as a reader would (minutes)
#   make test-flaky   the suite 5 times in fresh clones, tests in random order, on 1 and 2 workers (~35 min)
#   make bench-smoke  every benchmark with --smoke: tiny runs that check the scripts still work (NAMES="a b" for some)
#   make gpu-check    on a CUDA machine: pretraining, fine-tuning and prediction against the Trainer, bf16, all GPUs
#   make dist         the wheel and sdist a user can `pip install` into dist/, the recipes inside
# TORCH picks the torch build: the default pin is a CPU build that installs from local disk on
# the project's CI machines; on a GPU machine use e.g. `make quickstart TORCH=torch`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: install dev quickstart lint format test test-slow test-all test-flaky docs-check bench-smoke gpu-check dist clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.dev-installed: $(BIN)/python pyproject.toml  # the package and the dev tools in one resolution
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

dev: $(VENV)/.dev-installed

quickstart: install
	$(BIN)/finetune pretrain recipes/quickstart/pretrain.yaml
	$(BIN)/finetune finetune recipes/quickstart/finetune.yaml
	$(BIN)/finetune finetune recipes/quickstart/finetune.yaml model.init=random run_dir=runs/quickstart/finetune-random-init
	$(BIN)/finetune eval recipes/quickstart/eval.yaml

lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: dev  # what a contributor runs before committing: fix what ruff can, then format
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: lint
	$(BIN)/python -m pytest -q -n auto -m "not slow"  # pytest-xdist: a worker per core, a thread each (tests/conftest.py)

test-slow: dev  # the tests marked slow (pyproject.toml): processes of their own, so minutes of start-up
	$(BIN)/python -m pytest -q -n auto -m slow

test-all: lint
	$(BIN)/python -m pytest -q -n auto

test-flaky: dev  # RUNS=N for another count; each run a fresh clone of HEAD with its own .venv (tests/flaky_check.py)
	$(BIN)/python -m tests.flaky_check --runs $(or $(RUNS),5)

docs-check: dev  # README.md and docs/, top to bottom, in a temporary copy (tests/docs_check.py says what it adds)
	$(BIN)/python -m tests.docs_check

bench-smoke: dev  # bench/_harness.py's smoke_all: each script's --smoke into runs/bench-smoke-all/SCRIPT
	$(BIN)/python bench/_harness.py $(NAMES)

gpu-check: install  # on a CUDA machine: ours against the Trainer in bf16 on every GPU (bench/gpu_check.py)
	$(BIN)/python bench/gpu_check.py

dist: dev  # python -m build: an sdist, then the wheel built from it (setup.py adds the recipes as package data)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf runs .pytest_cache dist build
