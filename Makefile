# Thin targets; every branch of logic lives in Python (stack/, streaming/, producers/, bench/).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DURATION ?= 120
PYTEST_ARGS ?=
# `make test` runs two pytest workers, each with a test stack of its own: the unit tests and six integration modules
# on one, the other integration modules on the other (tests/conftest.py); TEST_WORKERS=0: everything in one process.
TEST_WORKERS ?= 2
CLUSTER ?=

.PHONY: install test-tools up down status run test unit integration bench profile lint secrets deploy-test soak

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed  ## what running needs: Python deps, Kafka jars, MinIO, Prometheus, Spark/Delta jars, log store (cached outside the clone)
	$(PY) -m stack install

test-tools: $(VENV)/.installed  ## install, plus what only the tests need: Docker Compose (checks the compose file), the Dockerfile linter
	$(PY) -m stack install --test-tools

up: install                  ## start Kafka, MinIO and Prometheus on loopback, create bucket, keys and topic (CLUSTER=1: + Spark master/worker)
	$(PY) -m stack up$(if $(filter 1 yes true,$(CLUSTER)), --cluster)

down:                        ## stop every service of the native stack
	@if [ -x $(PY) ]; then $(PY) -m stack down; fi

status: install              ## services, tables and stream
	$(PY) -m stack status
	$(PY) -m streaming.cli status

run: install                 ## the whole pipeline, live, then a summary (DURATION=seconds, Ctrl-C to stop early)
	$(PY) -m streaming.cli run --duration $(DURATION)

test: test-tools             ## unit + integration tests against real services started by the test setup
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

unit: test-tools
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

integration: test-tools
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

bench: install               ## benchmark against the real stack; writes bench/results/<date>.json and .md
	$(PY) -m bench

profile: install             ## where one micro-batch's time goes (Spark's event log); writes bench/results/<date>-profile.md
	$(PY) -m bench.profile

deploy-test: test-tools      ## the compose deployment for real on podman: build the images, up, faults, exact counts (installs podman if missing)
	$(PY) -m pytest tests/deploy $(PYTEST_ARGS)

soak: test-tools             ## the compose deployment 15 min at 5k events/s: lag, memory, restarts, files; writes bench/results/<date>-soak.md
	$(PY) -m bench.soak

secrets: $(VENV)/.installed  ## .env for Docker Compose: random credentials, mode 0600; FORCE=1 replaces an existing one
	$(PY) -m stack secrets --env .env $(if $(FORCE),--force)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
