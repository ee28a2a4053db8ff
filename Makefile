# Two commands do everything: `make serve` and `make test`. Both set up .venv first (a no-op when
# pyproject.toml and scripts/setup.sh are unchanged since the last setup).
# Extra arguments: make serve ARGS="--port 8000"   make test ARGS="tests/radix -k tree"
# `make lint` runs only the static checks that `make test` runs first.

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
VENV := $(ROOT)/.venv
ARGS ?=

.PHONY: setup serve test lint

setup:
	@bash $(ROOT)/scripts/setup.sh

serve: setup
	$(VENV)/bin/radixserve serve $(ARGS)

# ruff, then mypy (both configured in pyproject.toml); both run even when the first fails, so one
# pass shows every finding, and any finding fails the target (and `make test` before pytest).
lint: setup
	@cd $(ROOT) && status=0; \
	echo "ruff check"; $(VENV)/bin/python -m ruff check . || status=1; \
	echo "mypy"; $(VENV)/bin/python -m mypy || status=1; \
	exit $$status

# No -x: CI needs every failure, not just the first. pytest-timeout bounds each test.
test: lint
	cd $(ROOT) && $(VENV)/bin/python -m pytest -q $(ARGS)
