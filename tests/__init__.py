"""The test suite. `FULL_TESTS`: the long form (RADIXSERVE_FULL_TESTS=1) that CI leaves out for
time, every equivalence-grid row, more fuzz examples, the q4_0 accuracy row."""

import os

FULL_TESTS = os.environ.get("RADIXSERVE_FULL_TESTS") == "1"
