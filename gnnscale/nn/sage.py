"""GraphSAGE with mean aggregation: ``h_v = W_l mean_u h_u + b + W_r h_v``."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from gnnscale.graph.block import Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.ops import bias_vjp, linear_vjp, spmm_mean, spmm_t, spmm_t_add


class SAGELayer(BlockLayer):
    """GraphSAGE-mean layer; parameters named as PyG's ``SAGEConv`` (``lin_l`` with bias, ``lin_r`` without).

    Args:
        project_first: apply ``W_l`` before the mean (cheaper when ``in > out``; same function). ``None``: auto.
    """

    sparse_backward: ClassVar[bool] = True
    has_update_vjp: ClassVar[bool] = True
    reads_by_product: ClassVar[bool] = True
    output_bias: ClassVar[str | None] = "lin_l.bias"

    def __init__(self, in_features: int, out_features: int, project_first: bool | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_l = nn.Linear(in_features, out_features, bias=True)
        self.lin_r = nn.Linear(in_features, out_features, bias=False)
        self.project_first = in_features > out_features if project_first is None else project_first

    @property
    def aggregate_has_params(self) -> bool:
        return self.project_first

    @property
    def projects_first(self) -> bool:
        return self.project_first

    def project(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        if out is None:
            return x @ self.lin_l.weight.t()  # [rows, out]
        return torch.mm(x.detach(), self.lin_l.weight.detach().t(), out=out)  # no autograd

    def project_vjp(self, x: Tensor, grad: Tensor, input_grad: bool) -> Tensor | None:
        return linear_vjp(self.lin_l.weight, x, grad, input_grad)

    def propagate(self, block: Block, h: Tensor, out: Tensor | None = None) -> Tensor:
        return spmm_mean(block, h, out)  # [num_dst, F]

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        return self.propagate(block, self.project(x_src) if self.project_first else x_src)

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        return spmm_t(block, self._by_degree(block, grad_agg))  # [num_src, F_in]

    def aggregate_vjp_add(self, block: Block, grad_agg: Tensor, out: Tensor, rows: Tensor) -> None:
        spmm_t_add(block, self._by_degree(block, grad_agg), out, rows)

    @staticmethod
    def _by_degree(block: Block, grad_agg: Tensor) -> Tensor:
        """The mean's gradient before its sum: each destination's ``grad_agg`` over its in-degree."""
        return grad_agg / block.in_degree().clamp(min=1).to(grad_agg.dtype).unsqueeze(-1)  # [num_dst, F]

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        left = agg + self.lin_l.bias if self.project_first else self.lin_l(agg)
        return left + self.lin_r(x_dst)

    def update_vjp(self, agg: Tensor, x_dst: Tensor | None, grad: Tensor, agg_grad: bool,
                   dst_grad: bool) -> tuple[Tensor | None, Tensor | None]:
        assert x_dst is not None
        dst = linear_vjp(self.lin_r.weight, x_dst, grad, dst_grad)
        bias_vjp(self.lin_l.bias, grad)
        if self.project_first:
            return (grad if agg_grad else None), dst
        return linear_vjp(self.lin_l.weight, agg, grad, agg_grad), dst
