# The two commands a newcomer needs:
#   make up     a local Kubernetes control plane with simulated GPU nodes, and three teams sharing
#               its GPUs live (tessera up --demo); the cluster stays up until Ctrl-C
#   make test   install everything needed, lint, and run the whole test suite
# Each step prints one line; what its tools print (pip, setuptools, Go's module downloads) goes to
# a log under build/logs/ that the line names, and is shown only when the step fails.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOGS := build/logs

.DEFAULT_GOAL := help
.PHONY: help up up-quiet test lint unit integration bench k8s-binaries proto manifests lock clean release chart

help:
	@echo "make up      a local control plane with simulated GPU nodes and three teams sharing them (until Ctrl-C)"
	@echo "make test    venv, control-plane binaries, lint, and the whole test suite (what CI runs)"
	@echo "make release the image (an OCI archive, built without a container daemon) and the chart, into dist/"
	@echo "other targets: up-quiet lint unit integration bench manifests proto lock chart clean"

$(STAMP): pyproject.toml
	@echo "[make] Python dependencies into $(VENV) (log: $(LOGS)/python-deps.log)"
	@bash hack/require.sh python $(PYTHON)
	@bash hack/logged.sh $(LOGS)/python-deps.log '' \
	  bash -c 'set -e; test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	    $(PY) -m pip install --upgrade pip; $(PY) -m pip install -e ".[dev]"'
	@touch $(STAMP)

# Shown: which binary is built (a cold build takes minutes) and any [make] message (Go too old).
k8s-binaries:
	@echo "[make] control-plane binaries, built once into ~/.cache/tessera (log: $(LOGS)/k8s-binaries.log)"
	@bash hack/logged.sh $(LOGS)/k8s-binaries.log '^\[(build-k8s\] [a-z-]+: (building|built)|make\])' \
	  bash hack/build-k8s.sh

up: $(STAMP) k8s-binaries
	@$(PY) -m tessera up --demo

# The same cluster without the demo's workloads.
up-quiet: $(STAMP) k8s-binaries
	@$(PY) -m tessera up

# Quiet when clean: ruff -q prints only what it finds; import-linter's banner and list of kept
# contracts go to a log, shown when a contract is broken.
lint: $(STAMP)
	@echo "[make] ruff (check and format)"
	@$(VENV)/bin/ruff check -q .
	@$(VENV)/bin/ruff format --check -q .
	@echo "[make] import contracts (log: $(LOGS)/import-contracts.log)"
	@bash hack/logged.sh $(LOGS)/import-contracts.log '' $(VENV)/bin/lint-imports
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

# The chart packaged into dist/, pinned to the image of dist/image-digest when there is one.
define package_chart
	@echo "[make] chart into dist/ (log: $(LOGS)/chart.log)"
	@bash hack/logged.sh $(LOGS)/chart.log '^Successfully packaged' bash hack/package-chart.sh dist
endef

# The image as an OCI layout and archive (tessera.dev.image: debootstrap, chroot, the host's pip;
# root), then the chart pinned to its digest. docs/install.md says how to push and install them.
release: $(STAMP) k8s-binaries
	@echo "[make] image into dist/ (log: $(LOGS)/image.log)"
	@rm -f dist/image-digest
	@bash hack/logged.sh $(LOGS)/image.log '^\[image\]' $(PY) -m tessera.dev.image --out dist --log $(LOGS)/image-build.log
	$(package_chart)
	@cd dist && sha256sum tessera-*.tgz tessera-*-oci.tar > SHA256SUMS && echo "[make] dist/SHA256SUMS" && cat SHA256SUMS

chart: k8s-binaries
	$(package_chart)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

lock: $(STAMP)
	@echo "[make] pinning the image's runtime packages into requirements-runtime.txt"
	@$(PY) hack/lock_runtime.py > requirements-runtime.txt
