"""Graph-blind baseline: a linear layer per vertex, ignoring every edge."""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.graph.block import Block
from gnnscale.nn.base import BlockLayer


class MLPLayer(BlockLayer):
    """``h_v = W x_v + b``; AGGREGATE only selects the destination rows."""

    update_uses_dst: ClassVar[bool] = False
    output_bias: ClassVar[str | None] = "lin.bias"

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin = nn.Linear(in_features, out_features)

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        return x_src[: block.num_dst]

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        return F.pad(grad_agg, (0, 0, 0, block.num_src - block.num_dst))  # [num_src, F_in]: zero for non-dst rows

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        return self.lin(agg)
