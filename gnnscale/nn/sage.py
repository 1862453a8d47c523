"""GraphSAGE with mean aggregation: ``h_v = W_l mean_u h_u + b + W_r h_v``; and the shape it shares with
GraphConv (:class:`NeighbourRootLayer`): a linear map of the neighbours' aggregation plus one of the vertex's own
row."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from gnnscale.graph.block import Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.ops import bias_vjp, linear_vjp, spmm, spmm_mean, spmm_t, spmm_t_add


class NeighbourRootLayer(BlockLayer):
    """``h_v = W_n aggr_u h_u + b + W_r h_v`` with ``aggr`` a sum (``add``) or a mean: the neighbour map
    :attr:`neighbour` (with the bias) and the root map :attr:`root` (without), which subclasses name as PyG's
    convs name them.

    Args:
        project_first: apply ``W_n`` before aggregating (cheaper when ``in > out``; the same function, since the
            aggregation is linear). ``None``: by the dimensions.
    """

    sparse_backward: ClassVar[bool] = True
    has_update_vjp: ClassVar[bool] = True
    reads_by_product: ClassVar[bool] = True
    aggr: str = "mean"
    project_first: bool

    @property
    def neighbour(self) -> nn.Linear:
        raise NotImplementedError

    @property
    def root(self) -> nn.Linear:
        raise NotImplementedError

    @property
    def aggregate_has_params(self) -> bool:
        return self.project_first

    @property
    def projects_first(self) -> bool:
        return self.project_first

    def project(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        if out is None:
            return x @ self.neighbour.weight.t()  # [rows, out]
        return torch.mm(x.detach(), self.neighbour.weight.detach().t(), out=out)  # no autograd

    def project_vjp(self, x: Tensor, grad: Tensor, input_grad: bool) -> Tensor | None:
        return linear_vjp(self.neighbour.weight, x, grad, input_grad)

    def propagate(self, block: Block, h: Tensor, out: Tensor | None = None) -> Tensor:
        return spmm(block, h, out) if self.aggr == "add" else spmm_mean(block, h, out)  # [num_dst, F]

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        return self.propagate(block, self.project(x_src) if self.project_first else x_src)

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        return spmm_t(block, self._scaled(block, grad_agg))  # [num_src, F_in]

    def aggregate_vjp_add(self, block: Block, grad_agg: Tensor, out: Tensor, rows: Tensor) -> None:
        spmm_t_add(block, self._scaled(block, grad_agg), out, rows)

    def _scaled(self, block: Block, grad_agg: Tensor) -> Tensor:
        """The aggregation's gradient before its sum: as it is (``add``), or each destination's over its
        in-degree (``mean``)."""
        if self.aggr == "add":
            return grad_agg
        return grad_agg / block.in_degree().clamp(min=1).to(grad_agg.dtype).unsqueeze(-1)  # [num_dst, F]

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        bias = self.neighbour.bias
        if self.project_first:
            left = agg if bias is None else agg + bias
        else:
            left = self.neighbour(agg)
        return left + self.root(x_dst)  # type: ignore[no-any-return]

    def update_vjp(self, agg: Tensor, x_dst: Tensor | None, grad: Tensor, agg_grad: bool,
                   dst_grad: bool) -> tuple[Tensor | None, Tensor | None]:
        assert x_dst is not None
        dst = linear_vjp(self.root.weight, x_dst, grad, dst_grad)
        bias_vjp(self.neighbour.bias, grad)
        if self.project_first:
            return (grad if agg_grad else None), dst
        return linear_vjp(self.neighbour.weight, agg, grad, agg_grad), dst


class SAGELayer(NeighbourRootLayer):
    """GraphSAGE-mean layer; parameters named as PyG's ``SAGEConv`` (``lin_l`` with bias, ``lin_r`` without).

    Args:
        project_first: apply ``W_l`` before the mean (cheaper when ``in > out``; same function). ``None``: auto.
    """

    output_bias: ClassVar[str | None] = "lin_l.bias"

    def __init__(self, in_features: int, out_features: int, project_first: bool | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.lin_l = nn.Linear(in_features, out_features, bias=True)
        self.lin_r = nn.Linear(in_features, out_features, bias=False)
        self.project_first = in_features > out_features if project_first is None else project_first

    @property
    def neighbour(self) -> nn.Linear:
        return self.lin_l

    @property
    def root(self) -> nn.Linear:
        return self.lin_r
