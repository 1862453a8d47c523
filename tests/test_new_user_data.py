"""Issue #28, the data-input items: what a new user's own data ran into (float labels read as classes, raw SNAP
ids, a header that contradicts its file, made-up features and labels, PyG ``Data`` given to ``train``, PyG
multi-split masks and sparse features). Tiny literal files in ``tmp_path``; CLI runs through ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale import Graph, TrainConfig, train
from gnnscale.cli import main
from gnnscale.errors import DatasetError, GraphError
from gnnscale.graph import io
from gnnscale.graph.datasets import load_dataset

# 3 vertices named by raw ids (a SNAP crawl's), 4 edge lines
RAW = "# FromNodeId\tToNodeId\n9876543210\t5\n5\t70000000\n70000000\t9876543210\n5\t9876543210\n"
RAW_IDS = [5, 70000000, 9876543210]


def _one_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """The one ``error:`` line of a failed command (and nothing else on stderr, no traceback)."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert "Traceback" not in err
    return lines[0]


def _notes(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("note: ")]


# ------------------------------------------------------------------------ 1. npz labels that are not classes
def _npz(path: Path, labels: np.ndarray) -> Path:
    """A 4-vertex gnn-benchmark npz (a path 0-1-2-3, dense features) with ``labels``."""
    adj = np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=np.float32)
    rows, cols = np.nonzero(adj)
    indptr = np.searchsorted(rows, np.arange(5))
    np.savez(path, adj_data=np.ones(rows.size, np.float32), adj_indices=cols, adj_indptr=indptr,
             adj_shape=np.array([4, 4]), attr_matrix=np.eye(4, dtype=np.float32), labels=labels)
    return path


def test_npz_labels_that_are_not_integral_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression targets 0.0-4.0 were truncated into classes; now one error line naming a value."""
    f = _npz(tmp_path / "reg.npz", np.array([0.0, 1.5, 3.25, 4.0]))
    line = _one_error(capsys, main(["info", "--dataset", f"npz:{f}"]))
    assert "reg.npz" in line and "not integral" in line and "1.5" in line, line
    with pytest.raises(DatasetError, match="not integral"):
        load_dataset(f"npz:{f}")


def test_npz_integral_float_labels_are_classes(tmp_path: Path) -> None:
    g = load_dataset(f"npz:{_npz(tmp_path / 'cls.npz', np.array([0.0, 1.0, 2.0, 1.0]))}")
    assert g.y.tolist() == [0, 1, 2, 1] and g.num_classes == 3


# ----------------------------------------------------------------------------------- 2. vertex ids of real data
def test_raw_snap_ids_are_remapped_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ids up to ~10^10 naming 3 vertices: 3 vertices (not 10^10, which died allocating), in id order, the original
    ids kept in ``node_ids``, one note with the counts."""
    f = tmp_path / "raw.txt"
    f.write_text(RAW)
    g = load_dataset(f"edgelist:{f}:features=4,classes=2")
    assert g.num_nodes == 3 and g.num_edges == 4
    assert g.node_ids is not None and g.node_ids.dtype == torch.int64 and g.node_ids.tolist() == RAW_IDS
    pairs = {(int(g.node_ids[s]), int(g.node_ids[d])) for s, d in g.edge_index().t().tolist()}
    assert pairs == {(9876543210, 5), (5, 70000000), (70000000, 9876543210), (5, 9876543210)}
    notes = _notes(capsys.readouterr().err)
    assert notes == ["note: remapped 3 vertex ids (max id 9,876,543,210) to 0..2; --keep-ids (keep_ids=1) keeps "
                     "them"], notes


