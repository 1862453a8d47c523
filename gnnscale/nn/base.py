"""The layer contract: AGGREGATE over a block, then UPDATE (HongTu Eq. 1)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from gnnscale.graph.block import AdjacencySpec, Block


class BlockLayer(nn.Module):
    """A GNN layer written as ``update(aggregate(block, x_src), x_dst)``.

    Engines may call the two halves separately: a chunked engine aggregates one destination chunk at a time, and
    a layer whose aggregation has no trainable per-edge computation (``edge_compute = False``) can have its
    aggregate output cached instead of recomputed in backward (HongTu §4.2).
    """

    edge_compute: ClassVar[bool] = False
    """True when AGGREGATE has trainable per-edge computation (GAT): caching it costs O(|E|), so recompute."""
    adjacency: ClassVar[AdjacencySpec] = AdjacencySpec()
    """The normalised adjacency the layer aggregates over; engines build blocks from it."""

    in_features: int
    out_features: int

    @property
    def aggregate_has_params(self) -> bool:
        """True when AGGREGATE itself uses parameters (projection before aggregation, attention)."""
        return self.edge_compute

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        """``[num_src, F_in] -> [num_dst, F_agg]``: combine each destination's in-neighbour rows."""
        raise NotImplementedError

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        """``([num_dst, F_agg], [num_dst, F_in]) -> [num_dst, F_out]``: the per-vertex transformation."""
        raise NotImplementedError

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        return self.update(self.aggregate(block, x_src), x_src[: block.num_dst])

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"
