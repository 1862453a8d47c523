"""``python -m gnnscale``: the ``gnnscale`` command (what ``torchrun ... -m gnnscale train ...`` runs)."""

import sys

from gnnscale.cli import main

if __name__ == "__main__":
    sys.exit(main())
