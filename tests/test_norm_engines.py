"""``--norm``, ``--residual`` and ``--jk`` in the engines: LayerNorm and the residuals are per vertex, so every
engine trains them as its reference does; BatchNorm trains in the in-memory engine (statistics over every vertex)
and the mini-batch and hybrid engines (over each batch's rows of a layer; several trainers reduce them:
tests/test_norm_sync.py), with its running statistics in the model; every combination an engine cannot train
exactly yet is refused in one line, exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gnnscale import TrainConfig, load_dataset, train
from gnnscale.cli import main
from gnnscale.graph.block import Block
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model

GNNSCALE = [sys.executable, "-m", "gnnscale"]


def _losses(history: list[dict[str, Any]]) -> list[float]:
    return [r["loss"] for r in history]


def _accuracies(history: list[dict[str, Any]]) -> list[list[float]]:
    return [[r[k] for k in ("train_acc", "val_acc", "test_acc")] for r in history]


@pytest.mark.parametrize(("model", "norm", "residual"), [("gcn", "layer", True), ("gin", "layer", False),
                                                         ("sage", "none", True)])
def test_offload_trains_layer_norm_and_residuals_as_inmemory(model: str, norm: str, residual: bool) -> None:
    g = csbm(nodes=300, features=12, avg_degree=8, seed=2)
    kw: dict[str, Any] = dict(model=model, layers=3, hidden=16, dropout=0.5, seed=1, epochs=2, norm=norm,
                              residual=residual)
    ref = train(g, TrainConfig(engine="inmemory", **kw), "cpu")
    got = train(g, TrainConfig(engine="offload", partitions=2, chunks=8, **kw), "cpu")
    assert _losses(got.history) == pytest.approx(_losses(ref.history), rel=1e-5)
    assert _accuracies(got.history) == _accuracies(ref.history)


def _all_train(g: Graph) -> Graph:
    """``g`` with every vertex a training vertex: one full-fanout batch of them all is the whole graph."""
    g.train_mask, g.val_mask, g.test_mask = torch.ones(g.num_nodes, dtype=torch.bool), None, None
    return g


@pytest.mark.parametrize(("model", "norm", "residual"), [("gcn", "batch", False), ("gin", "batch", True),
                                                         ("sage", "layer", True)])
def test_minibatch_with_one_full_batch_equals_inmemory(model: str, norm: str, residual: bool) -> None:
    """One batch of every vertex with all neighbours: each layer's rows are the whole graph's, so BatchNorm's
    statistics, the running statistics it leaves in the model and what evaluation reads from them are the
    in-memory engine's."""
    g = _all_train(csbm(nodes=300, features=12, avg_degree=6, seed=1))
    kw: dict[str, Any] = dict(model=model, layers=2, hidden=16, dropout=0.5, seed=3, epochs=3, norm=norm,
                              residual=residual)
    ref = train(g, TrainConfig(engine="inmemory", **kw), "cpu")
    got = train(g, TrainConfig(engine="minibatch", batch_size=300, fanouts=(-1, -1), **kw), "cpu")
    assert _losses(got.history) == pytest.approx(_losses(ref.history), rel=1e-5)
    # evaluation reads the running statistics: the running means too are the in-memory run's, since the biases
    # that shift them (just before a BatchNorm) keep exactly zero gradients in both engines
    assert _accuracies(got.history) == _accuracies(ref.history)
    mine, theirs = got.model.state_dict(), ref.model.state_dict()
    stats = [k for k in theirs if "running_var" in k]
    assert stats if norm == "batch" else not stats
    for k in theirs:
        torch.testing.assert_close(mine[k], theirs[k], rtol=1e-4, atol=1e-5, msg=k)
    for k in stats:
        assert int(mine[k.replace("running_var", "num_batches_tracked")]) == 3


