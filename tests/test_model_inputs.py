"""Issue #44, models and the Python API: edge weights a model does not read are said in one note (item 5), a train
split of one class in one warning (item 8), and ``Graph.from_edge_index`` takes what a PyG user holds -- numpy
arrays, float64 features, string labels (item 18; the layers' and models' PyG call form: tests/test_pyg_layers.py).
Tiny graphs; CLI runs through ``main``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gnnscale import Graph, TrainConfig, train
from gnnscale.cli import main
from gnnscale.errors import GraphError
from gnnscale.graph.generators import csbm


def _lines(err: str, kind: str, about: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(f"{kind}: ") and about in ln]


def _weighted(seed: int = 0) -> Graph:
    g = csbm(nodes=120, features=8, avg_degree=5, seed=seed)
    g.edge_weight = torch.rand(g.num_edges, generator=torch.Generator().manual_seed(seed)) * 4 + 0.1
    return g


# ------------------------------------------------------------------------------------------------ 5: edge weights
ENGINES: dict[str, dict[str, Any]] = {
    "inmemory": dict(model="sage"),
    "offload": dict(model="gat", engine="offload", chunks=2),
    "minibatch": dict(model="gin", engine="minibatch", batch_size=16, fanouts=(3, 3)),
    "hybrid": dict(model="sage", engine="hybrid", devices=("cpu",), drm="off", batch_size=16, fanouts=(3, 3)),
    "taskparallel": dict(model="dgat", engine="taskparallel", devices=("cpu", "cpu"), subgraphs=2),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_model_that_ignores_edge_weights_says_so_once_on_every_engine(
        engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    kw = dict(epochs=1, hidden=8, heads=2, **ENGINES[engine])
    result = train(_weighted(), TrainConfig(**kw), "cpu")
    assert result.engine == engine
    notes = _lines(capsys.readouterr().err, "note", "edge weights")
    assert len(notes) == 1, notes
    assert f"the {kw['model']} model ignores the edge weights of csbm" in notes[0]
    assert "only gcn and dgcn aggregate with them" in notes[0]


@pytest.mark.parametrize("model", ["gcn", "dgcn"])
def test_the_models_that_read_edge_weights_say_nothing(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    train(_weighted(), TrainConfig(model=model, epochs=1, hidden=8), "cpu")
    assert not _lines(capsys.readouterr().err, "note", "edge weights")


@pytest.mark.parametrize(("model", "reads"), [("gcn", True), ("dgcn", True), ("sage", False), ("gat", False),
                                              ("gin", False), ("dgat", False)])
def test_the_note_is_true_only_gcn_losses_see_the_weights(model: str, reads: bool) -> None:
    """The note's claim, checked: with and without the weights the losses are the same for the models it names,
    different for gcn and dgcn."""
    g = _weighted()
    plain = Graph(indptr=g.indptr, indices=g.indices, x=g.x, y=g.y, train_mask=g.train_mask, name=g.name)
    cfg = TrainConfig(model=model, epochs=2, hidden=8, heads=2)
    a = [r["loss"] for r in train(g, cfg, "cpu").history]
    b = [r["loss"] for r in train(plain, cfg, "cpu").history]
    assert (a != b) == reads


def _edge_file(tmp_path: Path) -> Path:
    """A weighted SNAP-style edge list: a ring of 40 vertices plus chords, weights in column 3."""
    rng = np.random.default_rng(0)
    lines = [f"{i} {(i + 1) % 40} {rng.uniform(0.1, 5):.3f}" for i in range(40)]
    lines += [f"{i} {(i * 7 + 3) % 40} {rng.uniform(0.1, 5):.3f}" for i in range(40)]
    path = tmp_path / "w.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("model", "noted"), [("gat", True), ("gcn", False)])
def test_the_cli_says_it_for_weight_column(tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str,
                                           noted: bool) -> None:
    spec = f"edgelist:{_edge_file(tmp_path)}:weight_column=3,features=4,classes=3"
    assert main(["train", "--dataset", spec, "--model", model, "--epochs", "1", "--device", "cpu", "--quiet",
                 "--heads", "2", "--hidden", "8"]) == 0
    notes = _lines(capsys.readouterr().err, "note", "edge weights")
    assert len(notes) == noted, notes
    if noted:
        assert "the gat model ignores the edge weights" in notes[0] and "GATConv" in notes[0]


# ------------------------------------------------------------------------------------------------ 8: one class
def _one_class(g: Graph, label: int = 2) -> Graph:
    assert g.y is not None and g.train_mask is not None
    g.y[g.train_mask] = label  # the other splits keep their classes
    return g


def test_a_train_split_of_one_class_is_one_warning(capsys: pytest.CaptureFixture[str]) -> None:
    g = _one_class(csbm(nodes=120, features=8, avg_degree=5, seed=1))
    assert g.train_mask is not None
    train(g, TrainConfig(epochs=2, hidden=8), "cpu")
    warnings = _lines(capsys.readouterr().err, "warning", "training vertices")
    assert len(warnings) == 1, warnings
    assert f"the {int(g.train_mask.sum())} training vertices of csbm all have class 2" in warnings[0]


def test_two_classes_in_the_train_split_say_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    g = _one_class(csbm(nodes=120, features=8, avg_degree=5, seed=1))
    assert g.y is not None and g.train_mask is not None
    g.y[int(torch.nonzero(g.train_mask)[0])] = 0
    train(g, TrainConfig(epochs=1, hidden=8), "cpu")
    assert not _lines(capsys.readouterr().err, "warning", "training vertices")


def test_the_cli_warns_about_a_one_class_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"edgelist:{_edge_file(tmp_path)}:features=4,classes=1"
    assert main(["train", "--dataset", spec, "--epochs", "1", "--device", "cpu", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert len(_lines(captured.err, "warning", "training vertices")) == 1, captured.err
    assert "test accuracy 1.0000" in captured.out  # the figure the warning explains


# ------------------------------------------------------------------------------------------------ 18: PyG inputs
EI = np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])


def test_from_edge_index_takes_numpy_features_labels_and_masks() -> None:
    """float64 numpy features become float32 quietly, as ``from_pyg`` converts them; numpy labels and masks
    become the tensors a Graph holds."""
    x = np.random.default_rng(0).standard_normal((5, 3))  # float64, as numpy makes them
    g = Graph.from_edge_index(EI, x=x, y=np.array([0, 1, 1, 0, 2]), train_mask=np.array([1, 1, 0, 0, 1], bool))
    assert g.x is not None and g.x.dtype == torch.float32 and g.num_classes == 3
    torch.testing.assert_close(g.x, torch.from_numpy(x).float())
    assert g.y is not None and g.y.dtype == torch.int64 and g.y.tolist() == [0, 1, 1, 0, 2]
    assert g.train_mask is not None and g.train_mask.tolist() == [True, True, False, False, True]
    t = Graph.from_edge_index(torch.from_numpy(EI), x=torch.from_numpy(x), y=torch.tensor([0, 1, 1, 0, 2],
                                                                                         dtype=torch.int32))
    assert t.x is not None and torch.equal(t.x, g.x) and t.y is not None and t.y.dtype == torch.int64


def test_string_labels_become_classes_with_their_names_kept() -> None:
    g = Graph.from_edge_index(EI, x=np.ones((5, 2), np.float32), y=np.array(["cat", "dog", "ant", "dog", "cat"]))
    assert g.class_names == ["ant", "cat", "dog"] and g.num_classes == 3
    assert g.y is not None and g.y.tolist() == [1, 2, 0, 2, 1]
    assert g.class_names is not None and [g.class_names[c] for c in g.y.tolist()] == ["cat", "dog", "ant", "dog",
                                                                                       "cat"]
    unlabelled = Graph.from_edge_index(EI, y=["b", None, "a", "", "b"])  # a list; None and "" are unlabelled
    assert unlabelled.y is not None and unlabelled.y.tolist() == [1, -1, 0, -1, 1]
    assert Graph.from_edge_index(EI, y=np.array([1, 0, 1, 0, 1])).class_names is None


def test_a_graph_of_numpy_inputs_trains() -> None:
    rng = np.random.default_rng(1)
    ei = rng.integers(0, 30, size=(2, 120))
    g = Graph.from_edge_index(ei, num_nodes=30, x=rng.standard_normal((30, 4)),
                              y=np.array(["a", "b", "c"])[rng.integers(0, 3, 30)],
                              train_mask=rng.random(30) < 0.5)
    assert train(g, TrainConfig(epochs=1, hidden=8), "cpu").history[0]["loss"] > 0


def test_inputs_that_are_not_data_are_one_typeerror_or_graph_error() -> None:
    with pytest.raises(TypeError, match="x must be a torch.Tensor or a numpy array of numbers, got a dict"):
        Graph.from_edge_index(EI, x={"a": 1})
    with pytest.raises(TypeError, match="train_mask must be a torch.Tensor or a numpy array"):
        Graph.from_edge_index(EI, y=np.zeros(5, int), train_mask="all")
    with pytest.raises(GraphError, match="labels must be integers"):
        Graph.from_edge_index(EI, y=np.array([0.5, 1, 0, 1, 0]))


def test_the_one_class_warning_names_a_string_class(capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(2)
    y = np.array(["spam", "ham"])[rng.integers(0, 2, 30)]
    mask = rng.random(30) < 0.5
    y[mask] = "ham"
    g = Graph.from_edge_index(rng.integers(0, 30, size=(2, 90)), num_nodes=30, x=rng.standard_normal((30, 4)), y=y,
                              train_mask=mask)
    train(g, TrainConfig(epochs=1, hidden=8), "cpu")
    warnings = _lines(capsys.readouterr().err, "warning", "training vertices")
    assert len(warnings) == 1 and "all have class 0 ('ham')" in warnings[0], warnings
