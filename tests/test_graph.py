"""Graph construction, validation, conversion and blocks on tiny literal graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gnnscale.errors import DatasetError, GraphError
from gnnscale.graph import AdjacencySpec, Block, Graph, io, normalized_csr, stream
from gnnscale.graph.datasets import load_dataset
from gnnscale.testing import tiny_graph


def test_from_edge_index_builds_in_neighbour_csr() -> None:
    g = tiny_graph()
    assert (g.num_nodes, g.num_edges) == (6, 9)
    assert g.indptr.tolist() == [0, 2, 4, 5, 6, 9, 9]
    assert g.indices.tolist() == [1, 2, 0, 3, 2, 4, 0, 3, 4]  # sorted by (dst, src)
    assert g.in_degree().tolist() == [2, 2, 1, 1, 3, 0]
    assert g.out_degree().tolist() == [2, 1, 2, 2, 2, 0]
    st = g.stats()
    assert st["self_loops"] == 2 and st["isolated_nodes"] == 1 and st["train_mask"] == 2


def test_duplicates_kept_unless_coalesced_and_weights_sum() -> None:
    ei = torch.tensor([[0, 0, 1], [1, 1, 0]])
    g = Graph.from_edge_index(ei, 2, edge_weight=torch.tensor([1.0, 2.0, 5.0]), coalesce=True)
    assert g.num_edges == 2 and g.edge_weight.tolist() == [5.0, 3.0]
    kept = Graph.from_edge_index(ei, 2)
    assert kept.num_edges == 3 and kept.stats()["duplicate_edges"] == 1 and g.stats()["duplicate_edges"] == 0


def test_every_entry_point_keeps_multi_edges_alike(tmp_path) -> None:  # noqa: ANN001
    """0->1 three times and 1->2 once: four edges through every entry point, one through each with coalesce."""
    from torch_geometric.data import Data

    from gnnscale.graph import edgelist
    from gnnscale.graph.datasets import load_dataset

    ei = torch.tensor([[0, 0, 0, 1], [1, 1, 1, 2]])
    f = tmp_path / "e.txt"
    f.write_text("0 1\n0 1\n0 1\n1 2\n")
    adj = sp.coo_matrix((np.ones(4), (ei[0].numpy(), ei[1].numpy())), shape=(3, 3))
    built = {
        "from_edge_index": lambda c: Graph.from_edge_index(ei, 3, coalesce=c),
        "from_pyg": lambda c: Graph.from_pyg(Data(edge_index=ei, num_nodes=3, x=None), coalesce=c),
        "from_scipy": lambda c: Graph.from_scipy(adj, coalesce=c),
        "edgelist": lambda c: load_dataset(f"edgelist:{f}:features=0,classes=0,coalesce={int(c)}"),
        "edgelist_fn": lambda c: edgelist.read_edgelist(f, features=0, classes=0, coalesce=c),
    }
    for name, make in built.items():
        g, c = make(False), make(True)
        assert (g.num_edges, g.stats()["duplicate_edges"]) == (4, 2), name
        assert (c.num_edges, c.stats()["duplicate_edges"]) == (2, 0), name
        assert g.edge_index().tolist() == [[0, 0, 0, 1], [1, 1, 1, 2]], name


def test_symmetrize_keeps_multiplicity_without_doubling() -> None:
    # 0->1 twice, 1->0 once, 1->2 once: 0->1 x2, 1->0 x2 (max of both counts), 1->2 and 2->1 once
    g = Graph.from_edge_index(torch.tensor([[0, 0, 1, 1], [1, 1, 0, 2]]), 3).symmetrize()
    assert sorted(map(tuple, g.edge_index().t().tolist())) == [(0, 1), (0, 1), (1, 0), (1, 0), (1, 2), (2, 1)]
    again = g.symmetrize()
    assert torch.equal(again.indptr, g.indptr) and torch.equal(again.indices, g.indices)  # idempotent
    w = Graph.from_edge_index(torch.tensor([[0, 1, 1], [1, 0, 2]]), 3, edge_weight=torch.tensor([2.0, 5.0, 3.0]))
    ws = w.symmetrize()
    got = {tuple(e): x for e, x in zip(ws.edge_index().t().tolist(), ws.edge_weight.tolist(), strict=True)}
    assert got == {(0, 1): 5.0, (1, 0): 5.0, (1, 2): 3.0, (2, 1): 3.0}  # a pair given both ways: the larger


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"edge_index": torch.tensor([[0, 7], [1, 0]])}, "out of range"),
        ({"edge_index": torch.tensor([[0, -1], [1, 0]])}, "negative vertex id"),
        ({"edge_index": torch.tensor([0, 1])}, "shape"),
        ({"x": torch.randn(5, 2)}, "features have shape"),
        ({"x": torch.tensor([[0.0], [float("nan")], [1.0]])}, "NaN"),
        ({"x": torch.tensor([[0.0], [float("inf")], [1.0]])}, "NaN or inf"),
        ({"y": torch.tensor([0, 1, 3]), "num_classes": 3}, "labels must lie in"),
        ({"y": torch.tensor([0, -2, 1])}, "labels must lie in"),
        ({"y": torch.tensor([0, 1])}, "labels have shape"),
        ({"y": torch.tensor([0, 1, 0]), "train_mask": torch.tensor([True, False])}, "one entry per vertex"),
        ({"train_mask": torch.tensor([1, 0, 0])}, "bool"),
        ({"train_mask": torch.tensor([True, False, False])}, "no labels"),
    ],
)
def test_validation_errors_name_the_problem(kwargs: dict, message: str) -> None:
    ei = kwargs.pop("edge_index", torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(GraphError, match=message):
        Graph.from_edge_index(ei, 3, **kwargs)


def test_float64_features_are_converted_by_the_constructors_and_refused_by_the_dataclass() -> None:
    """``from_edge_index`` converts them to float32 quietly, as ``from_pyg`` does (issue #44 item 18); a Graph
    built field by field holds what it is given, so there they are an error naming the dtype."""
    x = torch.rand(3, 2, dtype=torch.float64)
    g = Graph.from_edge_index(torch.tensor([[0, 1], [1, 2]]), 3, x=x)
    assert g.x is not None and g.x.dtype == torch.float32 and torch.equal(g.x, x.float())
    with pytest.raises(GraphError, match="float32"):
        Graph(indptr=g.indptr, indices=g.indices, x=x)


def test_empty_graph_and_bad_csr_rejected() -> None:
    with pytest.raises(GraphError, match="empty"):
        Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), 0)
    with pytest.raises(GraphError, match="non-decreasing"):
        Graph(indptr=torch.tensor([0, 2, 1, 2]), indices=torch.tensor([0, 1]))


def test_scipy_and_pyg_round_trips() -> None:
    g = tiny_graph()
    a = sp.coo_matrix((np.ones(2), ([0, 1], [1, 2])), shape=(3, 3))  # edges 0->1, 1->2
    gs = Graph.from_scipy(a)
    assert gs.indices.tolist() == [0, 1] and gs.indptr.tolist() == [0, 0, 1, 2]
    back = Graph.from_pyg(g.to_pyg(), name="tiny")
    assert back.equals(g)
    assert torch.equal(Graph.from_scipy(g.to_scipy().T).indices, g.indices)


def test_symmetrize() -> None:
    g = Graph.from_edge_index(torch.tensor([[0, 1, 1], [1, 0, 2]]), 3).symmetrize()
    assert sorted(map(tuple, g.edge_index().t().tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_gcn_normalisation_matches_pyg() -> None:
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    g = tiny_graph()
    indptr, indices, w = normalized_csr(g, AdjacencySpec(self_loops=True, norm="gcn"))
    ei, ref_w = gcn_norm(g.edge_index(), num_nodes=g.num_nodes, add_self_loops=True)
    dst = Block(indptr, indices, 6).dst_index()
    ours = {(int(s), int(d)): float(x) for s, d, x in zip(indices, dst, w, strict=True)}
    ref = {(int(s), int(d)): float(x) for (s, d), x in zip(ei.t(), ref_w, strict=True)}
    assert ours.keys() == ref.keys()
    for k in ref:
        assert abs(ours[k] - ref[k]) < 1e-6
    # vertex 4 already has a self-loop: it must not get a second one
    assert int((indices[indptr[4] : indptr[5]] == 4).sum()) == 1


def test_block_adjacency_and_transpose() -> None:
    g = tiny_graph()
    b = Block.from_graph(g)
    dense = b.adj().to_dense()
    assert dense.shape == (6, 6) and dense[0, 1] == 1 and dense[0, 2] == 1 and dense.sum() == 9
    assert torch.equal(b.adj_t().to_dense(), dense.t())
    assert b.dst_index().tolist() == [0, 0, 1, 1, 2, 3, 4, 4, 4]


def test_self_loops_inserted_in_linear_time_equal_the_sorted_insertion() -> None:
    """normalized_csr adds missing self-loops in place (rows sorted by source) or by sorting (rows unsorted); both
    give what sorting every edge, loops included, by (destination, source) gives."""
    from gnnscale.graph.block import _add_self_loops
    from gnnscale.graph.csr import coo_to_csr, csr_rows
    from gnnscale.graph.generators import csbm, kronecker
    from gnnscale.testing import tiny_graph

    def by_sorting(indptr: torch.Tensor, indices: torch.Tensor, weight: torch.Tensor | None, n: int):  # noqa: ANN202
        dst = csr_rows(indptr, indices.numel())
        has = torch.zeros(n, dtype=torch.bool)
        has[dst[indices == dst]] = True
        missing = torch.nonzero(~has).view(-1)
        w = None if weight is None else torch.cat([weight, torch.ones(missing.numel())])
        return coo_to_csr(torch.cat([indices, missing]), torch.cat([dst, missing]), n, w, coalesce=False)

    unsorted = csbm(nodes=300, seed=2)
    shuffled = unsorted.indices.long().clone()
    shuffled[:50] = shuffled[:50].flip(0)
    cases = [(g.indptr, g.indices.long(), g.num_nodes) for g in (tiny_graph(), csbm(nodes=500, seed=1),
                                                                   kronecker(scale=10))]
    cases.append((unsorted.indptr, shuffled, unsorted.num_nodes))
    for indptr, indices, n in cases:
        for weight in (None, torch.rand(indices.numel(), generator=torch.Generator().manual_seed(0))):
            want, got = by_sorting(indptr, indices, weight, n), _add_self_loops(indptr, indices, weight, n)
            assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
            assert weight is None or torch.equal(want[2], got[2])


def test_block_transpose_built_by_a_stable_sort_equals_the_csc_conversion() -> None:
    from gnnscale.graph.block import Block

    gen = torch.Generator().manual_seed(0)
    for num_dst, num_src, nnz in ((1, 1, 1), (7, 30, 40), (50, 80, 600)):
        keys = torch.randperm(num_dst * num_src, generator=gen)[:nnz].sort().values  # distinct (dst, src) pairs
        dst, src = keys // num_src, keys % num_src
        indptr = torch.zeros(num_dst + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_dst), 0)
        b = Block(indptr, src.to(torch.int32), num_src, torch.rand(nnz, generator=gen)).with_transpose()
        csc = Block(indptr, src.to(torch.int32), num_src, b.edge_weight).adj().to_sparse_csc()
        assert torch.equal(b.t_indptr, csc.ccol_indices().to(torch.int32))
        assert torch.equal(b.t_indices, csc.row_indices().to(torch.int32))
        assert torch.equal(b.t_weight, csc.values())
        x = torch.rand(num_dst, 3, generator=gen)
        assert torch.allclose(b.adj_t() @ x, b.adj().to_dense().T @ x, atol=1e-6)


def test_unlabelled_vertices_allowed_outside_every_mask() -> None:
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    y = torch.tensor([0, -1, 2, -1])
    g = Graph.from_edge_index(ei, 4, y=y, train_mask=torch.tensor([True, False, True, False]))
    assert g.num_classes == 3  # -1 is not a class
    with pytest.raises(GraphError, match=r"val_mask selects 2 unlabelled vertices \(label -1\), the first is vertex 1"):
        Graph.from_edge_index(ei, 4, y=y, val_mask=torch.tensor([False, True, True, True]))


@pytest.mark.parametrize("engine", ["inmemory", "offload", "minibatch"])
def test_unlabelled_vertices_outside_the_masks_change_no_loss(engine: str) -> None:
    """Engines read labels through the masks only: turning every unmasked label into -1 leaves each epoch's loss
    and accuracies as they were."""
    from dataclasses import replace

    from gnnscale import TrainConfig, train
    from gnnscale.graph.generators import csbm

    g = csbm(nodes=300, features=8, seed=0)
    test = g.test_mask.clone()
    test[::3] = False  # a third of the test vertices leave every mask ...
    g = replace(g, test_mask=test)
    outside = ~(g.train_mask | g.val_mask | g.test_mask)
    y = g.y.clone()
    y[outside] = -1  # ... and lose their labels
    unlabelled = replace(g, y=y)
    assert int(outside.sum()) > 50 and unlabelled.num_classes == g.num_classes
    cfg = TrainConfig(engine=engine, epochs=3, hidden=8, seed=1)
    want, got = train(g, cfg, "cpu").history, train(unlabelled, cfg, "cpu").history
    for key in ("loss", "train_acc", "val_acc", "test_acc"):
        assert [r[key] for r in got] == [r[key] for r in want], key


def test_kronecker_split_options_and_the_streamed_directory_agree(tmp_path: Path) -> None:
    g = load_dataset("kronecker:scale=8,features=4,train=0.02,val=0.03")
    assert int(g.train_mask.sum()) == round(0.02 * 256) and int(g.val_mask.sum()) == round(0.03 * 256)
    assert int(g.test_mask.sum()) == 256 - round(0.02 * 256) - round(0.03 * 256)
    spec = "kronecker:scale=8,features=4,train=0.02,val=0.03,test=0.1"
    g = load_dataset(spec)
    assert int(g.test_mask.sum()) == round(0.1 * 256)
    assert not bool((g.train_mask | g.val_mask | g.test_mask).all())  # the rest is in no split
    io.save(g, tmp_path / "memory")
    stream.convert(spec, tmp_path / "streamed", host_memory=64 << 20)
    for name in ("train_mask", "val_mask", "test_mask"):
        a, b = (tmp_path / d / f"{name}.npy" for d in ("memory", "streamed"))
        assert a.read_bytes() == b.read_bytes()
    with pytest.raises(DatasetError, match="train"):
        load_dataset("kronecker:scale=4,train=0.8,val=0.5")
