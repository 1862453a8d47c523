"""The task-parallel family: NeutronTask's decoupled T and P tasks on different devices (``--engine
taskparallel``).

* :mod:`~gnnscale.engines.taskparallel.engine`: :class:`TaskParallelEngine`, the order and dependencies of the
  operations.
* :mod:`~gnnscale.engines.taskparallel.tasks`: what the operations compute, and the epoch's state they share.
* :mod:`~gnnscale.engines.taskparallel.runner`: a device's thread, its row mover and what it keeps in an epoch.
* :mod:`~gnnscale.engines.taskparallel.norm`: BatchNorm over every vertex while the T tasks run subgraph by
  subgraph.
"""

from __future__ import annotations

from gnnscale.engines.taskparallel.engine import TaskParallelEngine

__all__ = ["TaskParallelEngine"]