def test_minibatch_batch_norm_normalises_each_batch_not_the_graph() -> None:
    """With several batches an epoch's statistics are the batches' (PyG with a NeighborLoader): the running
    statistics then differ from the full-graph run's, and count one update per batch."""
    g = _all_train(csbm(nodes=300, features=12, avg_degree=6, seed=1))
    kw: dict[str, Any] = dict(model="gcn", layers=2, hidden=16, dropout=0.5, seed=3, epochs=1, norm="batch")
    ref = train(g, TrainConfig(engine="inmemory", **kw), "cpu").model.state_dict()
    got = train(g, TrainConfig(engine="minibatch", batch_size=100, fanouts=(-1, -1), **kw), "cpu").model.state_dict()
    assert int(got["norms.0.num_batches_tracked"]) == 3 and int(ref["norms.0.num_batches_tracked"]) == 1
    assert not torch.allclose(got["norms.0.running_mean"], ref["norms.0.running_mean"], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_hybrid_on_one_device_with_drm_off_equals_minibatch(norm: str) -> None:
    g = csbm(nodes=600, features=12, avg_degree=8, seed=5)
    kw: dict[str, Any] = dict(model="sage", layers=2, hidden=16, dropout=0.5, fanouts=(4, 3), seed=2, batch_size=64,
                              epochs=2, norm=norm, residual=True)
    ref = train(g, TrainConfig(engine="minibatch", **kw), "cpu").history
    got = train(g, TrainConfig(engine="hybrid", devices=("cpu",), drm="off", **kw), "cpu").history
    assert _losses(got) == pytest.approx(_losses(ref), rel=1e-5)


def test_hybrid_on_two_devices_equals_minibatch_with_layer_norm() -> None:
    g = csbm(nodes=600, features=12, avg_degree=8, seed=5)
    kw: dict[str, Any] = dict(model="gin", layers=2, hidden=16, dropout=0.5, fanouts=(4, 3), seed=2, batch_size=64,
                              epochs=2, norm="layer", residual=True)
    ref = train(g, TrainConfig(engine="minibatch", **kw), "cpu").history
    got = train(g, TrainConfig(engine="hybrid", devices=("cpu", "cpu:1"), shares=(0.3, 0.7), drm="off", **kw),
                "cpu").history
    assert _losses(got) == pytest.approx(_losses(ref), rel=1e-5)


def test_distributed_with_layer_norm_equals_minibatch(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    args = ["train", "--dataset", "csbm:nodes=400", "--engine", "distributed", "--ranks", "2", "--model", "sage",
            "--norm", "layer", "--residual", "--batch-size", "60", "--fanouts", "5,3", "--epochs", "2", "--quiet",
            "--device", "cpu", "--metrics", str(metrics)]
    p = subprocess.run([*GNNSCALE, *args], capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    got = [json.loads(line) for line in metrics.read_text().splitlines()]
    got = [r for r in got if not r.get("summary")]
    cfg = TrainConfig(engine="minibatch", model="sage", norm="layer", residual=True, batch_size=120, fanouts=(5, 3),
                      epochs=2, seed=0)
    ref = train(load_dataset("csbm:nodes=400"), cfg, "cpu").history  # the graph the CLI loads
    assert _losses(got) == pytest.approx(_losses(ref), rel=1e-5)


REFUSALS = [
    (["--engine", "distributed", "--ranks", "2", "--jk", "cat"],
     "the distributed engine cannot train csbm on cpu: --jk cat:"),
    (["--engine", "taskparallel", "--model", "dgcn", "--jk", "cat"],
     "--residual and --jk apply to the layer-stack models, not the decoupled dgcn"),
]


@pytest.mark.parametrize(("flags", "why"), REFUSALS, ids=[" ".join(f) for f, _ in REFUSALS])
def test_what_an_engine_cannot_train_exactly_is_refused_in_one_line(flags: list[str], why: str,
                                                                    capfd: pytest.CaptureFixture[str]) -> None:
    rc = main(["train", "--dataset", "csbm:nodes=200", "--epochs", "1", "--device", "cpu", "--quiet", *flags])
    err = capfd.readouterr().err
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and why in lines[0], err
    assert "Traceback" not in err


def test_engine_auto_picks_inmemory_for_batch_norm_and_jk(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", "csbm:nodes=200", "--epochs", "1", "--device", "cpu", "--norm", "batch",
                 "--jk", "max", "--model", "gin"]) == 0
    assert "engine inmemory" in capfd.readouterr().out


def test_input_dropout_zero_drops_only_between_layers_in_every_engine() -> None:
    """``--input-dropout 0`` (PyG's ``BasicGNN``): layer 0's input is the features as they are, the hidden layers
    are still dropped; the offload engine trains it as the in-memory one does, and it is another run than the
    default (the features dropped with ``--dropout``)."""
    net = build_model("gcn", 12, 16, 3, layers=2, dropout=0.5, heads=1, seed=0, input_dropout=0.0)
    x, ids = torch.randn(40, 12), torch.arange(40)
    assert torch.equal(net.layer_input(0, x, ids, (1, 1)), x)
    h = torch.rand(40, 16) + 0.1
    assert bool((net.layer_input(1, h, ids, (1, 1)) == 0).any())  # hidden rows still dropped
    assert not torch.equal(build_model("gcn", 12, 16, 3, layers=2, dropout=0.5, heads=1, seed=0)
                           .layer_input(0, x, ids, (1, 1)), x)
    g = csbm(nodes=300, features=12, avg_degree=8, seed=2)
    kw: dict[str, Any] = dict(model="sage", layers=2, hidden=16, dropout=0.5, seed=1, epochs=2)
    ref = train(g, TrainConfig(engine="inmemory", input_dropout=0.0, **kw), "cpu")
    got = train(g, TrainConfig(engine="offload", chunks=4, input_dropout=0.0, **kw), "cpu")
    assert _losses(got.history) == pytest.approx(_losses(ref.history), rel=1e-5)
    assert _losses(train(g, TrainConfig(engine="inmemory", **kw), "cpu").history) != _losses(ref.history)
    assert main(["train", "--dataset", "csbm:nodes=200", "--input-dropout", "1.5", "--epochs", "1"]) == 2


# ------------------------------------------------------------------------------------------------ bias before a norm
BEFORE_NORM = {  # (model, layers, jk): the biases that shift every row just before a BatchNorm
    ("gcn", 3, "none"): {"layers.0.bias", "layers.1.bias"},
    ("sage", 2, "none"): {"layers.0.lin_l.bias"},
    ("gat", 2, "cat"): {"layers.0.bias", "layers.1.bias"},  # with jk every layer's output is normalised
    ("gin", 2, "none"): {"layers.0.mlp.0.bias", "layers.0.mlp.3.bias", "layers.1.mlp.0.bias"},  # and in the MLP
    ("dgcn", 3, "none"): {"layers.0.lin.bias", "layers.1.lin.bias"},  # the hidden T tasks
}


def _biases(model: torch.nn.Module, names: set[str]) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if n in names}


@pytest.mark.parametrize(("model", "layers", "jk"), list(BEFORE_NORM))
def test_the_biases_before_a_batch_norm_change_no_training_output(model: str, layers: int, jk: str) -> None:
    """Shifting one of them changes nothing the norm passes on (its true gradient is zero); shifting any other
    bias does: the list is exactly the biases whose computed gradient is only rounding."""
    g = csbm(nodes=60, features=6, avg_degree=4, seed=0)
    m = build_model(model, 6, 8, 3, layers=layers, dropout=0.0, heads=2, seed=0, norm="batch", jk=jk).train()
    assert {n for n, p in m.named_parameters() if any(p is q for q in m.biases_before_norm())} == BEFORE_NORM[
        (model, layers, jk)]
    block = Block.from_graph(g, m.adjacency)
    assert g.x is not None
    want = m(block, g.x)
    for name, p in m.named_parameters():
        if not name.endswith("bias") or p.dim() != 1:
            continue
        with torch.no_grad():
            p.add_(0.5)
            moved = not torch.allclose(m(block, g.x), want, atol=1e-5)
            p.sub_(0.5)
        assert moved == (name not in BEFORE_NORM[(model, layers, jk)]), name


ENGINES = {  # every engine that trains --norm batch, in a configuration that splits the work
    "inmemory": dict(model="gcn", layers=3),
    "offload": dict(model="gat", engine="offload", chunks=2, jk="cat"),
    "minibatch": dict(model="gin", engine="minibatch", devices=("cpu", "cpu:1"), batch_size=40, fanouts=(4, 3)),
    "hybrid": dict(model="sage", engine="hybrid", devices=("cpu", "cpu:1"), drm="off", batch_size=40,
                   fanouts=(4, 3)),
    "taskparallel": dict(model="dgcn", layers=3, engine="taskparallel", devices=("cpu",) * 3, subgraphs=3),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_engine_keeps_the_biases_before_a_batch_norm(engine: str) -> None:
    """Their gradients are made exactly zero before each step, so Adam does not scale rounding into steps of
    about lr (which moved ``layers.0.bias`` by 0.013 and flipped accuracies between engines): after two epochs
    they hold their initial values to the bit, and their gradients are zeros. (The distributed engine steps
    through the same ``Engine`` optimiser.)"""
    g = csbm(nodes=300, features=12, avg_degree=6, seed=1)
    kw: dict[str, Any] = dict(layers=2, hidden=16, dropout=0.5, seed=3, epochs=2, norm="batch", lr=0.05, heads=2,
                              weight_decay=0.0)  # Adam's L2 term would move them (the same in every engine)
    cfg = TrainConfig(**{**kw, **ENGINES[engine]})
    result = train(g, cfg, "cpu")
    assert result.engine == engine
    names = BEFORE_NORM[(cfg.model, cfg.layers, cfg.jk)]
    assert g.num_classes is not None
    init = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, **cfg.model_kwargs())
    got, want = _biases(result.model, names), _biases(init, names)
    assert got and got.keys() == want.keys()
    for n, p in got.items():
        assert torch.equal(p.detach().cpu(), want[n]), n
        assert p.grad is not None and not p.grad.any(), n
