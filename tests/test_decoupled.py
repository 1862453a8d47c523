"""The decoupled models' pieces against PyG: dgat's edge task is GATv2 attention (mixed with the mean), dgcn's
P tasks are GCN propagation."""

from __future__ import annotations

import pytest
import torch

from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.graph.generators import csbm
from gnnscale.nn.decoupled import DecoupledGNN, EdgeAttention


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return csbm(nodes=60, avg_degree=5, features=8, classes=3, seed=1)


def _block(g, m: DecoupledGNN) -> Block:  # type: ignore[no-untyped-def]
    return Block.from_graph(g, m.adjacency)


def test_edge_task_with_full_share_is_pyg_gatv2_attention(graph) -> None:  # type: ignore[no-untyped-def]
    from torch_geometric.nn import GATv2Conv

    torch.manual_seed(0)
    att = EdgeAttention(graph.num_classes, share=1.0)
    block = _block(graph, DecoupledGNN("dgat", graph.num_features, 8, graph.num_classes))
    h = torch.randn(graph.num_nodes, graph.num_classes)
    conv = GATv2Conv(graph.num_classes, graph.num_classes, heads=1, add_self_loops=False)
    with torch.no_grad():
        conv.lin_l.weight.copy_(att.lin_src.weight)
        conv.lin_l.bias.zero_()
        conv.lin_r.weight.copy_(att.lin_dst.weight)
        conv.lin_r.bias.copy_(att.lin_dst.bias)
        conv.att.copy_(att.att.view(1, 1, -1))
    edge_index = torch.stack([block.indices.long(), block.dst_index()])
    _, (ei, alpha) = conv(torch.softmax(h, -1), edge_index, return_attention_weights=True)
    assert torch.equal(ei, edge_index)
    assert torch.allclose(att(block, h), alpha.view(-1), atol=1e-6)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_edge_weights_are_a_distribution_over_in_edges(graph, share: float) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    block = _block(graph, DecoupledGNN("dgat", graph.num_features, 8, graph.num_classes))
    w = EdgeAttention(graph.num_classes, share=share)(block, torch.randn(graph.num_nodes, graph.num_classes))
    sums = torch.zeros(block.num_dst).index_add_(0, block.dst_index(), w)
    assert torch.allclose(sums, torch.ones(block.num_dst), atol=1e-6)
    deg = block.indptr[1:] - block.indptr[:-1]
    mean = 1.0 / deg.float().index_select(0, block.dst_index())
    assert torch.allclose(w, mean, atol=1e-6) == (share == 0.0)


def test_bad_share_is_refused() -> None:
    with pytest.raises(ConfigError, match="share"):
        EdgeAttention(4, share=1.5)


def test_dgcn_is_gcn_propagation_of_the_mlp_output(graph) -> None:  # type: ignore[no-untyped-def]
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    torch.manual_seed(0)
    m = DecoupledGNN("dgcn", graph.num_features, 8, graph.num_classes, num_layers=2).eval()
    out = m(_block(graph, m), graph.x)
    edge_index = torch.stack([graph.indices.long(), torch.repeat_interleave(
        torch.arange(graph.num_nodes), graph.indptr[1:] - graph.indptr[:-1])])
    ei, w = gcn_norm(edge_index, num_nodes=graph.num_nodes, add_self_loops=True)
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (graph.num_nodes, graph.num_nodes))
    h = m.layers[1].lin(torch.relu(m.layers[0].lin(graph.x)))
    want = adj @ (adj @ h)
    assert torch.allclose(out, want, atol=1e-5)
