# Two commands do all the set-up on a fresh machine:
#   make up    - install, then run the gateway on its embedded default (prints base URL + demo key)
#   make test  - install what the tests need, then run every check and test
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TS_DIR := tests/e2e/ts
INFRA_DIR := infra

.PHONY: up test install lint typecheck pytest bench bench-guard layers clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required"'
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(TS_DIR)/node_modules/.installed: $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(INFRA_DIR)/node_modules/.installed: $(INFRA_DIR)/package-lock.json
	cd $(INFRA_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

up: $(STAMP)
	$(BIN)/tollway up $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) $(TS_DIR)/node_modules/.installed $(INFRA_DIR)/node_modules/.installed
	$(BIN)/pytest --cov --cov-report=term:skip-covered $(PYTEST_ARGS)

test: lint typecheck pytest

# Benchmarks (not part of `make test`): make bench PROFILE=fixed-500 [ARGS="--repeat 3"]
PROFILE ?= smoke
bench: $(STAMP)
	$(BIN)/python -m bench.run $(PROFILE) --out bench/results/$(PROFILE) $(ARGS)

# Regression guard: rerun a profile and compare it with its accepted baseline (ratios to direct).
bench-guard: $(STAMP)
	$(BIN)/python -m bench.run $(PROFILE) --out bench/results/guard-$(PROFILE) $(ARGS)
	$(BIN)/python -m bench.compare bench/results/guard-$(PROFILE) --baseline bench/baselines/$(PROFILE).json

# Lambda layers (deps + core zips, reproducible): make layers [ARGS="--only core"]
layers: $(STAMP)
	$(BIN)/python -m layers.build $(ARGS)

clean:
	rm -rf $(VENV) $(TS_DIR)/node_modules $(INFRA_DIR)/node_modules .pytest_cache .mypy_cache .ruff_cache
