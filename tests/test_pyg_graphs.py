"""Differential tests of graph building against PyG (the reference): Planetoid, gnn-benchmark npz, edge lists and
``Graph.from_pyg`` give PyG's edges (as sorted ``(src, dst)`` pairs, not just counts), self-loops and weights,
or the test asserts the documented difference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.io import read_npz as pyg_read_npz
from torch_geometric.io import read_planetoid_data
from torch_geometric.transforms import NormalizeFeatures
from torch_geometric.utils import to_undirected

from gnnscale.errors import GraphError
from gnnscale.graph import Graph
from gnnscale.graph.datasets import load_dataset
from gnnscale.testing import need_file


def pairs(ei: Tensor) -> list[tuple[int, int]]:
    """The edges as sorted ``(src, dst)`` pairs, multi-edges repeated."""
    return sorted(map(tuple, ei.t().tolist()))


def weighted_pairs(ei: Tensor, w: Tensor) -> list[tuple[int, int, float]]:
    return sorted((int(s), int(d), float(x)) for (s, d), x in zip(ei.t().tolist(), w.tolist(), strict=True))


def loops(ei: Tensor) -> int:
    return int((ei[0] == ei[1]).sum())


# ------------------------------------------------------------------------------------------------ Planetoid
def test_planetoid_cora_equals_pygs_reader() -> None:
    root = need_file("planetoid/ind.cora.x").parent
    ref = read_planetoid_data(str(root), "cora")
    g = load_dataset("planetoid:cora:normalize=0", root=root)
    assert g.num_nodes == ref.num_nodes == 2708
    assert pairs(g.edge_index()) == pairs(ref.edge_index) and g.num_edges == ref.num_edges == 10556
    assert loops(g.edge_index()) == loops(ref.edge_index) == 0 and g.edge_weight is None
    assert torch.equal(g.x, ref.x) and torch.equal(g.y, ref.y)
    for m in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(g, m), getattr(ref, m)), m
    normalised = load_dataset("planetoid:cora", root=root)  # the default: row-normalised, PyG's NormalizeFeatures
    torch.testing.assert_close(normalised.x, NormalizeFeatures()(ref).x)


# ------------------------------------------------------------------------------------------------------ npz
@pytest.mark.parametrize(("name", "edges", "removed"), [
    ("amazon_electronics_photo.npz", 238162, 1),  # the file lists one self-loop: PyG removes it, so do we
    ("amazon_electronics_computers.npz", 491722, 0),
])
def test_amazon_npz_equals_pygs_reader(capsys: pytest.CaptureFixture[str], name: str, edges: int,
                                       removed: int) -> None:
    f = need_file(f"gnn-benchmark/{name}")
    ref = pyg_read_npz(str(f))
    g = load_dataset(f"npz:{f}")
    assert g.num_edges == ref.num_edges == edges
    assert pairs(g.edge_index()) == pairs(ref.edge_index)
    assert loops(g.edge_index()) == loops(ref.edge_index) == 0 and g.edge_weight is None
    assert torch.equal(g.x, ref.x) and torch.equal(g.y, ref.y)
    err = capsys.readouterr().err
    assert (err == f"note: {name}: removed 1 self-loop, as PyG's read_npz does (self_loops=1 keeps them)\n"
            if removed else err == ""), err
    if removed:
        assert load_dataset(f"npz:{f}:self_loops=1").num_edges == edges + removed


def _write_npz(path: Path, rows: list[int], cols: list[int], n: int = 4) -> None:
    adj = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, n))
    attr = sp.csr_matrix(np.eye(n, 3, dtype=np.float32))
    np.savez(path, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr, adj_shape=adj.shape,
             attr_data=attr.data, attr_indices=attr.indices, attr_indptr=attr.indptr, attr_shape=attr.shape,
             labels=np.array([0, 1, 0, 1]))


def test_tiny_npz_against_pyg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A self-loop is removed as PyG does; a repeated entry is the documented difference: a multi-edge unless
    ``coalesce=1`` (PyG's ``to_undirected`` merges it)."""
    f = tmp_path / "t.npz"
    _write_npz(f, [0, 1, 2, 2], [1, 2, 2, 3])  # 0-1, 1-2, a self-loop at 2, 2-3
    ref = pyg_read_npz(str(f))
    g = load_dataset(f"npz:{f}:train_per_class=1,val_per_class=0")
    assert pairs(g.edge_index()) == pairs(ref.edge_index) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)]
    assert "removed 1 self-loop" in capsys.readouterr().err
    kept = load_dataset(f"npz:{f}:train_per_class=1,val_per_class=0,self_loops=1")
    assert pairs(kept.edge_index()) == sorted([*pairs(ref.edge_index), (2, 2)])
    indptr = np.array([0, 2, 3, 3, 3])  # row 0 lists 0->1 twice
    np.savez(f, adj_data=np.ones(3, np.float32), adj_indices=np.array([1, 1, 2]), adj_indptr=indptr,
             adj_shape=np.array([4, 4]), attr_data=np.ones(4, np.float32), attr_indices=np.zeros(4, np.int64),
             attr_indptr=np.arange(5), attr_shape=np.array([4, 1]), labels=np.array([0, 1, 0, 1]))
    ref = pyg_read_npz(str(f))
    multi = load_dataset(f"npz:{f}:train_per_class=1,val_per_class=0")
    assert pairs(ref.edge_index) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert pairs(multi.edge_index()) == [(0, 1), (0, 1), (1, 0), (1, 0), (1, 2), (2, 1)]  # documented: kept
    merged = load_dataset(f"npz:{f}:train_per_class=1,val_per_class=0,coalesce=1")
    assert pairs(merged.edge_index()) == pairs(ref.edge_index)


