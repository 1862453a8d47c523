"""``python -m benchmarks``: see :mod:`benchmarks.harness.cli`."""

import sys

from benchmarks.harness.cli import main

sys.exit(main())
