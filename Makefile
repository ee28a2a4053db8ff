# Two commands do everything: `make serve` and `make test`. Both set up .venv first (a no-op when
# pyproject.toml and scripts/setup.sh are unchanged since the last setup).
# Extra arguments: make serve ARGS="--port 8000"   make test ARGS="tests/radix -k tree"

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
VENV := $(ROOT)/.venv
ARGS ?=

.PHONY: setup serve test

setup:
	@bash $(ROOT)/scripts/setup.sh

serve: setup
	$(VENV)/bin/radixserve serve $(ARGS)

# No -x: CI needs every failure, not just the first. pytest-timeout bounds each test.
test: setup
	cd $(ROOT) && $(VENV)/bin/python -m pytest -q $(ARGS)