# ------------------------------------------------------------------------------------------------ edge lists
EDGES = "# Undirected graph (SNAP): each edge listed once\n0 1 0.5\n1 2 2\n2 0 1.5\n3 3 4\n1 0 3\n"
EI = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 0, 3, 0]])
W = torch.tensor([0.5, 2.0, 1.5, 4.0, 3.0])


def test_edgelist_against_pyg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As listed: PyG's ``edge_index`` of the same lines, whatever the header says. ``symmetrize=1``: PyG's
    ``to_undirected``; with weights, ``to_undirected(..., reduce="max")`` (documented: a pair listed both ways
    keeps the larger weight; PyG's default ``reduce="add"`` sums them, and doubles a self-loop's weight)."""
    f = tmp_path / "e.txt"
    f.write_text(EDGES)
    spec = f"edgelist:{f}:features=0,classes=0"
    g = load_dataset(spec)
    assert pairs(g.edge_index()) == pairs(EI) and g.edge_weight is None and loops(g.edge_index()) == 1
    assert "add symmetrize=1" in capsys.readouterr().err
    s = load_dataset(spec + ",symmetrize=1")
    und = to_undirected(EI, num_nodes=4)
    assert pairs(s.edge_index()) == pairs(und) and s.num_edges == und.shape[1] == 7
    assert loops(s.edge_index()) == loops(und) == 1
    w = load_dataset(spec + ",symmetrize=1,weight_column=3")
    und_max, w_max = to_undirected(EI, W, num_nodes=4, reduce="max")
    assert weighted_pairs(w.edge_index(), w.edge_weight) == weighted_pairs(und_max, w_max)
    und_add, w_add = to_undirected(EI, W, num_nodes=4)  # PyG's default: the documented difference
    ours = {(s_, d): x for s_, d, x in weighted_pairs(w.edge_index(), w.edge_weight)}
    theirs = {(s_, d): x for s_, d, x in weighted_pairs(und_add, w_add)}
    assert ours.keys() == theirs.keys()
    assert {k for k in ours if ours[k] != theirs[k]} == {(0, 1), (1, 0), (3, 3)}  # listed both ways; the loop
    assert (ours[(0, 1)], theirs[(0, 1)], ours[(3, 3)], theirs[(3, 3)]) == (3.0, 3.5, 4.0, 8.0)


def test_edgelist_duplicates_against_pyg(tmp_path: Path) -> None:
    """An edge listed twice: two edges, as in PyG's ``edge_index``; ``coalesce=1`` merges it as PyG's
    ``coalesce``/``to_undirected`` do."""
    f = tmp_path / "d.txt"
    f.write_text("0 1\n0 1\n1 2\n")
    ei = torch.tensor([[0, 0, 1], [1, 1, 2]])
    spec = f"edgelist:{f}:features=0,classes=0"
    assert pairs(load_dataset(spec).edge_index()) == pairs(ei)
    assert pairs(load_dataset(spec + ",coalesce=1,symmetrize=1").edge_index()) == pairs(to_undirected(ei))
    assert pairs(load_dataset(spec + ",symmetrize=1").edge_index()) == [(0, 1), (0, 1), (1, 0), (1, 0), (1, 2),
                                                                        (2, 1)]  # documented: multi-edges kept


# ---------------------------------------------------------------------------------------------- from_pyg
def _data(**extra: Tensor) -> Data:
    return Data(x=torch.ones(4, 2), y=torch.tensor([0, 1, 0, 1]), edge_index=EI, num_nodes=4, **extra)


@pytest.mark.parametrize("shape", [(5,), (5, 1)])
def test_from_pyg_edge_weight(capsys: pytest.CaptureFixture[str], shape: tuple[int, ...]) -> None:
    d = _data(edge_weight=W.reshape(shape))
    g = Graph.from_pyg(d)
    assert g.num_edges == d.num_edges and loops(g.edge_index()) == loops(d.edge_index) == 1
    assert weighted_pairs(g.edge_index(), g.edge_weight) == weighted_pairs(EI, W)
    assert capsys.readouterr().err == ""
    back = g.to_pyg()
    assert weighted_pairs(back.edge_index, back.edge_weight) == weighted_pairs(EI, W)


@pytest.mark.parametrize("shape", [(5,), (5, 1)])
def test_from_pyg_takes_a_one_column_edge_attr_as_weights(capsys: pytest.CaptureFixture[str],
                                                          shape: tuple[int, ...]) -> None:
    g = Graph.from_pyg(_data(edge_attr=W.reshape(shape)))
    assert weighted_pairs(g.edge_index(), g.edge_weight) == weighted_pairs(EI, W)
    err = capsys.readouterr().err
    assert err == f"note: from_pyg: the one-column edge_attr {list(shape)} is used as the edge weights\n", err


def test_from_pyg_warns_about_what_it_drops(capsys: pytest.CaptureFixture[str]) -> None:
    g = Graph.from_pyg(_data(edge_attr=torch.ones(5, 3), pos=torch.zeros(4, 3)))
    assert g.edge_weight is None and pairs(g.edge_index()) == pairs(EI)
    err = capsys.readouterr().err
    assert err == "warning: from_pyg: dropped edge_attr [5, 3] (a Graph holds one weight per edge), pos\n", err
    g = Graph.from_pyg(_data(edge_weight=W, edge_attr=torch.ones(5, 1)))
    assert weighted_pairs(g.edge_index(), g.edge_weight) == weighted_pairs(EI, W)
    assert capsys.readouterr().err == "warning: from_pyg: dropped edge_attr [5, 1] (edge_weight is used)\n"
    with pytest.raises(GraphError, match=r"edge_weight has shape \(5, 2\), expected \(5,\) or \(5, 1\)"):
        Graph.from_pyg(_data(edge_weight=torch.ones(5, 2)))
