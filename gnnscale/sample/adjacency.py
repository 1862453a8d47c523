"""What a layer aggregates over on a sampled block: its self-loops and its GCN weights.

A sampler draws neighbours from the graph's own lists (:func:`~gnnscale.graph.block.sampling_csr`: raw weights,
no self-loops when the layer adds them). :class:`SampledAdjacency` then turns each sampled block into the adjacency
the layer expects, as PyG's layers see a sampled subgraph:

- **Self-loops** (GCN, GAT): every destination gets exactly one, *outside* the fanout (a fanout of 15 keeps 15 real
  neighbours, and the vertex itself), weighted as the graph weighted its loop (else 1). GAT's softmax therefore
  runs over the sampled neighbours plus the loop, as ``GATConv`` on the sampled subgraph.
- **GCN weights** ``w_uv / sqrt(deg_u deg_v)``, ``norm``:

  - ``"sampled"`` (the default): each vertex's degree *in the sampled graph*, its sampled in-edges plus its loop,
    what PyG's ``GCNConv`` computes on a sampled subgraph (``gcn_norm``: in-degrees after
    ``add_remaining_self_loops``). A destination's degree is read off the block; a source's is the size of its own
    keyed sample at this hop (``min(d, fanout)``: the sampler's draw for a vertex depends on the vertex, never on
    the batch), so a vertex has the same weights whichever batch, trainer or rank reaches it. PyG's
    ``NeighborLoader`` differs in one place: vertices of its outermost hop are never expanded and keep degree 1;
    here every vertex has the degree its sample gives it. On weighted lists a source with more in-edges than the
    fanout weighs ``fanout / d`` of its weighted degree (the expectation; a destination's is exact).
  - ``"graph"``: the whole graph's degrees, full-graph training's weights (the in-memory engine's).

  With fanout ``-1`` the two agree and a sampled step is exactly full-graph training on the batch's seeds; exact
  layer-wise inference (the sampled engines' evaluation) always uses ``"graph"``.

SAGE's mean and GIN's sum read nothing but the sampled in-edges, so neither choice changes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import Tensor

from gnnscale.graph.block import AdjacencySpec, Block, gcn_weights, sampling_csr
from gnnscale.graph.csr import csr_rows
from gnnscale.graph.graph import Graph

SampleNorm = Literal["sampled", "graph"]
SAMPLE_NORMS: tuple[SampleNorm, ...] = ("sampled", "graph")


@dataclass(eq=False)
class SampledAdjacency:
    """Self-loops and GCN weights of sampled blocks (see the module docstring).

    Args:
        spec: the layers' adjacency (:attr:`gnnscale.nn.GNN.adjacency`).
        norm: ``"sampled"`` or ``"graph"``: whose degrees GCN's weights read.
        count: ``[N]`` int64 in-neighbours of each vertex in the lists the sampler draws from.
        weighted: ``[N]`` the sum of those lists' weights (``None``: unweighted, the count).
        loop_weight: ``[N]`` the weight of each vertex's loop, ``None`` for ones.
    """

    spec: AdjacencySpec
    norm: SampleNorm = "sampled"
    count: Tensor | None = None
    weighted: Tensor | None = None
    loop_weight: Tensor | None = None
    _on: dict[tuple[str, torch.device], Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.norm not in SAMPLE_NORMS:
            raise ValueError(f"sample norm must be one of {', '.join(SAMPLE_NORMS)}, got {self.norm!r}")
        if self.spec.norm == "gcn" and self.count is None:
            raise ValueError("GCN weights need the graph's degrees: build it with SampledAdjacency.from_graph")

    @classmethod
    def from_graph(cls, graph: Graph, spec: AdjacencySpec, norm: SampleNorm = "sampled") -> SampledAdjacency:
        """The sampled adjacency of ``spec`` on ``graph`` (with ``norm="graph"`` the weights of
        :func:`~gnnscale.graph.block.normalized_csr`)."""
        indptr, _, weight, loop_weight = sampling_csr(graph, spec)
        count = weighted = None
        if spec.norm == "gcn":
            count = indptr[1:] - indptr[:-1]
            if weight is not None:
                weighted = torch.zeros(graph.num_nodes).index_add_(0, csr_rows(indptr, weight.numel()), weight)
        return cls(spec, norm, count, weighted, loop_weight)

    def exact(self) -> SampledAdjacency:
        """This adjacency with the whole graph's weights (``norm="graph"``): exact layer-wise inference."""
        return self if self.norm == "graph" else replace(self, norm="graph", _on={})

    def _tensor(self, name: str, dev: torch.device) -> Tensor:
        key = (name, dev)
        if key not in self._on:
            t = getattr(self, name)
            assert t is not None
            self._on[key] = t.to(dev)
        return self._on[key]

    def _loops(self, ids: Tensor, dtype: torch.dtype) -> Tensor:
        """``[n]`` loop weights of the vertices ``ids``."""
        if self.loop_weight is None or not self.spec.self_loops:
            return torch.ones(ids.numel(), device=ids.device, dtype=dtype)
        return self._tensor("loop_weight", ids.device)[ids].to(dtype)

    def source_degree(self, ids: Tensor, fanout: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """``[n]`` GCN degree of vertices ``ids`` in a hop of ``fanout``: what their own keyed sample weighs (all
        ``d`` in-edges when ``d <= fanout`` or ``fanout == -1`` or ``norm == "graph"``, else ``fanout`` of them:
        for weighted lists, ``fanout / d`` of the weight), plus the loop."""
        dev = ids.device
        count = self._tensor("count", dev)[ids]
        deg = count.to(dtype) if self.weighted is None else self._tensor("weighted", dev)[ids].to(dtype)
        if self.norm == "sampled" and fanout >= 0:
            over = count > fanout
            if self.weighted is None:
                deg = torch.where(over, torch.full_like(deg, float(fanout)), deg)
            else:
                deg = torch.where(over, deg * fanout / count.clamp(min=1).to(dtype), deg)
        return deg + self._loops(ids, dtype)

    @property
    def changes_blocks(self) -> bool:
        return self.spec.self_loops or self.spec.norm == "gcn"

    def apply(self, block: Block, fanout: int = -1) -> Block:
        """``block`` as sampled with ``fanout`` (raw weights, no loops) made the layer's adjacency: loops added, GCN
        weights ``w / sqrt(deg_u deg_v)`` with each vertex's degree in the sampled graph (``"sampled"``: a
        destination's sampled in-edges here plus its loop; a source's from :meth:`source_degree`) or the whole
        graph's (``"graph"``)."""
        if not self.changes_blocks:
            return block
        if self.spec.self_loops:
            block = self._with_loops(block)
        if self.spec.norm != "gcn":
            return block
        rows = block.dst_index()
        w = block.edge_weight if block.edge_weight is not None else torch.ones(block.num_edges, device=block.device)
        ids = block.row_ids()
        if self.norm == "sampled":
            deg_dst = torch.zeros(block.num_dst, device=block.device, dtype=w.dtype).index_add_(0, rows, w)
            deg = torch.cat([deg_dst, self.source_degree(ids[block.num_dst :], fanout, w.dtype)])
        else:
            deg = self.source_degree(ids, -1, w.dtype)
        return Block(indptr=block.indptr, indices=block.indices, num_src=block.num_src,
                     edge_weight=gcn_weights(deg, block.indices.long(), rows, w), src_ids=block.src_ids)

    def _with_loops(self, block: Block) -> Block:
        """``block`` with a loop from each destination's own source row, last in its row."""
        dev = block.device
        nd, ne = block.num_dst, block.num_edges
        rows = block.dst_index()
        indptr = block.indptr + torch.arange(nd + 1, device=dev, dtype=block.indptr.dtype)
        pos = torch.arange(ne, device=dev) + rows  # each old edge moves down by the loops of the rows above
        loop_pos = indptr[1:] - 1
        indices = torch.empty(ne + nd, dtype=block.indices.dtype, device=dev)
        indices[pos] = block.indices
        indices[loop_pos] = torch.arange(nd, device=dev, dtype=block.indices.dtype)
        weight = None
        if block.edge_weight is not None or self.loop_weight is not None:
            old = block.edge_weight if block.edge_weight is not None else torch.ones(ne, device=dev)
            weight = torch.empty(ne + nd, dtype=old.dtype, device=dev)
            weight[pos] = old
            weight[loop_pos] = self._loops(block.row_ids(nd), old.dtype)
        return Block(indptr=indptr, indices=indices, num_src=block.num_src, edge_weight=weight,
                     src_ids=block.src_ids)
