"""Saved models and predictions (issue #15): predict reproduces the test accuracy training reported, gives the
same labels through every engine's inference path (offload under a budget, taskparallel, minibatch), and writes
.npy / .pt / .csv; bad model files and mismatched graphs are one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale import Block, TrainConfig, load_model, predict, save_model, train
from gnnscale.cli import main
from gnnscale.errors import ConfigError, GraphError
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm
from gnnscale.testing import need_file


def test_predict_on_cora_reproduces_the_reported_accuracy_in_memory_and_under_an_offload_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = need_file("planetoid/ind.cora.x").parent
    model = tmp_path / "gcn.pt"
    common = ["--dataset", "planetoid:Cora", "--root", str(root)]
    assert main(["train", *common, "--hidden", "16", "--epochs", "60", "--quiet", "--device", "cpu",
                 "--save-model", str(model)]) == 0
    out = capsys.readouterr().out
    reported = float(out.split("test accuracy ")[1].split()[0])
    assert main(["predict", *common, "--model", str(model), "--out", str(tmp_path / "p.npy"), "--device", "cpu"]) == 0
    assert f"test accuracy {reported:.4f}" in capsys.readouterr().out
    assert main(["predict", *common, "--model", str(model), "--out", str(tmp_path / "q.csv"), "--device", "cpu",
                 "--engine", "offload", "--gpu-memory", "20MB", "--partitions", "2"]) == 0
    assert f"test accuracy {reported:.4f}" in capsys.readouterr().out
    a = np.load(tmp_path / "p.npy")
    b = np.loadtxt(tmp_path / "q.csv", delimiter=",", skiprows=1, dtype=np.int64)
    assert b[:, 0].tolist() == list(range(len(a))) and (b[:, 1] == a).all()
    g = load_dataset("planetoid:Cora", str(root))
    assert float((torch.from_numpy(a)[g.test_mask] == g.y[g.test_mask]).float().mean()) == pytest.approx(reported,
                                                                                                          abs=5e-5)


@pytest.mark.parametrize(("model", "engine", "options"), [
    ("gcn", "offload", {"partitions": 3, "chunks": 2}),
    ("sage", "minibatch", {}),
    ("dgat", "taskparallel", {"devices": ("cpu", "cpu")}),
])
def test_every_engine_predicts_what_the_in_memory_model_does(tmp_path: Path, model: str, engine: str,
                                                              options: dict[str, object]) -> None:
    g = csbm(nodes=500, avg_degree=6, features=12, seed=2)
    res = train(g, TrainConfig(model=model, hidden=16, epochs=3), "cpu")
    path = save_model(tmp_path / "m.pt", res.model, TrainConfig(model=model, hidden=16, epochs=3), g)
    want = predict(g, path, "cpu", engine="inmemory")
    assert torch.equal(want, res.model.eval()(Block.from_graph(g, res.model.adjacency), g.x).argmax(-1))
    got = predict(g, path, "cpu", engine=engine, **options)
    assert got.dtype == torch.int64 and torch.equal(got, want)


def test_saved_best_state_and_round_trip(tmp_path: Path) -> None:
    g = csbm(nodes=300, avg_degree=4, features=8, seed=0)
    cfg = TrainConfig(hidden=8, epochs=4)
    res = train(g, cfg, "cpu")
    path = save_model(tmp_path / "m.pt", res.model, cfg, g, res.best_state)
    net, back = load_model(path)
    assert back == cfg
    for k, v in net.state_dict().items():
        assert torch.equal(v, res.best_state[k]), k


def test_bad_model_files_and_graphs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="not a readable model file"):
        load_model(junk)
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="not a gnnscale model"):
        load_model(tmp_path / "other.pt")
    g = csbm(nodes=300, avg_degree=4, features=8, seed=0)
    cfg = TrainConfig(hidden=8, epochs=1)
    path = save_model(tmp_path / "m.pt", train(g, cfg, "cpu").model, cfg, g)
    with pytest.raises(GraphError, match="the model takes 8 features"):
        predict(csbm(nodes=300, avg_degree=4, features=6, seed=0), path, "cpu")
    for argv, message in (
        (["--model", str(junk), "--out", str(tmp_path / "p.npy")], "not a readable model file"),
        (["--model", str(path), "--out", str(tmp_path / "p.txt")], "give a .npy, .pt or .csv file"),
        (["--model", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "p.npy")], "no such file"),
        (["--model", str(path), "--out", str(tmp_path / "p.npy"), "--engine", "distributed"], "only trains"),
    ):
        assert main(["predict", "--dataset", "csbm:nodes=300,features=8", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "p.npy").exists() and not (tmp_path / "p.txt").exists()


def test_checkpoint_folder_keeps_the_model(tmp_path: Path) -> None:
    g = csbm(nodes=300, avg_degree=4, features=8, seed=0)
    res = train(g, TrainConfig(hidden=8, epochs=3), "cpu", checkpoint=tmp_path / "ck")
    net, _ = load_model(tmp_path / "ck" / "model.pt")
    for k, v in net.state_dict().items():
        assert torch.equal(v, res.best_state[k]), k
