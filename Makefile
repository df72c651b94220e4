PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test lint typecheck unit venv bench clean dev-cluster image

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

# kube-apiserver and etcd for tests/e2e (and kube-apiserver 1.30, 1.34 and 1.37 for its
# version matrix, tests/e2e/test_versions.py), Helm 4 and 3 for the chart's tests and promtool for
# its alerting rules, the loopback node's kubelet, kube-scheduler, containerd, runc and NVIDIA
# runtime for tests/nodeharness (hack/build-nodebin; runc needs libseccomp-dev), built from Go
# modules and cached (seconds when cached); the image's wheel with the compiled core
# for tests/core/test_native.py (hack/build-native, a C compiler, about a minute after
# an edit). Without Go or a compiler those tests say they are skipped; in CI they fail.
unit: venv
	GPUSHARE_TESTBIN="$$(command -v go >/dev/null && hack/build-testbin | tail -1)" \
	GPUSHARE_TESTBIN_1_30="$$(command -v go >/dev/null && hack/build-testbin 1.30 | tail -1)" \
	GPUSHARE_TESTBIN_1_34="$$(command -v go >/dev/null && hack/build-testbin 1.34 | tail -1)" \
	GPUSHARE_TESTBIN_1_37="$$(command -v go >/dev/null && hack/build-testbin 1.37 | tail -1)" \
	GPUSHARE_HELM="$$(command -v go >/dev/null && hack/build-helm | tail -1)" \
	GPUSHARE_HELM3="$$(command -v go >/dev/null && hack/build-helm 3 | tail -1)" \
	GPUSHARE_PROMTOOL="$$(command -v go >/dev/null && hack/build-promtool | tail -1)" \
	GPUSHARE_NODEBIN="$$(command -v go >/dev/null && hack/build-nodebin | tail -1)" \
	GPUSHARE_NATIVE="$$(command -v cc >/dev/null && PYTHON=$(BIN)/python hack/build-native | tail -1)" \
	$(BIN)/pytest

test: lint typecheck unit

# etcd, kube-apiserver and the webhook on loopback until Ctrl-C (hack/dev-cluster). The
# first run builds the control plane (minutes, with progress lines; cached after) unless
# GPUSHARE_TESTBIN names it. Options go in ARGS: make dev-cluster ARGS='--policy FILE'
DEV_KUBECONFIG ?= /tmp/gpushare-dev.kubeconfig

dev-cluster: venv
	$(if $(GPUSHARE_TESTBIN),,hack/build-testbin >/dev/null)
	VENV=$(abspath $(VENV)) hack/dev-cluster --kubeconfig $(DEV_KUBECONFIG) $(ARGS)

# The image, with docker or podman (hack/build-image); without either it prints the
# command to run where one works and fails. IMAGE=... sets the tag.
image:
	hack/build-image

bench: venv
	$(BIN)/python bench/core.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
