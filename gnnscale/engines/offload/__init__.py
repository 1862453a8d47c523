"""The offload family: HongTu's full-graph training with every vertex's data in host memory, chunk by chunk through
the devices (``--engine offload``).

* :mod:`~gnnscale.engines.offload.engine`: :class:`OffloadEngine`, its plan and its epoch's named loop.
* :mod:`~gnnscale.engines.offload.layers`: what each chunk computes in a layer's forward and backward passes.
* :mod:`~gnnscale.engines.offload.sweep`: one pass over the chunk schedule, loads overlapped with compute.
* :mod:`~gnnscale.engines.offload.exchange`: the transition buffers (rows loaded once, assembled per chunk).
* :mod:`~gnnscale.engines.offload.rows`: the host rows (layer inputs, gradients, projections, cached aggregates).
* :mod:`~gnnscale.engines.offload.workers`: one worker per device with its partitions, replica and row mover.
"""

from __future__ import annotations

from gnnscale.engines.offload.engine import OffloadEngine

__all__ = ["OffloadEngine"]
