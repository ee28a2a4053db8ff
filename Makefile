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
# After the whole suite (no ARGS), scripts/test_avx2.sh reruns the C++ kernels' tests on an
# AVX2-only CPU under qemu (EPYC-Rome), with the kernels' x86-64-v3 build.
# ruff runs first (a tenth of a second); mypy runs beside pytest rather than before it: from a
# fresh clone (every CI run) it takes about 50 s of one core, and beside the tests, at a lower
# priority, it costs the run far less. Its findings print after the tests and fail the target
# like a failed test does. The kernels' x86-64-v3 build that scripts/test_avx2.sh needs (about
# 45 s of both cores) is made beside pytest too, in its own folder, which no test builds into;
# the script finds it done (or builds what is missing).
test: setup
	@cd $(ROOT) && status=0; \
	echo "ruff check"; $(VENV)/bin/python -m ruff check . || status=1; \
	types=$$(mktemp); (nice -n 10 $(VENV)/bin/python -m mypy >$$types 2>&1) & mypy_pid=$$!; \
	if [ -z "$(ARGS)" ]; then (PYTHONPATH=$(ROOT) RADIXSERVE_CPU_KERNELS_MARCH=x86-64-v3 nice -n 10 \
		$(VENV)/bin/python -m runtime.execution.cpu_kernels build >/dev/null 2>&1 || true) & fi; avx2_pid=$$!; \
	$(VENV)/bin/python -m pytest -q $(ARGS) || status=1; \
	if [ -z "$(ARGS)" ]; then wait $$avx2_pid; echo "the C++ kernels on an AVX2-only CPU (qemu EPYC-Rome)"; \
		bash scripts/test_avx2.sh || status=1; fi; \
	echo "mypy (ran beside the tests)"; wait $$mypy_pid || status=1; cat $$types; rm -f $$types; \
	exit $$status