def test_gapped_ids_are_not_isolated_vertices_in_the_splits(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "gaps.txt"
    f.write_text("".join(f"{10 * i} {10 * (i + 1)}\n" for i in range(8)))  # ids 0, 10, ..., 80
    g = load_dataset(f"edgelist:{f}:features=2,classes=2")
    assert g.num_nodes == 9 and g.stats()["isolated_nodes"] == 0
    assert g.node_ids.tolist() == list(range(0, 90, 10))
    assert "remapped 9 vertex ids (max id 80) to 0..8" in capsys.readouterr().err
    # ids that are already 0..n-1: nothing to remap, nothing said, no node_ids
    f.write_text("0 1\n1 2\n2 0\n")
    g = load_dataset(f"edgelist:{f}:features=2,classes=2")
    assert g.num_nodes == 3 and g.node_ids is None and capsys.readouterr().err == ""


def test_keep_ids_keeps_ids_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "gaps.txt"
    f.write_text("0 10\n10 20\n")
    assert main(["info", "--dataset", f"edgelist:{f}", "--keep-ids", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["nodes"] == 21 and "remapped" not in out.err
    g = load_dataset(f"edgelist:{f}:keep_ids=1")
    assert g.num_nodes == 21 and g.node_ids is None
    assert load_dataset(f"edgelist:{f}", keep_ids=True).num_nodes == 21


def test_keep_ids_that_cannot_fit_in_memory_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "raw.txt"
    f.write_text(RAW)
    line = _one_error(capsys, main(["info", "--dataset", f"edgelist:{f}", "--keep-ids"]))
    assert "9,876,543,211 vertices" in line and "without --keep-ids" in line, line


def test_converted_directory_keeps_the_original_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "raw.txt"
    f.write_text(RAW)
    assert main(["convert", "--dataset", f"edgelist:{f}:features=2", "--out", str(tmp_path / "conv")]) == 0
    assert (tmp_path / "conv" / "node_ids.npy").is_file()
    g = io.open_dir(tmp_path / "conv")
    assert g.node_ids.tolist() == RAW_IDS and g.equals(load_dataset(f"edgelist:{f}:features=2"))


def test_predict_writes_the_original_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The csv's vertex column holds the user's ids, so predictions join back to their data."""
    f = tmp_path / "raw.txt"
    f.write_text(RAW)
    spec = f"edgelist:{f}:features=4,classes=2"
    model = tmp_path / "m.pt"
    assert main(["train", "--dataset", spec, "--epochs", "1", "--hidden", "4", "--device", "cpu", "--quiet",
                 "--save-model", str(model)]) == 0
    assert main(["predict", "--dataset", spec, "--model", str(model), "--out", str(tmp_path / "p.csv"),
                 "--device", "cpu"]) == 0
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert rows[0] == "vertex,label"
    assert [int(r.split(",")[0]) for r in rows[1:]] == RAW_IDS


# ------------------------------------------------------------------------------------ 3. a header as a check
@pytest.mark.parametrize(("header", "numbers"), [
    ("# Nodes: 4 Edges: 5\n", ("5", "4")),  # 4 lines, the header says 5 edges
    ("# Nodes: 2 Edges: 4\n", ("2", "3")),  # 3 distinct ids, the header says 2 nodes
    ("# Directed graph: nodes 3 edges 7\n", ("7", "4")),
])
def test_a_header_that_contradicts_the_file_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         header: str, numbers: tuple[str, str]) -> None:
    f = tmp_path / "h.txt"
    f.write_text(header + "0 1\n1 2\n2 0\n0 2\n")
    line = _one_error(capsys, main(["info", "--dataset", f"edgelist:{f}"]))
    assert "h.txt" in line and all(n in line for n in numbers), line


def test_a_header_that_agrees_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SNAP's Edges counts lines, not the symmetrised graph's edges; Nodes may count isolated vertices."""
    f = tmp_path / "h.txt"
    f.write_text("# Nodes: 4 Edges: 3\n0 1\n1 2\n2 0\n")
    g = load_dataset(f"edgelist:{f}:symmetrize=1")
    assert (g.num_nodes, g.num_edges) == (4, 6)
    f.write_text("# Nodes: 3 Edges: 3\n9876543210 5\n5 70000000\n70000000 9876543210\n")
    assert load_dataset(f"edgelist:{f}").num_nodes == 3  # raw ids: 3 distinct, as the header says


# ----------------------------------------------------------------------------------- 5. made-up data is said
def test_made_up_features_and_labels_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "e.txt"
    f.write_text("".join(f"{i} {(i + 1) % 12}\n" for i in range(12)))
    m = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", f"edgelist:{f}:features=4,classes=2", "--epochs", "1", "--hidden", "4",
                 "--device", "cpu", "--quiet", "--metrics", str(m)]) == 0
    out = capsys.readouterr()
    made = [n for n in _notes(out.err) if "made up" in n]
    assert len(made) == 1 and "features" in made[0] and "labels" in made[0], out.err
    summary = json.loads(m.read_text().splitlines()[-1])
    assert summary["made_up"] == ["features", "labels"]
    last = [ln for ln in out.out.splitlines() if "test accuracy" in ln][-1]
    assert "made-up labels" in last and "not a result" in last, last


def test_real_data_makes_nothing_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", "csbm:nodes=200,features=4", "--epochs", "1", "--hidden", "4",
                 "--device", "cpu", "--quiet", "--metrics", str(m)]) == 0
    out = capsys.readouterr()
    assert json.loads(m.read_text().splitlines()[-1])["made_up"] == []
    assert "made up" not in out.err and "not a result" not in out.out


