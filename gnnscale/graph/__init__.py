"""Graph type, blocks, on-disk format, readers and generators."""

from gnnscale.graph.block import AdjacencySpec, Block, normalized_csr
from gnnscale.graph.graph import MASK_NAMES, Graph

__all__ = ["MASK_NAMES", "AdjacencySpec", "Block", "Graph", "normalized_csr"]
