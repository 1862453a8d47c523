"""Dataset specs, readers (synthetic files and the shared real data), and the on-disk format."""

from __future__ import annotations

import errno
import gzip
import json
import warnings
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


def test_converted_directory_records_its_draws_and_keeps_them(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """meta.json says which parts were drawn at random and with which seed; opening the directory with another
    seed keeps them (the documented choice) and says so in one line."""
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n2 3\n3 0\n")
    g = load_dataset(f"edgelist:{f}:features=2,classes=2", seed=3)
    io.save(g, tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())["meta"]
    assert meta == {"spec": f"edgelist:{f}:features=2,classes=2", "seed": 3,
                    "generated": ["features", "labels", "split"], "made_up": ["features", "labels"]}
    assert load_dataset(str(tmp_path / "g"), seed=3).equals(g)
    assert capsys.readouterr().err == ""  # the seed it was drawn with: nothing to say
    other = load_dataset(str(tmp_path / "g"), seed=5)
    assert other.equals(g)  # split, features and labels are those of seed 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"note: {tmp_path / 'g'} holds the features, labels and split "
                                                   "drawn with seed 3 when it was converted"), err
    assert "seed 5 only changes training" in err
    assert load_dataset(f"edgelist:{f}:features=0,classes=0", seed=3).meta == {"spec": f"edgelist:{f}:features=0,"
                                                                              "classes=0"}  # nothing drawn
    assert load_dataset("csbm:nodes=50,seed=2", seed=7).meta["seed"] == 2  # the spec's seed wins
    assert load_dataset("csbm:nodes=50", seed=7).meta["generated"] == ["graph", "features", "labels", "split"]


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


@pytest.mark.parametrize(("header", "option", "edges", "note"), [
    ("# Undirected graph: nodes 4 edges 3\n", "", 3, "add symmetrize=1"),  # a comment changes nothing
    ("# ego-Twitter (SNAP), undirected, each edge once\n", "", 3, "add symmetrize=1"),
    ("# Directed graph. An undirected version is available elsewhere\n", "", 3, None),  # says directed
    ("# Directed graph: nodes 4 edges 3\n", "", 3, None),
    ("", "", 3, None),  # no header: as written
    ("# Undirected graph: nodes 4 edges 3\n", ":symmetrize=0", 3, None),  # asked for as listed: nothing to say
    ("# Directed graph: nodes 4 edges 3\n", ":symmetrize=1", 6, "symmetrised e.txt: 3 -> 6 edges"),
    ("# Undirected graph: nodes 4 edges 3\n", ":symmetrize=1", 6, "symmetrised e.txt: 3 -> 6 edges"),
])
def test_edgelist_header_never_changes_the_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str], header: str,
                                                 option: str, edges: int, note: str | None) -> None:
    """Only ``symmetrize=1`` symmetrises (and says so); a header calling the graph undirected gets a note
    suggesting it. (Before: any comment containing the word "undirected" doubled the edges.)"""
    f = tmp_path / "e.txt"
    f.write_text(header + "0 1\n1 2\n3 1\n")
    g = load_dataset(f"edgelist:{f}{option}")
    pairs = {tuple(e) for e in g.edge_index().t().tolist()}
    assert g.num_edges == edges == len(pairs)
    assert {(0, 1), (1, 2), (3, 1)} <= pairs
    if edges == 6:
        assert {(1, 0), (2, 1), (1, 3)} <= pairs
        assert g.meta["symmetrized_from_edges"] == 3
    else:
        assert "symmetrized_from_edges" not in g.meta
    err = capsys.readouterr().err
    if note is None:
        assert err == ""
    else:
        assert err.count("\n") == 1 and err.startswith("note: ") and note in err, err


def test_ego_twitter_loads_as_listed_unless_symmetrised(capsys: pytest.CaptureFixture[str]) -> None:
    """The file says "Undirected" and lists each of its 1,342,310 edges once: as listed by default (with a note),
    both directions with ``symmetrize=1`` (a self-loop once)."""
    f = need_file("snap/ego-twitter.txt.gz")
    g = load_dataset(f"edgelist:{f}:features=1")
    assert g.num_edges == 1342310
    assert "add symmetrize=1" in capsys.readouterr().err
    g = load_dataset(f"edgelist:{f}:features=1,symmetrize=1")
    loops = int(g.stats()["self_loops"])
    assert g.num_edges == 2 * 1342310 - loops
    src, dst = g.edge_index()
    n = g.num_nodes
    assert torch.equal(torch.sort(src * n + dst).values, torch.sort(dst * n + src).values)  # symmetric
    assert f"symmetrised {f.name}: 1,342,310 -> {g.num_edges:,} edges" in capsys.readouterr().err


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


def test_edgelist_weight_column_is_read_by_column(tmp_path: Path) -> None:
    """Read by column: with ``weight_column=3``, `0 1 7` is the edge 0->1 of weight 7, not the ids 0, 1, 7
    re-paired across lines."""
    f = tmp_path / "w.txt"
    f.write_text("0 1 7\n1 2 9\n2 3 4\n3 0 1\n")
    g = load_dataset(f"edgelist:{f}:features=1,weight_column=3")
    assert (g.num_nodes, g.num_edges) == (4, 4)
    assert sorted(map(tuple, g.edge_index().t().tolist())) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    ew = {tuple(e): w for e, w in zip(g.edge_index().t().tolist(), g.edge_weight.tolist(), strict=True)}
    assert ew == {(0, 1): 7.0, (1, 2): 9.0, (2, 3): 4.0, (3, 0): 1.0}
    assert g.meta["edge_weight"] == "column 3 of w.txt"
    assert load_dataset(f"edgelist:{f}:weight_column=0").edge_weight is None
    (tmp_path / "three.txt").write_text("0 1 7\n1 2 9\n2 3 4\n")  # was "odd number of ids"
    assert load_dataset(f"edgelist:{tmp_path / 'three.txt'}").num_edges == 3


