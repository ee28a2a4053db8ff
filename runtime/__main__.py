"""`python -m runtime ...` is the same as the `radixserve` command."""

import sys

from tokenizer.cli import main

sys.exit(main())
