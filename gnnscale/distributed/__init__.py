"""Distributed training on torch.distributed: the job's communication (:mod:`.comm`), micrograph schedules
(:mod:`.schedule`) and the local launcher (:mod:`.launch`). Importing this package does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gnnscale.distributed.comm import Comm

_CURRENT: list[Comm] = []
"""The comm of this process's job, once set up (the CLI names failed peers through it)."""


def current() -> Comm | None:
    """This process's :class:`~gnnscale.distributed.comm.Comm`, or ``None`` outside a distributed job."""
    return _CURRENT[-1] if _CURRENT else None