def test_edgelist_extra_columns_are_not_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A SNAP temporal file's third column is a Unix timestamp: ignored (one note), not GCN weights."""
    f = tmp_path / "t.txt"
    f.write_text("# FromNodeId ToNodeId UnixTime\n0 1 1217567877\n1 2 1217573547\n2 0 1217606247\n")
    g = load_dataset(f"edgelist:{f}:features=1")
    assert g.edge_weight is None and "edge_weight" not in g.meta
    assert sorted(map(tuple, g.edge_index().t().tolist())) == [(0, 1), (1, 2), (2, 0)]
    err = capsys.readouterr().err
    assert err == "note: t.txt has 3 columns: column 3 ignored (not read as edge weights); add weight_column=3 to " \
                  "the spec to read it as edge weights\n", err
    f.write_text("0 1 0.5 1217567877\n1 2 2 1217573547\n")  # four columns: the third named, the fourth ignored
    g = load_dataset(f"edgelist:{f}:features=1,weight_column=3")
    assert sorted(g.edge_weight.tolist()) == [0.5, 2.0]
    err = capsys.readouterr().err
    assert err == "note: t.txt has 4 columns: column 4 ignored (not read as edge weights)\n", err


@pytest.mark.parametrize(("weights", "warned"), [
    (["1217567877", "1217573547", "1217606247"], "integers up to 1,217,606,247"),  # Unix timestamps
    ([str(i) for i in range(8)], "the distinct integers 0..7, one per edge"),  # edge ids
    ([str(i) for i in range(1, 8)], None),  # a short run: could be weights
    (["0.5", "2", "1.5"], None),
    (["1", "1", "2", "3", "5", "8", "13", "21"], None),
])
def test_weights_that_look_like_timestamps_or_ids_are_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             weights: list[str], warned: str | None) -> None:
    f = tmp_path / "w.txt"
    f.write_text("".join(f"{i} {i + 1} {w}\n" for i, w in enumerate(weights)))
    g = load_dataset(f"edgelist:{f}:features=1,weight_column=3")
    assert g.edge_weight is not None  # used as asked
    err = capsys.readouterr().err
    if warned is None:
        assert err == ""
    else:
        assert err.startswith("warning: the edge weights in column 3 of w.txt look like timestamps or ids") and \
            warned in err and err.count("\n") == 1, err


def test_edgelist_commas_and_inline_comments(tmp_path: Path) -> None:
    f = tmp_path / "c.csv"
    f.write_text("# Nodes: 5\n0,1  # first\n1, 2\n# middle comment\n% matrix-market style\n2 ,3 # 50%\n")
    g = load_dataset(f"edgelist:{f}:features=1")
    assert (g.num_nodes, g.num_edges, g.edge_weight) == (5, 3, None)
    assert sorted(map(tuple, g.edge_index().t().tolist())) == [(0, 1), (1, 2), (2, 3)]
    f.write_text("0,1,1.5  # a\n1,2,0.5\n# c\n2,3,2\n")
    g = load_dataset(f"edgelist:{f}:features=1,weight_column=3")
    assert sorted(g.edge_weight.tolist()) == [0.5, 1.5, 2.0]


@pytest.mark.parametrize(("body", "option", "message"), [
    ("0 1\n1 2 5\n", "", r"line 2: 3 columns where line 1 has 2: '1 2 5'"),
    ("# h\n0 1\n\n1 2 3 4\n", "", r"line 4: 4 columns where line 2 has 2: '1 2 3 4'"),
    ("7\n", "", r"line 1: expected 'src dst' and optional more columns, got 1 column: '7'"),
    ("0 1\n1 x\n", "", r"line 2: non-integer vertex id: '1 x'"),
    ("0 1 2\n1 2 heavy\n", ":weight_column=3", r"line 2: non-numeric edge weight: '1 2 heavy'"),
    ("0 1 2\n1 2 nan\n", ":weight_column=3", r"line 2: edge weight is NaN or inf"),
    ("0 1\n2 -3\n", "", r"line 2: negative vertex id -3"),
    ("0 1\n1 2\n", ":weight_column=3", r"weight_column=3 but the file has 2 columns"),
    ("0 1 2\n", ":weight_column=2", r"weight_column=2: columns 1 and 2 are the source and destination ids"),
    ("0 1 2\n", ":weights=1", r"unknown dataset option 'weights'.*weight_column"),
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


def test_an_array_the_kernel_will_not_map_privately_opens_read_only(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A file larger than RAM and swap cannot be mapped copy-on-write (ENOMEM under Linux's overcommit heuristic):
    open_dir maps it read-only instead, silently, and every other array as before."""
    g = csbm(nodes=100, features=4, seed=0)
    io.save(g, tmp_path / "g")
    real = np.load
    modes: dict[str, str] = {}

    def load(f: Path, mmap_mode: str | None = None, allow_pickle: bool = False) -> np.ndarray:
        if Path(f).name == "x.npy" and mmap_mode == "c":
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        modes[Path(f).name] = str(mmap_mode)
        return real(f, mmap_mode=mmap_mode, allow_pickle=allow_pickle)

    monkeypatch.setattr(np, "load", load)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "not writable" warning is not shown
        h = io.open_dir(tmp_path / "g")
    assert modes["x.npy"] == "r" and modes["indices.npy"] == "c"
    assert h.x is not None and torch.equal(h.x, g.x)
    monkeypatch.setattr(np, "load", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(DatasetError):  # another error is still one line
        io.open_dir(tmp_path / "g")
