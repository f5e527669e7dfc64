# Two commands set up and run everything on a fresh machine: `make demo` and `make test`.
# `make test-fast` is the quick loop: lint, types, the corpus and every test that needs no service.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_BUNDLE := examples/jobs/cw-rno2a/ops/rl-gsm8k-stalled
DEMO_PROBES := examples/probes/rl-gsm8k-stalled
DEMO_NOW := 2026-07-30T19:17:00Z
DEMO_OUT := build/demo

.PHONY: demo test test-fast lint typecheck system-deps venv bench clean drills corpus-eval

FASTSCAN := worker/evidence/logs/_fastscan.c
# one xdist worker more than the cores: a few fast tests wait on a socket or a child process
FAST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
FASTSCAN_STAMP := $(VENV)/.fastscan
PROMTOOL := $(VENV)/tools/usr/bin/promtool

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,iris]'
	touch $(STAMP)

## The parser's native stat-line pass, rebuilt in place whenever its source changes
## (docs/parsing.md: the polars path is the fallback when it is not importable).
$(FASTSCAN_STAMP): $(STAMP) $(FASTSCAN) setup.py
	$(BIN)/python -c 'import setuptools' 2>/dev/null || $(BIN)/pip install --quiet setuptools
	$(BIN)/python setup.py --quiet build_ext --inplace
	touch $(FASTSCAN_STAMP)

venv: $(STAMP) $(FASTSCAN_STAMP)

## Install the system services and tools the tests use when they are missing: redis-server,
## docker-compose, Debian's chromium for the browser tests (driven through Playwright with
## executable_path, never its own download), and for the deployment checks (tests/deploy) kubectl
## (Debian's kubernetes-client: kubectl 1.20, whose kustomize v2.0.3 renders deploy/k8s as v5 does)
## and promtool, taken from Debian's prometheus package into .venv/tools (installing the package
## would also start a Prometheus server).
system-deps: $(PROMTOOL)
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v kubectl >/dev/null 2>&1 || missing="$$missing kubernetes-client"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

$(PROMTOOL):
	@mkdir -p $(VENV)/tools/deb
	@cd $(VENV)/tools/deb && { apt-get download -qq prometheus 2>/dev/null \
	  || { apt-get update -qq && apt-get download -qq prometheus; }; }
	dpkg-deb -x $(VENV)/tools/deb/prometheus_*.deb $(VENV)/tools/extract
	mkdir -p $(dir $(PROMTOOL)) && mv $(VENV)/tools/extract/usr/bin/promtool $(PROMTOOL)
	rm -rf $(VENV)/tools/deb $(VENV)/tools/extract
	$(PROMTOOL) --version | head -1

## Prints the text report; writes it with the JSON and the HTML report (plots) under $(DEMO_OUT).
demo: venv
	$(BIN)/rl-health diagnose $(DEMO_BUNDLE) --probes $(DEMO_PROBES) --now $(DEMO_NOW) \
	  --out $(DEMO_OUT)
	@echo "HTML report: $(abspath $(DEMO_OUT))/report.html"

## ruff, and the rooms' import contracts (pyproject.toml [tool.importlinter], docs/architecture.md).
lint: venv
	$(BIN)/ruff check shared worker reports tests testkit bench
	$(BIN)/ruff format --check shared worker reports tests testkit bench
	$(BIN)/lint-imports --no-cache

typecheck: venv
	$(BIN)/mypy

## The verdict rules scored on the labelled corpus (docs/evaluation.md); exit 1 on any miss.
corpus-eval: venv
	$(BIN)/rl-health eval -q tests/corpus/cases

## Everything, as CI runs it (.ci/run): real services, Chromium, the slow tests.
test: venv system-deps lint typecheck corpus-eval
	$(BIN)/pytest -q

## The fast tier (a few minutes, no apt, no service): the tests not marked `integration` (a real
## service or Chromium) or `slow` (pyproject.toml), spread over the machine's cores.
test-fast: venv lint typecheck corpus-eval
	$(BIN)/pytest -q -n $(FAST_WORKERS) -m "not integration and not slow"

## The long fault drills on real services (docs/reliability.md); DRILL_RUNS repeats each (3).
drills: venv system-deps
	$(BIN)/pytest -q -m drill tests/drills

bench: venv
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
	rm -f worker/evidence/logs/_fastscan*.so
