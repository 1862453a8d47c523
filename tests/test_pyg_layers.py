"""Differential tests against PyG's layers: gnnscale's GCN, SAGE, GAT and GIN layers, on the whole graph and on
sampled blocks, equal PyG's ``GCNConv``, ``SAGEConv``, ``GATConv`` and ``GINConv`` with the same weights.

On a sampled block the reference is what a PyG user gets from a sampled subgraph: the PyG layer on the block's own
``edge_index`` (SAGE, GAT, GIN), and for GCN on the sampled graph in which every source has its own keyed sample
(``gcn_norm``'s degrees are in-degrees in the sample, :mod:`gnnscale.sample.adjacency`).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

from gnnscale.graph.block import Block
from gnnscale.graph.csr import csr_rows
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.sage import SAGELayer
from gnnscale.sample import CSRTopology, SampledAdjacency, hop_key, sample_blocks, sample_positions

IN, OUT = 6, 5
MODELS = ("gcn", "sage", "gat", "gin")


def _pair(kind: str, weighted: bool = False) -> tuple[BlockLayer, torch.nn.Module]:
    """A gnnscale layer and the PyG layer holding the same weights."""
    torch.manual_seed(0)
    ours: BlockLayer
    theirs: torch.nn.Module
    if kind == "gcn":
        ours = GCNLayer(IN, OUT)
        theirs = GCNConv(IN, OUT)
        torch.nn.init.normal_(ours.bias)  # type: ignore[arg-type]
    elif kind == "sage":
        ours, theirs = SAGELayer(IN, OUT), SAGEConv(IN, OUT, aggr="mean")
    elif kind == "gat":
        ours, theirs = GATLayer(IN, 3, heads=2), GATConv(IN, 3, heads=2)
        torch.nn.init.normal_(ours.bias)
    else:
        ours = GINLayer(IN, OUT, eps=0.25)
        theirs = GINConv(torch.nn.Sequential(torch.nn.Linear(IN, OUT), torch.nn.ReLU(), torch.nn.Linear(OUT, OUT)),
                         eps=0.25)
        theirs.nn.load_state_dict(ours.mlp.state_dict())  # type: ignore[union-attr]
        return ours, theirs
    theirs.load_state_dict(ours.state_dict(), strict=False)
    for name, p in theirs.state_dict().items():
        if name in ours.state_dict():
            assert torch.equal(p, ours.state_dict()[name]), name
    return ours, theirs


def _pyg(kind: str, conv: torch.nn.Module, x: Tensor, edge_index: Tensor, weight: Tensor | None) -> Tensor:
    if kind == "gcn":
        return conv(x, edge_index, weight)
    return conv(x, edge_index)


def _edge_index(block: Block, drop_loops: bool = False) -> tuple[Tensor, Tensor | None]:
    """``[2, E]`` (local source row, destination row) of a block, and its weights."""
    src, dst = block.indices.long(), block.dst_index().long()
    keep = src != dst if drop_loops else torch.ones_like(src, dtype=torch.bool)
    w = None if block.edge_weight is None else block.edge_weight[keep]
    return torch.stack([src[keep], dst[keep]]), w


def _graph_with_loops() -> Graph:
    """csbm plus a self-loop listed twice (vertex 3), one listed once (vertex 7) and a vertex with no in-edges."""
    g = csbm(nodes=60, features=IN, avg_degree=5, seed=4)
    ei = g.edge_index()
    ei = ei[:, ei[1] != 11]  # vertex 11: no in-edges
    ei = torch.cat([ei, torch.tensor([[3, 3, 7], [3, 3, 7]])], dim=1)
    return Graph.from_edge_index(ei, g.num_nodes, x=g.x, y=g.y)


@pytest.mark.parametrize("kind,weighted", [(k, False) for k in MODELS] + [("gcn", True)])
def test_full_graph_layer_equals_pyg(kind: str, weighted: bool) -> None:
    """Whole-graph blocks (every full-graph engine's adjacency) equal the PyG layer on the graph's edge_index; a
    self-loop listed twice counts once (add_remaining_self_loops), as in PyG. Only GCN reads edge weights."""
    g = _graph_with_loops()
    if weighted:
        w = torch.rand(g.num_edges, generator=torch.Generator().manual_seed(1)) + 0.5
        g = Graph.from_edge_index(g.edge_index(), g.num_nodes, x=g.x, y=g.y, edge_weight=w)
    assert g.x is not None
    ours, theirs = _pair(kind)
    block = Block.from_graph(g, ours.adjacency)
    want = _pyg(kind, theirs, g.x, g.edge_index(), g.edge_weight)
    torch.testing.assert_close(ours(block, g.x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,weighted", [(k, False) for k in MODELS] + [("gcn", True)])
def test_a_layer_takes_pygs_call_x_and_edge_index(kind: str, weighted: bool) -> None:
    """``layer(x, edge_index[, edge_weight])``, as a PyG conv is called: the block is built from ``edge_index``
    with the layer's adjacency, so the result is the PyG layer's and the Block call's, to the bit."""
    g = _graph_with_loops()
    assert g.x is not None
    ours, theirs = _pair(kind)
    ei = g.edge_index()
    w = torch.rand(g.num_edges, generator=torch.Generator().manual_seed(1)) + 0.5 if weighted else None
    got = ours(g.x, ei) if w is None else ours(g.x, ei, w)
    torch.testing.assert_close(got, _pyg(kind, theirs, g.x, ei, w), rtol=1e-5, atol=1e-5)
    weighted_graph = Graph.from_edge_index(ei, g.num_nodes, x=g.x, edge_weight=w)
    assert torch.equal(got, ours(Block.from_graph(weighted_graph, ours.adjacency), g.x))


def test_a_layer_or_model_called_wrongly_says_what_to_pass() -> None:
    """One TypeError naming both forms, not an AttributeError from inside; edge weights for a layer that reads
    none are refused as PyG's SAGEConv refuses them."""
    g = _graph_with_loops()
    assert g.x is not None
    model = build_model("gcn", IN, 8, 3, layers=2, dropout=0.0, heads=1, seed=0)
    for call in (lambda: GCNLayer(IN, OUT)(g.x, g.x), lambda: model(g.edge_index(), g.x),
                 lambda: model(g.x.numpy(), g.edge_index())):
        with pytest.raises(TypeError, match=r"takes \(block, x\).*Block\.from_graph.*\(x, edge_index\)"):
            call()
    with pytest.raises(TypeError, match="SAGELayer takes no edge_weight"):
        SAGELayer(IN, OUT)(g.x, g.edge_index(), torch.ones(g.num_edges))


@pytest.mark.parametrize("kind", [*MODELS, "dgcn"])
def test_a_model_takes_pygs_call_x_and_edge_index(kind: str) -> None:
    """``model(x, edge_index)`` is ``model(Block.from_graph(g, model.adjacency), x)``; a third positional tensor
    is PyG's ``edge_weight`` (``BasicGNN.forward``), read by GCN's adjacency."""
    g = _graph_with_loops()
    assert g.x is not None
    model = build_model(kind, IN, 8, 3, layers=2, dropout=0.0, heads=2, seed=0).eval()
    want = model(Block.from_graph(g, model.adjacency), g.x)
    assert torch.equal(model(g.x, g.edge_index()), want)
    if kind == "gcn":
        w = torch.rand(g.num_edges, generator=torch.Generator().manual_seed(2)) + 0.5
        weighted = Graph.from_edge_index(g.edge_index(), g.num_nodes, x=g.x, edge_weight=w)
        want_w = model(Block.from_graph(weighted, model.adjacency), g.x)
        assert not torch.allclose(want_w, want)
        assert torch.equal(model(g.x, g.edge_index(), w), want_w)
        assert torch.equal(model(g.x, g.edge_index(), edge_weight=w), want_w)


def _keyed_sample(topo: CSRTopology, ids: Tensor, fanout: int, hk: int) -> tuple[Tensor, Tensor]:
    """Every vertex of ``ids`` with its own keyed sample at a hop of key ``hk``: ``(edge_index [2, E] over the
    rows ``ids`` then the new vertices, the rows' global ids)``."""
    req = topo.request(ids)
    indptr, pos = sample_positions(ids, req.degrees, fanout, hk)
    nbrs, _ = req.take(indptr, pos)
    order = torch.cat([ids, torch.unique(nbrs[~torch.isin(nbrs, ids)])])
    row = torch.empty(int(order.max()) + 1, dtype=torch.int64)
    row[order] = torch.arange(order.numel())
    return torch.stack([row[nbrs], csr_rows(indptr, nbrs.numel())]), order


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("fanouts", [(3, 2), (2, 4), (-1, 3)])
def test_sampled_block_layer_equals_pyg_on_the_sampled_subgraph(kind: str, fanouts: tuple[int, int]) -> None:
    """Both blocks of a 2-hop sample: the gnnscale layer on the block equals the PyG layer on the sampled
    subgraph (for GCN: every source with its own keyed sample at that hop, so gcn_norm sees its sampled degree)."""
    g = _graph_with_loops()
    assert g.x is not None
    ours, theirs = _pair(kind)
    topo = CSRTopology.from_graph(g, ours.adjacency)
    adjacency = SampledAdjacency.from_graph(g, ours.adjacency)
    seeds = torch.tensor([3, 7, 11, 20, 41, 0])
    for key in range(3):
        blocks = sample_blocks(topo, seeds, fanouts, key, adjacency)
        for hop, block in enumerate(reversed(blocks)):
            assert block.src_ids is not None
            x = g.x[block.src_ids]
            got = ours(block, x)
            if kind == "gcn":
                ei, rows = _keyed_sample(topo, block.src_ids, fanouts[hop], hop_key(key, hop))
                assert torch.equal(rows[: block.num_src], block.src_ids)
                want = theirs(g.x[rows], ei)[: block.num_dst]
            else:
                ei, _ = _edge_index(block, drop_loops=ours.adjacency.self_loops)  # GAT's loops: PyG adds its own
                want = theirs(x, ei)[: block.num_dst]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{kind} key {key} hop {hop}")


def test_a_sampled_gcn_equals_pyg_on_the_block_when_every_source_is_a_destination() -> None:
    """Where the block's own edge_index already holds every source's sample (all sources are destinations), the
    weights are exactly ``gcn_norm`` of the block's edge_index: no hidden global term."""
    g = _graph_with_loops()
    assert g.x is not None
    ours, theirs = _pair("gcn")
    topo = CSRTopology.from_graph(g, ours.adjacency)
    adjacency = SampledAdjacency.from_graph(g, ours.adjacency)
    everyone = torch.arange(g.num_nodes).flip(0)
    block = sample_blocks(topo, everyone, (3,), 5, adjacency)[0]
    assert block.num_src == block.num_dst
    ei, _ = _edge_index(block, drop_loops=True)
    torch.testing.assert_close(ours(block, g.x[everyone]), theirs(g.x[everyone], ei), rtol=1e-5, atol=1e-5)


def test_a_star_centre_keeps_its_loop_outside_the_fanout_and_its_weights_are_the_samples() -> None:
    """The issue's star: 10 leaves around a centre, fanout 3. Over 5 keys the centre keeps 3 real neighbours and its
    own loop (before, the loop competed for a slot), and its GCN weights are those of the sampled star (leaves of
    degree 2), summing to 3 / sqrt(4 * 2) + 1 / 4, not the full graph's tiny ones."""
    leaves = torch.arange(1, 11)
    ei = torch.cat([torch.stack([leaves, torch.zeros(10, dtype=torch.int64)]),
                    torch.stack([torch.zeros(10, dtype=torch.int64), leaves])], dim=1)
    g = Graph.from_edge_index(ei, 11, x=torch.randn(11, 4), y=torch.zeros(11, dtype=torch.int64))
    for kind in ("gcn", "gat"):
        spec = build_model(kind, 4, 8, 2, layers=1, dropout=0.0, heads=1, seed=0).adjacency
        topo = CSRTopology.from_graph(g, spec)
        adjacency = SampledAdjacency.from_graph(g, spec)
        for key in range(5):
            block = sample_blocks(topo, torch.tensor([0]), (3,), key, adjacency)[0]
            row = block.indices[: int(block.indptr[1])].tolist()
            assert len(row) == 4 and row.count(0) == 1, (kind, key, row)  # 3 leaves and the centre's own loop
            if kind == "gcn":
                assert block.edge_weight is not None
                want = 3 / (4 * 2) ** 0.5 + 1 / 4
                assert float(block.edge_weight.sum()) == pytest.approx(want, rel=1e-6)


def test_sampled_weights_do_not_depend_on_the_batch() -> None:
    """A vertex's GCN weights are the same whether it is reached alone, in a batch or by another trainer's part:
    what lets N trainers, ranks and micrographs equal one trainer on the union batch."""
    g = csbm(nodes=300, features=IN, avg_degree=8, seed=6)
    spec = GCNLayer.adjacency
    topo = CSRTopology.from_graph(g, spec)
    adjacency = SampledAdjacency.from_graph(g, spec)
    seeds = torch.tensor([5, 17, 99, 250, 3, 42])
    whole = sample_blocks(topo, seeds, (4, 3), 9, adjacency)
    for part in (seeds[:2], seeds[2:]):
        alone = sample_blocks(topo, part, (4, 3), 9, adjacency)
        for b_whole, b_part in zip(whole, alone, strict=True):
            assert b_whole.src_ids is not None and b_part.src_ids is not None
            w_whole, w_part = _weights_by_edge(b_whole), _weights_by_edge(b_part)
            for edge, w in w_part.items():
                assert w == pytest.approx(w_whole[edge], rel=1e-6), edge


def _weights_by_edge(block: Block) -> dict[tuple[int, int], float]:
    assert block.src_ids is not None and block.edge_weight is not None
    src = block.src_ids[block.indices.long()].tolist()
    dst = block.src_ids[block.dst_index().long()].tolist()
    return dict(zip(zip(src, dst, strict=True), block.edge_weight.tolist(), strict=True))


def test_graph_norm_is_the_whole_graphs_weights_at_any_fanout() -> None:
    """``--sample-norm graph``: every sampled edge carries the whole graph's weight (normalized_csr's)."""
    from gnnscale.graph.block import normalized_csr

    g = _graph_with_loops()
    spec = GCNLayer.adjacency
    indptr, indices, weight = normalized_csr(g, spec)
    assert weight is not None
    full = dict(zip(zip(indices.tolist(), csr_rows(indptr).tolist(), strict=True), weight.tolist(), strict=True))
    adjacency = SampledAdjacency.from_graph(g, spec, "graph")
    blocks = sample_blocks(CSRTopology.from_graph(g, spec), torch.tensor([3, 7, 11, 30]), (2, 2), 1, adjacency)
    for block in blocks:
        for edge, w in _weights_by_edge(block).items():
            assert w == pytest.approx(full[edge], rel=1e-5), edge
