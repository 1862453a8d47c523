"""``--norm`` in the task-parallel engine: the decoupled models normalise between their T tasks' linear layers (PyG's
MLP order), and the engine, which runs the T tasks subgraph by subgraph on several devices, trains them as the
in-memory engine does: BatchNorm's statistics and gradient sums over every vertex (statistics and gradient-sums
passes, engines/taskparallel/norm.py), the running statistics the same, LayerNorm per row as it is. A run whose
statistics come from one subgraph only is another run, and the tests see it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_fullgraph_sim import _masked_block
from torch import Tensor, nn

import gnnscale.runtime as rt
from gnnscale import TrainConfig, train
from gnnscale.cli import main
from gnnscale.engines import InMemoryEngine, TaskParallelEngine
from gnnscale.engines.taskparallel.norm import NormPasses
from gnnscale.errors import ConfigError
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.batchnorm import SplitBatchNorm
from gnnscale.nn.decoupled import DecoupledGNN

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def graph() -> Graph:
    return csbm(nodes=240, avg_degree=6, features=12, classes=4, seed=3)


def _config(kind: str, layers: int = 2, devices: int = 3, norm: str = "batch", **kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(model=kind, layers=layers, hidden=16, dropout=0.5, engine="taskparallel",
                                devices=("cpu",) * devices, subgraphs=3, norm=norm, lr=0.05, seed=1)
    base.update(kw)
    return TrainConfig(**base)


def _inmemory(cfg: TrainConfig) -> TrainConfig:
    return replace(cfg, engine="inmemory", devices=None)


def _model(g: Graph, cfg: TrainConfig) -> DecoupledGNN:
    assert g.num_classes is not None
    m = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, **cfg.model_kwargs())
    assert isinstance(m, DecoupledGNN)
    return m


def _grads(m: nn.Module) -> list[Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]


def _assert_grads(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), q in zip(ref.named_parameters(), got.parameters(), strict=True):
        a = p.grad if p.grad is not None else torch.zeros_like(p)
        b = q.grad if q.grad is not None else torch.zeros_like(q)
        assert float((a - b).abs().max()) <= 1e-4 * max(1.0, float(a.abs().max())), name


def _assert_buffers(ref: nn.Module, got: nn.Module) -> None:
    """Every buffer, the running means too: the T tasks' biases before a BatchNorm, which shift them, have exactly
    zero gradients in every engine (``GNN.biases_before_norm``), so they do not drift apart."""
    bufs = dict(got.named_buffers())
    assert set(bufs) == {n for n, _ in ref.named_buffers()}
    for name, b in ref.named_buffers():
        torch.testing.assert_close(bufs[name], b, rtol=1e-5, atol=1e-6, msg=name)


def _history(result: Any) -> tuple[list[float], list[list[float]]]:
    return ([r["loss"] for r in result.history],
            [[r[k] for k in ("train_acc", "val_acc", "test_acc")] for r in result.history])


# ------------------------------------------------------------------------------------------------ the model
def test_decoupled_models_take_a_norm_between_their_t_tasks(graph: Graph) -> None:
    """PyG's MLP order: linear -> norm -> activation -> dropout, none after the last linear layer; the other
    weights are those of the model without norms (same seed)."""
    for norm, cls in (("batch", SplitBatchNorm), ("layer", nn.LayerNorm), ("none", nn.Identity)):
        m = _model(graph, _config("dgat", layers=3, norm=norm))
        assert len(m.norms) == 2 and all(type(n) is cls for n in m.norms)
    plain, normed = _model(graph, _config("dgcn", norm="none")), _model(graph, _config("dgcn"))
    assert "norms.0.running_mean" in normed.state_dict()
    for name, p in plain.named_parameters():
        torch.testing.assert_close(normed.get_parameter(name), p)
    # T task 1 = relu(norm(T task 0's output)) -> dropout -> linear
    m = _model(graph, _config("dgcn", norm="layer", dropout=0.0)).eval()
    assert graph.x is not None
    x = graph.x.float()
    h0 = m.layers[0].lin(x)
    want = m.layers[1].lin(F.relu(m.norms[0](h0)))
    torch.testing.assert_close(m.transform(x, torch.arange(graph.num_nodes), None), want)


def test_residual_and_jk_are_still_refused_for_decoupled_models() -> None:
    TrainConfig(model="dgcn", norm="batch")
    with pytest.raises(ConfigError, match="--residual and --jk apply to the layer-stack models"):
        TrainConfig(model="dgat", jk="cat")
    with pytest.raises(ConfigError, match="--residual"):
        build_model("dgcn", 4, 8, 2, layers=2, dropout=0.5, heads=1, seed=0, residual=True)


# ------------------------------------------------------------------------------------------------ exactness
CASES = [  # (layers, devices, extra): one T stage on one device; a T group of two; two T stages (hand-offs)
    (2, 3, {}),
    (2, 4, {"t_devices": 2}),
    (3, 4, {"t_devices": 2, "subgraphs": 4}),
]


@pytest.mark.parametrize(("layers", "devices", "extra"), CASES, ids=["1stage", "tgroup", "2stages"])
@pytest.mark.parametrize("kind", ["dgcn", "dgat"])
def test_batch_norm_equals_inmemory_per_epoch(graph: Graph, kind: str, layers: int, devices: int,
                                              extra: dict[str, Any]) -> None:
    """Every epoch's loss (1e-5 relative) and accuracies, then the weights and the running statistics."""
    cfg = _config(kind, layers, devices, epochs=3, **extra)
    ref = train(graph, _inmemory(cfg), "cpu")
    got = train(graph, cfg, "cpu")
    assert got.engine == "taskparallel" and ref.engine == "inmemory"
    (ref_loss, ref_acc), (loss, acc) = _history(ref), _history(got)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert acc == ref_acc
    assert all(r["norm_passes"] == 2 * (layers - 1) for r in got.history)
    assert all(r["norm_reduced_bytes"] > 0 for r in got.history)
    for (name, p), q in zip(ref.model.named_parameters(), got.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)  # the biases before a norm too
    _assert_buffers(ref.model, got.model)
    assert int(got.model.norms[0].num_batches_tracked) == 3  # one move per epoch, as one whole-graph call


