"""Dataset specs, readers (synthetic files and the shared real data), and the on-disk format."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale.errors import DatasetError, GraphError
from gnnscale.graph import io
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm, kronecker
from gnnscale.testing import need_file, tiny_graph


def test_csbm_is_seeded_and_homophilous() -> None:
    a, b = csbm(nodes=2000, seed=3), csbm(nodes=2000, seed=3)
    assert a.equals(b) and not a.equals(csbm(nodes=2000, seed=4))
    ei = a.edge_index()
    same = (a.y[ei[0]] == a.y[ei[1]]).float().mean().item()
    assert 0.55 < same < 0.65  # default homophily 0.6
    assert int(a.train_mask.sum()) == 200 and not bool((a.train_mask & a.test_mask).any())


def test_kronecker_shape_and_split() -> None:
    g = kronecker(scale=10, edgefactor=8, seed=1)
    assert g.num_nodes == 1024
    assert g.num_edges <= 2 * 8 * 1024
    assert torch.equal(g.in_degree(), g.out_degree())  # symmetrised
    assert int(g.train_mask.sum()) == 256 and int(g.val_mask.sum()) == 512 and int(g.test_mask.sum()) == 256
    deg = g.in_degree().float()
    assert deg.max() > 10 * deg.mean()  # R-MAT skew


def test_spec_options_and_errors() -> None:
    g = load_dataset("csbm:nodes=500,classes=3,features=8,seed=2")
    assert (g.num_nodes, g.num_classes, g.num_features) == (500, 3, 8)
    assert g.meta["spec"] == "csbm:classes=3,features=8,nodes=500,seed=2"
    for spec, msg in [
        ("nope", "unknown dataset"),
        ("csbm:bogus=1", "unknown dataset option 'bogus'"),
        ("csbm:nodes=abc", "not a valid int"),
        ("planetoid:nosuch", "unknown Planetoid"),
        ("npz:/does/not/exist.npz", "file not found"),
        ("npz:", "needs an argument"),
    ]:
        with pytest.raises(DatasetError, match=msg):
            load_dataset(spec)


def test_convert_round_trip_is_identical(tmp_path: Path) -> None:
    g = load_dataset("csbm:nodes=300,features=5")
    io.save(g, tmp_path / "g")
    back = load_dataset(str(tmp_path / "g"))
    assert back.equals(g)
    with pytest.raises(DatasetError, match="already exists"):
        io.save(g, tmp_path / "g")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]  # no temporary left behind


def test_converted_directory_is_validated(tmp_path: Path) -> None:
    io.save(tiny_graph(), tmp_path / "g")
    idx = np.load(tmp_path / "g" / "indices.npy")
    idx[0] = 99
    np.save(tmp_path / "g" / "indices.npy", idx)
    with pytest.raises(GraphError, match="out of range"):
        load_dataset(str(tmp_path / "g"))
    (tmp_path / "g" / "meta.json").write_text("{not json")
    with pytest.raises(DatasetError, match="cannot read"):
        load_dataset(str(tmp_path / "g"))


def test_edgelist_reader(tmp_path: Path) -> None:
    f = tmp_path / "e.txt.gz"
    with gzip.open(f, "wt") as fh:
        fh.write("# Directed graph: nodes 6 edges 3\n# FromNodeId\tToNodeId\n0\t1\n1\t2\n2\t0\n")
    g = load_dataset(f"edgelist:{f}:features=4,classes=2")
    assert (g.num_nodes, g.num_edges, g.num_features) == (6, 3, 4)  # header keeps the 3 isolated vertices
    assert g.edge_index().t().tolist() == [[2, 0], [0, 1], [1, 2]]
    assert load_dataset(f"edgelist:{f}:symmetrize=1").num_edges == 6
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1\n1 x\n")
    with pytest.raises(DatasetError, match="non-integer"):
        load_dataset(f"edgelist:{bad}")


@pytest.mark.parametrize(("header", "option", "edges"), [
    ("# Undirected graph: nodes 4 edges 3\n", "", 6),  # listed once, loaded both ways
    ("# ego-Twitter (SNAP), undirected, each edge once\n", "", 6),
    ("# Directed graph: nodes 4 edges 3\n", "", 3),
    ("", "", 3),  # no header: as written
    ("# Undirected graph: nodes 4 edges 3\n", ":symmetrize=0", 3),  # an explicit option wins
    ("# Directed graph: nodes 4 edges 3\n", ":symmetrize=1", 6),
])
def test_edgelist_honours_an_undirected_header(tmp_path: Path, header: str, option: str, edges: int) -> None:
    f = tmp_path / "e.txt"
    f.write_text(header + "0 1\n1 2\n3 1\n")
    g = load_dataset(f"edgelist:{f}{option}")
    pairs = {tuple(e) for e in g.edge_index().t().tolist()}
    assert g.num_edges == edges == len(pairs)
    assert {(0, 1), (1, 2), (3, 1)} <= pairs
    if edges == 6:
        assert {(1, 0), (2, 1), (1, 3)} <= pairs


def test_ego_twitter_loads_undirected() -> None:
    """The file says "Undirected" and lists each of its 1,342,310 edges once: both directions load (a self-loop
    once)."""
    g = load_dataset(f"edgelist:{need_file('snap/ego-twitter.txt.gz')}:features=1")
    loops = int(g.stats()["self_loops"])
    assert g.num_edges == 2 * 1342310 - loops
    src, dst = g.edge_index()
    n = g.num_nodes
    assert torch.equal(torch.sort(src * n + dst).values, torch.sort(dst * n + src).values)  # symmetric


def test_ogb_reader(tmp_path: Path) -> None:
    base = tmp_path / "ogbn_tiny"
    (base / "raw").mkdir(parents=True)
    (base / "split" / "random").mkdir(parents=True)

    def write(p: Path, rows: list[str]) -> None:
        with gzip.open(p, "wt") as fh:
            fh.write("\n".join(rows) + "\n")

    write(base / "raw" / "edge.csv.gz", ["0,1", "1,2", "3,2"])
    write(base / "raw" / "node-feat.csv.gz", ["0.5,1", "1,0", "0,0", "2,2"])
    write(base / "raw" / "node-label.csv.gz", ["0", "1", "1", "0"])
    write(base / "split" / "random" / "train.csv.gz", ["0", "1"])
    write(base / "split" / "random" / "valid.csv.gz", ["2"])
    write(base / "split" / "random" / "test.csv.gz", ["3"])
    g = load_dataset("ogb:ogbn-tiny", root=tmp_path)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (4, 6, 2, 2)
    assert g.x[0].tolist() == [0.5, 1.0] and g.train_mask.tolist() == [True, True, False, False]
    assert load_dataset("ogb:ogbn-tiny:symmetrize=0", root=tmp_path).num_edges == 3
    write(base / "raw" / "node-label.csv.gz", ["0", "1", "nan", "0"])  # unlabelled vertex 2, in valid
    with pytest.raises(GraphError, match=r"val_mask selects 1 unlabelled vertices \(label -1\)"):
        load_dataset("ogb:ogbn-tiny", root=tmp_path)
    write(base / "split" / "random" / "valid.csv.gz", ["3"])
    write(base / "split" / "random" / "test.csv.gz", [])
    g = load_dataset("ogb:ogbn-tiny", root=tmp_path)
    assert g.y.tolist() == [0, 1, -1, 0] and g.num_classes == 2 and not bool(g.test_mask.any())


def test_planetoid_cora() -> None:
    root = need_file("planetoid/ind.cora.x").parent
    g = load_dataset("planetoid:cora", root=root)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (2708, 10556, 1433, 7)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [140, 500, 1000]
    torch.testing.assert_close(g.x.sum(1)[g.x.sum(1) > 0], torch.ones(int((g.x.sum(1) > 0).sum())))


def test_npz_amazon_computers() -> None:
    f = need_file("gnn-benchmark/amazon_electronics_computers.npz")
    g = load_dataset(f"npz:{f}", seed=1)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (13752, 491722, 767, 10)
    assert torch.equal(g.in_degree(), g.out_degree())
    assert int(g.train_mask.sum()) == 200 and int(g.val_mask.sum()) == 300
    assert not load_dataset(f"npz:{f}", seed=2).train_mask.equal(g.train_mask)


def test_corrupt_npz(tmp_path: Path) -> None:
    f = tmp_path / "x.npz"
    f.write_bytes(b"PK\x03\x04 this is not a zip")
    with pytest.raises(DatasetError, match="cannot read"):
        load_dataset(f"npz:{f}")


def test_edgelist_web_cnr_and_convert(tmp_path: Path) -> None:
    f = need_file("snap/web-cnr-2000.txt.gz")
    g = load_dataset(f"edgelist:{f}")
    st = g.stats()
    assert (st["nodes"], st["edges"], st["self_loops"]) == (325557, 3216152, 87442)
    io.save(g, tmp_path / "cnr")
    meta = json.loads((tmp_path / "cnr" / "meta.json").read_text())
    assert meta["num_edges"] == 3216152
    assert load_dataset(str(tmp_path / "cnr")).equals(g)


def test_edgelist_third_column_is_a_weight_not_more_ids(tmp_path: Path) -> None:
    """Read by column: `0 1 7` is the edge 0->1 of weight 7, not the ids 0, 1, 7 re-paired across lines."""
    f = tmp_path / "w.txt"
    f.write_text("0 1 7\n1 2 9\n2 3 4\n3 0 1\n")
    g = load_dataset(f"edgelist:{f}:features=1")
    assert (g.num_nodes, g.num_edges) == (4, 4)
    assert sorted(map(tuple, g.edge_index().t().tolist())) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    ew = {tuple(e): w for e, w in zip(g.edge_index().t().tolist(), g.edge_weight.tolist(), strict=True)}
    assert ew == {(0, 1): 7.0, (1, 2): 9.0, (2, 3): 4.0, (3, 0): 1.0}
    assert "column 3" in g.meta["edge_weight"]
    assert load_dataset(f"edgelist:{f}:weights=0").edge_weight is None
    (tmp_path / "three.txt").write_text("0 1 7\n1 2 9\n2 3 4\n")  # was "odd number of ids"
    assert load_dataset(f"edgelist:{tmp_path / 'three.txt'}").num_edges == 3


def test_edgelist_commas_and_inline_comments(tmp_path: Path) -> None:
    f = tmp_path / "c.csv"
    f.write_text("# Nodes: 5\n0,1  # first\n1, 2\n# middle comment\n% matrix-market style\n2 ,3 # 50%\n")
    g = load_dataset(f"edgelist:{f}:features=1")
    assert (g.num_nodes, g.num_edges, g.edge_weight) == (5, 3, None)
    assert sorted(map(tuple, g.edge_index().t().tolist())) == [(0, 1), (1, 2), (2, 3)]
    f.write_text("0,1,1.5  # a\n1,2,0.5\n# c\n2,3,2\n")
    g = load_dataset(f"edgelist:{f}:features=1")
    assert sorted(g.edge_weight.tolist()) == [0.5, 1.5, 2.0]


@pytest.mark.parametrize(("body", "option", "message"), [
    ("0 1\n1 2 5\n", "", r"line 2: 3 columns where line 1 has 2: '1 2 5'"),
    ("# h\n0 1\n\n1 2 3 4\n", "", r"line 4: 4 columns where line 2 has 2: '1 2 3 4'"),
    ("0 1 2 3\n", "", r"line 1: expected 'src dst' or 'src dst weight', got 4 columns: '0 1 2 3'"),
    ("7\n", "", r"line 1: expected 'src dst' or 'src dst weight', got 1 columns"),
    ("0 1\n1 x\n", "", r"line 2: non-integer vertex id: '1 x'"),
    ("0 1 2\n1 2 heavy\n", "", r"line 2: non-numeric edge weight: '1 2 heavy'"),
    ("0 1 2\n1 2 nan\n", "", r"line 2: edge weight is NaN or inf"),
    ("0 1\n2 -3\n", "", r"line 2: negative vertex id -3"),
    ("0 1\n1 2\n", ":weights=1", r"weights=1 but the file has 2 columns"),
    ("# only a comment\n\n", "", r"no edges found"),
])
def test_edgelist_bad_lines_are_named(tmp_path: Path, body: str, option: str, message: str) -> None:
    f = tmp_path / "bad.txt"
    f.write_text(body)
    with pytest.raises(DatasetError, match=message):
        load_dataset(f"edgelist:{f}{option}")


@pytest.mark.parametrize("layout", [".", "raw", "Cora/raw", "cora/raw", "CORA"])
def test_planetoid_found_in_pyg_layouts(tmp_path: Path, layout: str) -> None:
    src = need_file("planetoid/ind.cora.x").parent
    (tmp_path / layout).mkdir(parents=True, exist_ok=True)
    for f in src.glob("ind.cora.*"):
        (tmp_path / layout / f.name).symlink_to(f)
    assert load_dataset("planetoid:cora", root=tmp_path).num_nodes == 2708
    assert load_dataset("planetoid:Cora", root=tmp_path).num_edges == 10556


def test_planetoid_error_lists_every_place_looked(tmp_path: Path) -> None:
    (tmp_path / "CiteSeer").mkdir()
    with pytest.raises(DatasetError, match="not found") as err:
        load_dataset("planetoid:citeseer", root=tmp_path)
    msg = str(err.value)
    for place in ("", "/raw", "/citeseer/raw", "/CiteSeer/raw", "/citeseer,", "/CiteSeer)"):
        assert f"{tmp_path}{place}" in msg, place