# ----------------------------------------------------------------------------------------- 17, 20. PyG input
def _pyg(n: int = 30, **extra: torch.Tensor):  # type: ignore[no-untyped-def]
    Data = pytest.importorskip("torch_geometric.data").Data
    src = torch.arange(n)
    ei = torch.stack([torch.cat([src, (src + 1) % n]), torch.cat([(src + 1) % n, src])])
    gen = torch.Generator().manual_seed(0)
    return Data(x=torch.randn(n, 4, generator=gen), edge_index=ei, y=torch.arange(n) % 3, **extra)


def test_train_takes_a_pyg_data(capsys: pytest.CaptureFixture[str]) -> None:
    """It died with AttributeError: 'GlobalStorage' object has no attribute 'num_classes'."""
    n = 30
    data = _pyg(n, train_mask=torch.arange(n) < 10, val_mask=(torch.arange(n) >= 10) & (torch.arange(n) < 20),
                test_mask=torch.arange(n) >= 20)
    result = train(data, TrainConfig(epochs=1, hidden=4), "cpu")
    assert result.summary["dataset"] == "pyg" and result.summary["made_up"] == []
    assert "Graph.from_pyg" in capsys.readouterr().err


def test_train_refuses_what_is_not_a_graph() -> None:
    with pytest.raises(GraphError, match="Graph.from_pyg"):
        train({"x": 1}, TrainConfig(epochs=1))  # type: ignore[arg-type]


def test_multi_split_masks_pick_a_column(capsys: pytest.CaptureFixture[str]) -> None:
    """WikiCS: masks of shape [N, k], one column per split; it was 'train_mask has length 90, expected 30'."""
    n, k = 30, 3
    idx = torch.arange(n)
    train_m = torch.stack([(idx % 3) == j for j in range(k)], 1)
    val_m = torch.stack([(idx % 3) == (j + 1) % 3 for j in range(k)], 1)
    data = _pyg(n, train_mask=train_m, val_mask=val_m, test_mask=(idx % 3) == 2)
    g = Graph.from_pyg(data)
    assert torch.equal(g.train_mask, train_m[:, 0]) and torch.equal(g.val_mask, val_m[:, 0])
    err = capsys.readouterr().err
    assert "note: from_pyg: train_mask, val_mask hold 3 splits (shape [30, 3]); split 0 is used (split=K picks " \
           "another)" in err, err
    g = Graph.from_pyg(data, split=2)
    assert torch.equal(g.train_mask, train_m[:, 2]) and capsys.readouterr().err == ""
    with pytest.raises(GraphError, match=r"split=3 .* \[30, 3\]"):
        Graph.from_pyg(data, split=3)
    with pytest.raises(GraphError, match=r"train_mask has shape \(30, 3\), expected \(30,\).*split"):
        Graph.from_edge_index(data.edge_index, n, x=data.x, y=data.y, train_mask=train_m)


def test_sparse_features_are_densified(capsys: pytest.CaptureFixture[str]) -> None:
    data = _pyg()
    dense = data.x.clone()
    data.x = dense.to_sparse()
    g = Graph.from_pyg(data)
    assert torch.equal(g.x, dense) and g.x.layout == torch.strided
    assert "note: from_pyg: x is a sparse tensor" in capsys.readouterr().err
    with pytest.raises(GraphError, match="sparse"):
        Graph.from_edge_index(data.edge_index, 30, x=dense.to_sparse())


@pytest.mark.parametrize("body", ["src,dst\n10,20\n20,30\n30,10\n",
                                  "# a comment\nfrom to weight\n10 20 0.5\n20 30 1\n"])
def test_a_column_header_line_is_read_as_names_not_an_edge(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           body: str) -> None:
    f = tmp_path / "edges.csv"
    f.write_text(body)
    g = load_dataset(f"edgelist:{f}")
    assert g.num_nodes == 3 and g.num_edges == body.count("\n") - body.count("#") - 1
    assert g.node_ids is not None and g.node_ids.tolist() == [10, 20, 30]
    assert any("read as column names, not an edge" in n for n in _notes(capsys.readouterr().err))


def test_a_first_line_with_one_bad_id_is_still_an_error(tmp_path: Path) -> None:
    f = tmp_path / "edges.txt"
    f.write_text("1 x\n1 2\n")
    with pytest.raises(DatasetError, match="line 1: non-integer vertex id"):
        load_dataset(f"edgelist:{f}")
