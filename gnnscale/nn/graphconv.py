"""GraphConv (Morris et al., PyG's ``GraphConv``): ``h_v = W_rel aggr_u h_u + b + W_root h_v``, sum or mean."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from gnnscale.graph.block import Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.ops import bias_vjp, linear_vjp, spmm, spmm_mean, spmm_t, spmm_t_add


class GraphConvLayer(BlockLayer):
    """GraphConv over the graph's own edges (unweighted); parameters named as PyG's ``GraphConv`` (``lin_rel``
    with bias, ``lin_root`` without). PyG's ``GraphConv`` in a :class:`~gnnscale.nn.stack.Stack` becomes this
    layer over its own parameters (:func:`~gnnscale.nn.pyg.as_block_layer`).

    Args:
        aggr: ``add`` (PyG's default) or ``mean``.
        project_first: apply ``W_rel`` before aggregating (cheaper when ``in > out``; the same function). ``None``:
            by the dimensions.
    """

    sparse_backward: ClassVar[bool] = True
    has_update_vjp: ClassVar[bool] = True
    reads_by_product: ClassVar[bool] = True
    output_bias: ClassVar[str | None] = "lin_rel.bias"

    def __init__(self, in_features: int, out_features: int, aggr: str = "add", bias: bool = True,
                 project_first: bool | None = None):
        super().__init__()
        if aggr not in ("add", "mean"):
            raise ValueError(f"GraphConvLayer aggregates by add or mean, not {aggr!r}")
        self.in_features, self.out_features, self.aggr = in_features, out_features, aggr
        self.lin_rel = nn.Linear(in_features, out_features, bias=bias)
        self.lin_root = nn.Linear(in_features, out_features, bias=False)
        self.project_first = in_features > out_features if project_first is None else project_first

    @property
    def aggregate_has_params(self) -> bool:
        return self.project_first

    @property
    def projects_first(self) -> bool:
        return self.project_first

    def project(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        if out is None:
            return x @ self.lin_rel.weight.t()
        return torch.mm(x.detach(), self.lin_rel.weight.detach().t(), out=out)

    def project_vjp(self, x: Tensor, grad: Tensor, input_grad: bool) -> Tensor | None:
        return linear_vjp(self.lin_rel.weight, x, grad, input_grad)

    def propagate(self, block: Block, h: Tensor, out: Tensor | None = None) -> Tensor:
        return spmm(block, h, out) if self.aggr == "add" else spmm_mean(block, h, out)

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        return self.propagate(block, self.project(x_src) if self.project_first else x_src)

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        return spmm_t(block, self._scaled(block, grad_agg))

    def aggregate_vjp_add(self, block: Block, grad_agg: Tensor, out: Tensor, rows: Tensor) -> None:
        spmm_t_add(block, self._scaled(block, grad_agg), out, rows)

    def _scaled(self, block: Block, grad_agg: Tensor) -> Tensor:
        """The aggregation's gradient before its sum: as it is (``add``), or over each in-degree (``mean``)."""
        if self.aggr == "add":
            return grad_agg
        return grad_agg / block.in_degree().clamp(min=1).to(grad_agg.dtype).unsqueeze(-1)

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        if self.project_first:
            left = agg if self.lin_rel.bias is None else agg + self.lin_rel.bias
        else:
            left = self.lin_rel(agg)
        return left + self.lin_root(x_dst)  # type: ignore[no-any-return]

    def update_vjp(self, agg: Tensor, x_dst: Tensor | None, grad: Tensor, agg_grad: bool,
                   dst_grad: bool) -> tuple[Tensor | None, Tensor | None]:
        assert x_dst is not None
        dst = linear_vjp(self.lin_root.weight, x_dst, grad, dst_grad)
        bias_vjp(self.lin_rel.bias, grad)
        if self.project_first:
            return (grad if agg_grad else None), dst
        return linear_vjp(self.lin_rel.weight, agg, grad, agg_grad), dst
