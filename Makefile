PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test lint typecheck unit venv bench clean

$(BIN)/gpushare-webhook: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(BIN)/gpushare-webhook

run: venv
	$(BIN)/gpushare-webhook serve

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy

# kube-apiserver and etcd for tests/e2e, built from Go modules and cached (seconds
# when cached). Without Go the e2e suite says it is skipped; in CI it fails.
unit: venv
	GPUSHARE_TESTBIN="$$(command -v go >/dev/null && hack/build-testbin | tail -1)" $(BIN)/pytest

test: lint typecheck unit

bench: venv
	$(BIN)/python bench/core.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
