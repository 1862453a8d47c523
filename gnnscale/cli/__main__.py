"""``python -m gnnscale.cli``: the ``gnnscale`` command."""

import sys

from gnnscale.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
