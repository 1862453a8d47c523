"""Layers agree with PyG; aggregation never materialises per-edge feature rows; dropout is chunk-invariant."""

from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pygnn
from torch.utils._python_dispatch import TorchDispatchMode

from gnnscale.graph import Block
from gnnscale.graph.generators import csbm
from gnnscale.nn import GATLayer, GCNLayer, GINLayer, SAGELayer, build_model, keyed_dropout, mix_key
from gnnscale.testing import tiny_graph, with_device


def _pair(kind: str, fin: int, fout: int, project_first: bool | None):
    """(ours, PyG's) with identical weights."""
    if kind == "gcn":
        ours = GCNLayer(fin, fout, project_first=project_first)
        ref = pygnn.GCNConv(fin, fout)
    elif kind == "sage":
        ours = SAGELayer(fin, fout, project_first=project_first)
        ref = pygnn.SAGEConv(fin, fout, aggr="mean")
    elif kind == "gat":
        ours = GATLayer(fin, fout, heads=3)
        ref = pygnn.GATConv(fin, fout, heads=3)
    else:
        ours = GINLayer(fin, fout)
        ref = pygnn.GINConv(
            torch.nn.Sequential(torch.nn.Linear(fin, fout), torch.nn.ReLU(), torch.nn.Linear(fout, fout))
        )
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        pyg_name = name.replace("mlp.", "nn.") if kind == "gin" else name
        assert ref_params[pyg_name].shape == p.shape, name
        with torch.no_grad():
            ref_params[pyg_name].copy_(torch.randn_like(p) * 0.3)
            p.copy_(ref_params[pyg_name])
    return ours, ref


@with_device
@pytest.mark.parametrize(
    ("kind", "project_first"),
    [("gcn", False), ("gcn", True), ("sage", False), ("sage", True), ("gat", None), ("gin", None)],
)
def test_layer_matches_pyg(kind: str, project_first: bool | None, device: str) -> None:
    g = csbm(nodes=300, classes=3, avg_degree=6, features=12, seed=1)
    torch.manual_seed(0)
    ours, ref = _pair(kind, 12, 8, project_first)
    ours, ref = ours.to(device), ref.to(device)
    block = Block.from_graph(g, ours.adjacency).to(device)
    x1 = g.x.to(device).requires_grad_()
    x2 = g.x.to(device).requires_grad_()
    out1 = ours(block, x1)
    out2 = ref(x2, g.edge_index().to(device))
    torch.testing.assert_close(out1, out2, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out1)
    out1.backward(grad_out)
    out2.backward(grad_out)
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        q = ref_params[name.replace("mlp.", "nn.") if kind == "gin" else name]
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=f"grad of {name}")


class _ShapeLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self.shapes.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("project_first", [False, True])
def test_aggregation_never_builds_edge_rows(kind: str, project_first: bool) -> None:
    """Every tensor produced in forward and backward is checked: none has one row per edge and F columns."""
    g = csbm(nodes=200, classes=3, avg_degree=8, features=16, seed=2)
    layer = {"gcn": GCNLayer, "sage": SAGELayer, "gin": GINLayer}[kind](16, 16)
    if kind != "gin":
        layer.project_first = project_first
    block = Block.from_graph(g, layer.adjacency)
    block.adj(), block.adj_t(), block.dst_index()  # build caches outside the log
    x = g.x.clone().requires_grad_()
    with _ShapeLog() as log:
        layer(block, x).sum().backward()
    per_edge = [(f, s) for f, s in log.shapes if len(s) >= 2 and s[0] == block.num_edges]
    assert log.shapes and not per_edge, per_edge


def test_gat_softmax_sums_to_one_per_destination() -> None:
    g = tiny_graph()
    layer = GATLayer(3, 1, heads=2, concat=False)
    block = Block.from_graph(g, layer.adjacency)
    with torch.no_grad():
        layer.lin.weight.copy_(torch.tensor([[1.0, 0, 0], [1.0, 0, 0]]))
        layer.att_src.zero_()
        layer.att_dst.zero_()
    out = layer.aggregate(block, g.x)  # zero attention logits: uniform weights, i.e. the mean over in-edges
    ind, ptr = block.indices, block.indptr
    expect = torch.stack([g.x[ind[ptr[v] : ptr[v + 1]], 0].mean() for v in range(g.num_nodes)])
    torch.testing.assert_close(out[:, 0], expect)


def test_keyed_dropout_is_chunk_invariant() -> None:
    x = torch.randn(1000, 32)
    ids = torch.arange(1000)
    key = mix_key(0, 3, 1)
    full = keyed_dropout(x, 0.5, key, ids)
    perm = torch.randperm(1000)[:300]
    part = keyed_dropout(x[perm], 0.5, key, ids[perm])
    assert torch.equal(full[perm], part)
    dropped = (full == 0).float().mean().item()
    assert 0.47 < dropped < 0.53
    other = keyed_dropout(x, 0.5, mix_key(0, 4, 1), ids)
    assert not torch.equal((full == 0), (other == 0))
    assert keyed_dropout(x, 0.5, None, ids) is x


def test_model_forward_deterministic_and_seeded() -> None:
    g = csbm(nodes=100, classes=3, features=8, seed=0)
    m1 = build_model("gcn", 8, 16, 3, layers=2, dropout=0.5, heads=1, seed=7)
    m2 = build_model("gcn", 8, 16, 3, layers=2, dropout=0.5, heads=1, seed=7)
    m3 = build_model("gcn", 8, 16, 3, layers=2, dropout=0.5, heads=1, seed=8)
    block = Block.from_graph(g, m1.adjacency)
    assert torch.equal(m1(block, g.x, (7, 1)), m2(block, g.x, (7, 1)))
    assert not torch.equal(m1(block, g.x, (7, 1)), m3(block, g.x, (7, 1)))
    assert not torch.equal(m1(block, g.x, (7, 1)), m1(block, g.x, (7, 2)))  # masks change with the epoch


@pytest.mark.parametrize("kind", ["gcn", "sage", "gat", "gin"])
def test_backward_is_bitwise_deterministic_with_threads(kind: str) -> None:
    """Repeated backward passes give identical gradients with 2 intra-op threads (GAT's gathers once did not)."""
    g = csbm(nodes=2000, features=16, seed=0)
    torch.manual_seed(0)
    layer = {"gcn": GCNLayer(16, 8), "sage": SAGELayer(16, 8), "gat": GATLayer(16, 4, heads=4), "gin": GINLayer(16, 8)}[
        kind
    ]
    block = Block.from_graph(g, layer.adjacency)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = []
        for _ in range(5):
            layer.zero_grad()
            x = g.x.clone().requires_grad_()
            layer(block, x).pow(2).sum().backward()
            runs.append([x.grad] + [p.grad for p in layer.parameters()])
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))
