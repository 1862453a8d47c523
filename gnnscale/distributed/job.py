"""What a process knows about the job it belongs to before any communication is set up: whether torch's
launcher started it, and the exit statuses ranks use. Imports nothing heavy (the launcher's parent reads it)."""

from __future__ import annotations

import os

PEER_FAILED = 3
"""Exit status of a rank that stops because another rank of its job failed (the CLI's)."""
PEER_GRACE_S = 1.0
"""Seconds a rank stopping because of a peer waits before it exits (under ``--ranks``)."""
LAUNCHED_BY = "GNNSCALE_LAUNCHER"
"""Set in the ranks ``--ranks`` starts: bad-input errors every rank finds are printed by rank 0 only."""

def launched() -> bool:
    """Whether this process is a rank of a launched job (torchrun, or ``--ranks``): torch's variables are set."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
