"""``python -m gnnscale``: the ``gnnscale`` command (what ``torchrun ... -m gnnscale train ...`` runs)."""


from gnnscale.cli import main
from gnnscale.distributed.comm import exit_rank

if __name__ == "__main__":
    exit_rank(main())
