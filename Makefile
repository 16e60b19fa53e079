# Two commands do all the set-up on a fresh machine:
#   make up    - install what running needs, then run the gateway on its embedded default (prints base URL + demo key)
#   make test  - install what the tests need, then run every check and test
# Both run on any Python that pyproject.toml's requires-python admits: PYTHON=python3.13 make test.
# The default interpreter (python3.11, else python3) has its venv in .venv; another version has its
# own, .venv-3.13 for example, since a venv made by one interpreter cannot serve another.
# Not part of make test:
#   make test-localstack - the integration tier against LocalStack (host mode, Python 3.13), DynamoDB on moto

# The minor versions of Python 3 that requires-python (">=3.X,<3.Y") admits, oldest first.
MINORS := $(shell sed -n 's/^requires-python = ">=3\.\([0-9]*\),<3\.\([0-9]*\)"$$/\1 \2/p' pyproject.toml \
	| { read lo hi && seq $$lo $$((hi - 1)); })
ifeq ($(MINORS),)
$(error cannot read requires-python = ">=3.X,<3.Y" from pyproject.toml)
endif
OLDEST := 3.$(firstword $(MINORS))
NEWER_PYTHONS := $(shell for m in $(wordlist 2,99,$(MINORS)); do echo python3.$$m; done | sort -V -r)

FIND_PYTHON := .ci/find-python
PRINT_VERSION := -c 'import sys; print("%d.%d" % sys.version_info[:2])'
DEFAULT_PYTHON := $(shell $(FIND_PYTHON) python$(OLDEST) python3)
DEFAULT_VERSION := $(if $(DEFAULT_PYTHON),$(shell '$(DEFAULT_PYTHON)' $(PRINT_VERSION)))
PYTHON ?= $(DEFAULT_PYTHON)
PY := $(shell $(FIND_PYTHON) '$(PYTHON)')
PY_VERSION := $(if $(PY),$(shell '$(PY)' $(PRINT_VERSION)))
VENV := $(if $(filter $(PY_VERSION),$(DEFAULT_VERSION)),.venv,.venv-$(PY_VERSION))
BIN := $(VENV)/bin
PIP_INSTALL := $(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e
LOCAL_STAMP := $(VENV)/.installed-local
DEV_STAMP := $(VENV)/.installed-dev
TS_DIR := tests/e2e/ts
INFRA_DIR := infra

.PHONY: up test test-newest test-localstack install install-local lint typecheck pytest pytest-newest bench bench-guard layers clean

$(VENV)/pyvenv.cfg:
	@test -n '$(PY_VERSION)' || { echo "PYTHON=$(PYTHON) does not run a Python here" >&2; exit 1; }
	@case ' $(MINORS) ' in *' $(patsubst 3.%,%,$(PY_VERSION)) '*) ;; *) \
		echo "Python $(PY_VERSION) ($(PY)) is not supported: requires-python admits 3.$(firstword $(MINORS))" \
			"to 3.$(lastword $(MINORS)); pick one with PYTHON=python3.$(lastword $(MINORS))" >&2; exit 1;; esac
	$(PY) -m venv $(VENV)

# A venv left by another interpreter (the default python3 changed) is reported, never deleted.
CHECK_VENV = @v=$$($(BIN)/python $(PRINT_VERSION) 2>/dev/null); \
	test "$$v" = '$(PY_VERSION)' || { echo "$(VENV) holds Python $${v:-that does not run}, not $(PY_VERSION):" \
		"remove it (rm -rf $(VENV)) and run make again" >&2; exit 1; }

# `local` is what `make up` runs; `dev` adds every tool of `make test`. dev includes local, so
# installing dev also brings the local stamp up to date.
$(LOCAL_STAMP): pyproject.toml constraints.txt | $(VENV)/pyvenv.cfg
	$(CHECK_VENV)
	$(PIP_INSTALL) '.[local]'
	touch $@

$(DEV_STAMP): pyproject.toml constraints.txt | $(VENV)/pyvenv.cfg
	$(CHECK_VENV)
	$(PIP_INSTALL) '.[dev]'
	touch $@ $(LOCAL_STAMP)

install-local: $(LOCAL_STAMP)
install: $(DEV_STAMP)

$(TS_DIR)/node_modules/.installed: $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(INFRA_DIR)/node_modules/.installed: $(INFRA_DIR)/package-lock.json
	cd $(INFRA_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

up: $(LOCAL_STAMP)
	$(BIN)/tollway up $(ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

pytest: $(DEV_STAMP) $(TS_DIR)/node_modules/.installed $(INFRA_DIR)/node_modules/.installed
	$(BIN)/pytest --cov --cov-report=term:skip-covered $(PYTEST_ARGS)

test: lint typecheck pytest

# The newest interpreter's tier, which CI runs after `make test`: the unit, golden and functional
# tests again (where interpreter differences show: the standard library, asyncio, the wheels), in
# that interpreter's venv; the tiers with real processes run once, under make test, to keep CI
# short. Lint and types are left out: ruff and mypy target the oldest version whatever runs them.
# A test run that collects no test fails (pytest exits with 5). NEWEST_TIER=tests runs them all.
test-newest:
	@newest=$$($(FIND_PYTHON) $(NEWER_PYTHONS)) || { \
		echo "test-newest: skipped: no Python newer than $(OLDEST) runs here (looked for $(NEWER_PYTHONS))"; exit 0; }; \
	if [ "$$("$$newest" $(PRINT_VERSION))" = '$(DEFAULT_VERSION)' ]; then \
		echo "test-newest: skipped: $$newest is the default interpreter, which make test ran"; exit 0; fi; \
	echo "test-newest: $$newest"; \
	$(MAKE) --no-print-directory PYTHON="$$newest" pytest-newest

NEWEST_TIER ?= tests/unit tests/golden tests/functional
pytest-newest: $(DEV_STAMP)
	$(BIN)/pytest $(NEWEST_TIER) $(PYTEST_ARGS)

# The integration tier against LocalStack in host mode (not part of `make test`; localstack/README.md):
# LocalStack in .venv-localstack (Python 3.13, localstack/requirements.txt) serves SQS, S3, KMS,
# Secrets Manager and EventBridge, the embedded moto server DynamoDB. Without Python 3.13 it says so
# and succeeds. PYTEST_ARGS replaces the default tests/integration.
test-localstack: $(DEV_STAMP)
	TOLLWAY_PROJECT_PYTHON=$(BIN)/python scripts/test-localstack $(PYTEST_ARGS)

# Benchmarks (not part of `make test`): make bench PROFILE=fixed-500 [ARGS="--repeat 3"]
PROFILE ?= smoke
bench: $(DEV_STAMP)
	$(BIN)/python -m bench.run $(PROFILE) --out bench/results/$(PROFILE) $(ARGS)

# Regression guard: rerun a profile and compare it with its accepted baseline (ratios to direct).
bench-guard: $(DEV_STAMP)
	$(BIN)/python -m bench.run $(PROFILE) --out bench/results/guard-$(PROFILE) $(ARGS)
	$(BIN)/python -m bench.compare bench/results/guard-$(PROFILE) --baseline bench/baselines/$(PROFILE).json

# Lambda layers (deps + core zips, reproducible): make layers [ARGS="--only core"]
layers: $(DEV_STAMP)
	$(BIN)/python -m layers.build $(ARGS)

clean:
	rm -rf .venv .venv-3.* $(TS_DIR)/node_modules $(INFRA_DIR)/node_modules .pytest_cache .mypy_cache .ruff_cache
