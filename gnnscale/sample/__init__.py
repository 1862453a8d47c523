"""Mini-batch sampling: k-hop uniform neighbour sampling into per-layer blocks."""

from gnnscale.sample.neighbor import CSRTopology, Topology, sample_blocks

__all__ = ["CSRTopology", "Topology", "sample_blocks"]