@pytest.mark.parametrize("kind", ["dgcn", "dgat"])
def test_gradients_and_every_replicas_running_statistics_equal_inmemory(graph: Graph, kind: str) -> None:
    cfg = _config(kind, 3, 4, t_devices=2)
    ref = InMemoryEngine(graph, _model(graph, cfg), cfg, CPU)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    for epoch in (1, 2):
        a, b = ref.train_epoch(epoch)["loss"], eng.train_epoch(epoch)["loss"]
        assert b == pytest.approx(a, rel=1e-5)
        _assert_grads(ref.model, eng.model)
        for r in eng.runners:  # each replica moved its running statistics with the same sums
            _assert_buffers(ref.model, r.model)
    assert eng.evaluate() == ref.evaluate()


def test_layer_norm_equals_inmemory_without_passes(graph: Graph) -> None:
    cfg = _config("dgat", 3, 4, norm="layer", t_devices=2, epochs=2)
    ref = train(graph, _inmemory(cfg), "cpu")
    got = train(graph, cfg, "cpu")
    (ref_loss, ref_acc), (loss, acc) = _history(ref), _history(got)
    assert loss == pytest.approx(ref_loss, rel=1e-5) and acc == ref_acc
    assert all("norm_passes" not in r for r in got.history)


@pytest.mark.parametrize("kind", ["dgcn", "dgat"])
def test_skip_mode_is_the_model_on_the_masked_adjacency_with_global_statistics(graph: Graph, kind: str) -> None:
    """``--dependency skip``: the P tasks skip later subgraphs' edges, the T tasks' statistics still span every
    vertex (the T backward waits for every P backward)."""
    cfg = _config(kind, 2, 3, dependency="skip", subgraphs=4)
    ref = InMemoryEngine(graph, _model(graph, cfg), cfg, CPU)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    for epoch in (1, 2):
        ref.block = _masked_block(graph, ref.model, eng.subgraph_of_vertex(epoch))
        a, b = ref.train_epoch(epoch)["loss"], eng.train_epoch(epoch)["loss"]
        assert b == pytest.approx(a, rel=1e-5)
        _assert_grads(ref.model, eng.model)
    _assert_buffers(ref.model, eng.model)


