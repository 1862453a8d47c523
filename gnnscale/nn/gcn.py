"""GCN (Kipf & Welling): ``h_v = W * sum_u d_uv h_u + b`` over the self-looped, symmetrically normalised graph."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.ops import bias_vjp, linear_vjp, spmm, spmm_t, spmm_t_add


class GCNLayer(BlockLayer):
    """GCN layer; parameters named as PyG's ``GCNConv`` (``lin.weight``, ``bias``).

    Args:
        project_first: apply ``W`` before aggregating (cheaper when ``in > out``; the same function, since the
            aggregation is linear). ``None`` picks by the dimensions. With ``False``, AGGREGATE is parameter-free
            and its output can be cached (HongTu's recomputation-caching hybrid).
    """

    sparse_backward: ClassVar[bool] = True
    has_update_vjp: ClassVar[bool] = True
    reads_by_product: ClassVar[bool] = True

    adjacency: ClassVar[AdjacencySpec] = AdjacencySpec(self_loops=True, norm="gcn")
    update_uses_dst: ClassVar[bool] = False
    output_bias: ClassVar[str | None] = "bias"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, project_first: bool | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.project_first = in_features > out_features if project_first is None else project_first
        nn.init.xavier_uniform_(self.lin.weight)

    @property
    def aggregate_has_params(self) -> bool:
        return self.project_first

    @property
    def projects_first(self) -> bool:
        return self.project_first

    def project(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        if out is None:
            return self.lin(x)
        return torch.mm(x.detach(), self.lin.weight.detach().t(), out=out)  # F.linear's product, no autograd

    def project_vjp(self, x: Tensor, grad: Tensor, input_grad: bool) -> Tensor | None:
        return linear_vjp(self.lin.weight, x, grad, input_grad)

    def propagate(self, block: Block, h: Tensor, out: Tensor | None = None) -> Tensor:
        return spmm(block, h, out)  # [num_dst, F]

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        return self.propagate(block, self.project(x_src) if self.project_first else x_src)

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        return spmm_t(block, grad_agg)  # [num_src, F_in]

    def aggregate_vjp_add(self, block: Block, grad_agg: Tensor, out: Tensor, rows: Tensor) -> None:
        spmm_t_add(block, grad_agg, out, rows)

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        out = agg if self.project_first else self.lin(agg)
        return out if self.bias is None else out + self.bias

    def update_vjp(self, agg: Tensor, x_dst: Tensor | None, grad: Tensor, agg_grad: bool,
                   dst_grad: bool) -> tuple[Tensor | None, Tensor | None]:
        del x_dst, dst_grad  # UPDATE does not read the destinations' rows
        bias_vjp(self.bias, grad)
        if self.project_first:
            return (grad if agg_grad else None), None
        return linear_vjp(self.lin.weight, agg, grad, agg_grad), None
