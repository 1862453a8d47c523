"""Mini-batch sampling: keyed k-hop uniform neighbour sampling into per-layer blocks."""

from gnnscale.sample.adjacency import SAMPLE_NORMS, SampledAdjacency, SampleNorm
from gnnscale.sample.neighbor import (
    CSRTopology,
    NeighborRequest,
    Topology,
    full_lists,
    hop_key,
    keyed_draws,
    sample_blocks,
    sample_key,
    sample_positions,
)

__all__ = ["SAMPLE_NORMS", "CSRTopology", "NeighborRequest", "SampleNorm", "SampledAdjacency", "Topology", "full_lists",
           "hop_key", "keyed_draws", "sample_blocks", "sample_key", "sample_positions"]
