"""What every engine family shares, below the families (docs/architecture.md): the families import it, it imports
no family.

* :mod:`~gnnscale.engines.core.base`: the :class:`Engine` interface every engine implements.
* :mod:`~gnnscale.engines.core.schema`: the training record's keys, one meaning and one unit each (docs/metrics.md).
* :mod:`~gnnscale.engines.core.chunks`: the chunk of the full-graph engines (offload, task-parallel).
* :mod:`~gnnscale.engines.core.mover`: the row mover of the chunked engines, one device's traffic counted by kind.
* :mod:`~gnnscale.engines.core.pipeline`: pipeline stages on threads joined by bounded queues (HyScale-GNN).
* :mod:`~gnnscale.engines.core.replicas`: data-parallel model replicas on several devices in one process.
* :mod:`~gnnscale.engines.core.disk_tier`: the disk tier (``--host-memory``) as every engine sets it up.
"""

from __future__ import annotations

from gnnscale.engines.core.base import Engine

__all__ = ["Engine"]
