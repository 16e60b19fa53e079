# Two commands do all the set-up on a fresh machine:
#   make up    - install, then run the gateway on its embedded default (prints base URL + demo key)
#   make test  - install what the tests need, then run every check and test
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TS_DIR := tests/e2e/ts

.PHONY: up test install lint typecheck pytest clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required"'
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(TS_DIR)/node_modules/.installed: $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

up: $(STAMP)
	$(BIN)/tollway up $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) $(TS_DIR)/node_modules/.installed
	$(BIN)/pytest --cov --cov-report=term:skip-covered $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) $(TS_DIR)/node_modules .pytest_cache .mypy_cache .ruff_cache
