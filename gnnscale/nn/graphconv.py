"""GraphConv (Morris et al., PyG's ``GraphConv``): ``h_v = W_rel aggr_u h_u + b + W_root h_v``, sum or mean."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from gnnscale.nn.sage import NeighbourRootLayer


class GraphConvLayer(NeighbourRootLayer):
    """GraphConv over the graph's own edges (unweighted); parameters named as PyG's ``GraphConv`` (``lin_rel``
    with bias, ``lin_root`` without). PyG's ``GraphConv`` in a :class:`~gnnscale.nn.stack.Stack` becomes this
    layer over its own parameters (:func:`~gnnscale.nn.pyg.as_block_layer`).

    Args:
        aggr: ``add`` (PyG's default) or ``mean``.
        project_first: apply ``W_rel`` before aggregating (cheaper when ``in > out``; the same function). ``None``:
            by the dimensions.
    """

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
    def neighbour(self) -> nn.Linear:
        return self.lin_rel

    @property
    def root(self) -> nn.Linear:
        return self.lin_root
