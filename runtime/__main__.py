"""`python -m runtime ...` is the same as the `radixserve` command."""

import sys

from runtime.cli import main

sys.exit(main())