# ------------------------------------------------------------------------------------------------ one subgraph's
def test_statistics_from_one_subgraph_only_are_another_run(graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the passes each T stage normalises a subgraph with that subgraph's own statistics (plain BatchNorm
    on its rows): the loss leaves the in-memory engine's by far more than the 1e-5 the exact run keeps, so the
    equality tests above fail for an engine that takes its statistics from one chunk."""
    cfg = _config("dgcn", 2, 3, subgraphs=4)
    ref = InMemoryEngine(graph, _model(graph, cfg), cfg, CPU)
    exact = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    a = ref.train_epoch(1)["loss"]
    assert exact.train_epoch(1)["loss"] == pytest.approx(a, rel=1e-5)
    monkeypatch.setattr(NormPasses, "statistics", lambda self, se: None)
    monkeypatch.setattr(NormPasses, "gradient_sums", lambda self, se: None)
    local = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    b = local.train_epoch(1)["loss"]
    assert abs(b - a) > 1e-3 * a, (a, b)


def test_every_t_forward_normalises_with_all_vertices_statistics(graph: Graph) -> None:
    """When any subgraph's T forward starts, every replica's norm holds the statistics of all N vertices from one
    statistics pass over every subgraph (one ``TS`` operation per subgraph and stage up to the norm's input), and
    the gradient-sums pass runs over every subgraph too (``TG``)."""
    cfg = _config("dgcn", 3, 4, t_devices=2, subgraphs=4)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    counts: list[float] = []

    def seen(stage: int, s: int) -> None:
        counts.extend(r.model.norms[j].count for r in eng.runners for j in (0, 1))  # type: ignore[misc]

    eng.tasks.hooks["t_forward"] = seen
    eng.tasks.trace = []
    eng.train_epoch(1)
    assert counts and set(counts) == {float(graph.num_nodes)}
    ops = [op for op, _, _ in eng.tasks.trace]
    # norm 0 (T task 0's output, stage 0): 4 subgraphs x stage 0; norm 1 (stage 1): 4 x stages 0-1
    assert ops.count("TS") == 4 * 1 + 4 * 2
    # norm 1 (applied in stage 1): recompute stage 0, back through stage 1; norm 0 (applied in stage 1 too)
    assert ops.count("TG") == 4 * 2 + 4 * 2
    assert all(bn.mode is None for r in eng.runners for bn in r.model.norms)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------ running stats
def test_replicas_take_a_loaded_models_running_statistics(graph: Graph) -> None:
    """Evaluation runs the T stages on the replicas: a model loaded into the master (a checkpoint) reaches them."""
    cfg = _config("dgat", 3, 4, t_devices=2)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    for epoch in (1, 2, 3):
        eng.train_epoch(epoch)
    fresh = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    fresh.model.load_state_dict(eng.model.state_dict())
    assert torch.equal(fresh.predict(), eng.predict())
    for r in fresh.runners:
        _assert_buffers(eng.model, r.model)


def test_on_sim_devices_equals_inmemory(graph: Graph, sims: list[rt.SimDevice]) -> None:
    """Two T stages and a P stage on three sim devices (asynchronous copies, stream checks): the passes hand rows
    and gradients between devices and add the sums on the host, exactly."""
    cfg = replace(_config("dgat", 3, 3, t_devices=2), devices=("sim:0", "sim:1", "sim:2"))
    ref = InMemoryEngine(graph, _model(graph, cfg), cfg, CPU)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, sims[0])
    for epoch in (1, 2):
        a, b = ref.train_epoch(epoch)["loss"], eng.train_epoch(epoch)
        assert b["loss"] == pytest.approx(a, rel=1e-5)
        assert b["t2t_bytes"] > 0
        _assert_grads(ref.model, eng.model)
    assert eng.evaluate() == ref.evaluate()


def test_cli_trains_batch_norm_with_taskparallel(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["train", "--dataset", "csbm:nodes=200", "--epochs", "2", "--engine", "taskparallel", "--model", "dgcn",
               "--devices", "cpu,cpu", "--norm", "batch", "--save-model", str(tmp_path / "m.pt")])
    assert rc == 0, capsys.readouterr().err
    assert "engine taskparallel" in capsys.readouterr().out
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    assert state["config"]["norm"] == "batch" and "norms.0.running_var" in state["state_dict"]


def test_the_planner_prices_the_norms() -> None:
    """With a norm, each T device's estimate grows by its norms' rows, saved x-hat and gradients (and, with
    BatchNorm, the last T device by the class-wide gradient held between the gradient-sums pass and the backward):
    a tight budget then takes more subgraphs."""
    from gnnscale.plan.taskparallel import plan_taskparallel

    g = csbm(nodes=2000, features=16, avg_degree=6, seed=0)
    est = {}
    for norm in ("none", "layer", "batch"):
        cfg = TrainConfig(engine="taskparallel", model="dgcn", layers=3, hidden=32, subgraphs=2, norm=norm)
        est[norm] = plan_taskparallel(g, cfg, torch.device("cpu")).estimate
    assert max(est["none"]) < max(est["layer"]) < max(est["batch"])
