# The two commands a newcomer needs:
#   make up     a local Kubernetes control plane with simulated GPU nodes, and three teams sharing
#               its GPUs live (tessera up --demo); the cluster stays up until Ctrl-C
#   make test   install everything needed, lint, and run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up up-quiet test lint unit integration bench k8s-binaries proto manifests lock clean

$(STAMP): pyproject.toml
	@echo "[make] creating $(VENV) and installing Python dependencies"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

k8s-binaries:
	@echo "[make] building (or reusing) the control-plane binaries"
	@bash hack/build-k8s.sh >/dev/null

up: $(STAMP) k8s-binaries
	@$(PY) -m tessera up --demo

# The same cluster without the demo's workloads.
up-quiet: $(STAMP) k8s-binaries
	@$(PY) -m tessera up

lint: $(STAMP)
	@echo "[make] ruff (check and format)"
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@echo "[make] import contracts"
	@$(VENV)/bin/lint-imports
	@echo "[make] mypy"
	@$(VENV)/bin/mypy contract extender dra_driver tessera bench tests

unit: $(STAMP)
	@$(PY) -m pytest tests/unit -q

integration: $(STAMP) k8s-binaries
	@$(PY) -m pytest tests/integration -q

test: $(STAMP) k8s-binaries lint
	@echo "[make] pytest (unit and integration)"
	@$(PY) -m pytest -q

bench: $(STAMP) k8s-binaries
	@$(PY) -m bench $(BENCH_ARGS)

proto: $(STAMP)
	@echo "[make] regenerating dra_driver/proto"
	@bash hack/gen-proto.sh

manifests: k8s-binaries
	@echo "[make] rendering charts/tessera into manifests/install.yaml"
	@bash hack/render-manifests.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

lock: $(STAMP)
	@echo "[make] pinning the image's runtime packages into requirements-runtime.txt"
	@$(PY) hack/lock_runtime.py > requirements-runtime.txt
