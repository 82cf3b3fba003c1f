# vramguard — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python
# sim/: the simulators, the vramguard-sim distribution (sim/pyproject.toml; not in the product's wheel).
export PYTHONPATH := $(CURDIR)/api:$(CURDIR)/operator:$(CURDIR)/agent:$(CURDIR)/sim

.PHONY: help venv test test-unit test-e2e fuzz generate verify lint typecheck imports cycles sizes alerts cluster cluster-down demo bench clean images lock

help:
	@echo "make demo      run the whole system on a local cluster (builds it on first use)"
	@echo "make test      unit + end-to-end tests (builds the local cluster on first use)"
	@echo "make verify    generated files, lint, types, import layers, import circles and sizes"
	@echo "make cluster   start the local cluster; make cluster-down removes it"
	@echo "make bench     benchmarks: figures printed and written to bench-results.json"
	@echo "make images    build vramguard/operator and vramguard/agent without a daemon (WITH_SIM=1: the test agent)"
	@echo "make lock      refresh images/constraints.txt, the versions the images install"
	@echo "make fuzz      hostile budgets, policies, reports and annotations: 10,000 inputs per kind"

$(VENV)/.installed: pyproject.toml sim/pyproject.toml
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./sim
	touch $@

venv: $(VENV)/.installed

# The e2e tests run the images on the real node (tests/e2e/test_shipped_e2e.py);
# where they cannot be built those tests skip, saying why.
IMAGES_FOR_TESTS = hack/images/build.sh --with-sim || echo "images: not built; the as-shipped tests will skip"

test: venv
	hack/cluster/build.sh
	$(IMAGES_FOR_TESTS)
	$(PYTHON) -m pytest -m "not benchmark" tests

test-unit: venv
	$(PYTHON) -m pytest -m "not e2e and not benchmark" tests

test-e2e: venv
	hack/cluster/build.sh
	$(IMAGES_FOR_TESTS)
	$(PYTHON) -m pytest -m e2e tests

# Property tests on hostile input (tests/unit/fuzz): 10,000 inputs per kind (the
# unit suite runs 300). Prints, per kind, the inputs run, the exceptions that
# escaped and the canary differences, and writes them to fuzz-results.json.
fuzz: venv
	VRAMGUARD_FUZZ_EXAMPLES=$${VRAMGUARD_FUZZ_EXAMPLES:-10000} VRAMGUARD_FUZZ_RESULTS=fuzz-results.json \
		$(PYTHON) -m pytest -m fuzz -q -p no:cacheprovider tests/unit/fuzz

generate: venv
	$(PYTHON) -m vramguard_api.crdgen crds
	@# The Helm chart ships a copy of the CRDs (docs/install.md, "Upgrade").
	rm -f charts/vramguard/crds/*.yaml && cp crds/*.yaml charts/vramguard/crds/

# The size rule (hack/sizes.py --check): a module over ~400 lines or a function over ~60
# is named as a warning; over ~700 or ~80 fails. No import circle (hack/cycles.py).
verify: venv lint typecheck imports cycles alerts
	$(PYTHON) -m vramguard_api.crdgen --check crds
	diff -r crds charts/vramguard/crds || { echo "charts/vramguard/crds differs from crds/: run make generate" >&2; exit 1; }
	$(PYTHON) hack/sizes.py --check

lint: venv
	$(BIN)/ruff check api operator agent sim tests hack

typecheck: venv
	$(BIN)/mypy

# The layer contracts in pyproject.toml ([tool.importlinter]).
imports: venv
	$(BIN)/lint-imports

# No import circle among the product's modules, type-only imports included (grimp).
cycles: venv
	$(PYTHON) hack/cycles.py

# promtool over the chart's alert rules and the dashboard's queries, and the rules' unit
# tests (tests/promtool); promtool and helm are built by hack/cluster/build.sh.
alerts: venv
	$(PYTHON) hack/promrules.py

# The largest modules and functions (warnings above ~400 and ~60 lines; --check fails above ~700 and ~80).
sizes: venv
	$(PYTHON) hack/sizes.py

cluster: venv
	hack/cluster/build.sh
	hack/cluster/up.sh

cluster-down:
	hack/cluster/down.sh

# The runner starts (or reuses) the cluster itself, so that it can stop one it started.
# DEMO_FLAGS: --keep (run until Ctrl-C, leave everything up), --short (the CI length).
demo: venv
	hack/cluster/build.sh
	$(PYTHON) hack/demo/run.py $(DEMO_FLAGS)

# Figures are printed and written to bench-results.json (README, "Development").
bench: venv
	$(PYTHON) -m pytest -m benchmark -s --bench-results=bench-results.json tests

# The images, from images/*.Dockerfile, with buildah (no daemon; hack/images/build.sh):
# OCI archives and sizes under ~/.cache/vramguard/images. WITH_SIM=1 adds the
# agent with the simulated backends (tag <version>-sim) that the real node runs.
images:
	hack/images/build.sh $(if $(filter 1,$(WITH_SIM)),--with-sim)

# images/constraints.txt: what pip resolves for both images' extras, pinned.
lock: venv
	$(PYTHON) hack/images/lock.py "$(PYTHON) -m pip" images/constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
