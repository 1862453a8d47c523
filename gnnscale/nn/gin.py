"""GIN (Xu et al.): ``h_v = MLP((1 + eps) h_v + sum_u h_u)``."""

from __future__ import annotations

from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from gnnscale.graph.block import Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.norm import make_norm
from gnnscale.nn.ops import spmm, spmm_t, spmm_t_add


class GINLayer(BlockLayer):
    """GIN layer with a two-layer MLP ``Linear -> ReLU -> Linear``; same function as PyG's ``GINConv(mlp)``.

    Args:
        norm: ``batch`` or ``layer`` puts that normalisation inside the MLP, ``Linear -> norm -> ReLU -> Linear``,
            as PyG's ``GIN(norm=...)`` model does (its ``MLP([in, out, out], norm=...)``); ``none``: none.
    """

    sparse_backward: ClassVar[bool] = True
    reads_by_product: ClassVar[bool] = True

    def __init__(self, in_features: int, out_features: int, eps: float = 0.0, train_eps: bool = False,
                 norm: str = "none"):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        inner = [] if norm == "none" else [make_norm(norm, out_features)]
        self.mlp = nn.Sequential(
            nn.Linear(in_features, out_features), *inner, nn.ReLU(), nn.Linear(out_features, out_features)
        )
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([eps]))
        else:
            self.register_buffer("eps", torch.tensor([eps]))

    def biases_before_norm(self, followed_by_batch_norm: bool) -> list[nn.Parameter]:
        first, last = cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[-1])
        inner = [first.bias] if isinstance(self.mlp[1], nn.BatchNorm1d) else []  # Linear -> BatchNorm inside
        return inner + ([last.bias] if followed_by_batch_norm else [])

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        return spmm(block, x_src)  # [num_dst, in]

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        return spmm_t(block, grad_agg)  # [num_src, F_in]

    def aggregate_vjp_add(self, block: Block, grad_agg: Tensor, out: Tensor, rows: Tensor) -> None:
        spmm_t_add(block, grad_agg, out, rows)

    def workspace_bytes(self, num_src: int, num_dst: int, num_edges: int) -> int:
        # the MLP keeps its hidden activation, the ReLU output and their gradients per destination
        return super().workspace_bytes(num_src, num_dst, num_edges) + 4 * 6 * num_dst * self.out_features

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        return self.mlp((1 + self.eps) * x_dst + agg)
