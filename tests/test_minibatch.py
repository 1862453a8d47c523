"""The mini-batch engine (XGNN): a step with full fanouts equals full-graph training on the batch's seeds; sampled
training reaches full-graph accuracy; the CLI and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gnnscale import TrainConfig, load_dataset, train
from gnnscale.cli import main
from gnnscale.engines import MiniBatchEngine, select_engine
from gnnscale.graph.block import Block
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.store import triton_available
from gnnscale.testing import need_file, only_cuda

CPU = torch.device("cpu")


def _model(g: Graph, cfg: TrainConfig):  # noqa: ANN202
    assert g.num_classes is not None
    return build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                       heads=cfg.heads, seed=cfg.seed)


@pytest.mark.parametrize("model,norm", [("gcn", "graph"), ("gcn", "sampled"), ("sage", "sampled"),
                                        ("gat", "sampled"), ("gin", "sampled")])
def test_full_fanout_step_equals_full_graph_on_the_seeds(model: str, norm: str) -> None:
    """With fanout -1 a step is full-graph training on the seeds, whichever degrees GCN reads."""
    g = csbm(nodes=300, features=12, avg_degree=6, seed=1)
    cfg = TrainConfig(model=model, layers=2, hidden=16, heads=2, dropout=0.5, engine="minibatch", fanouts=(-1, -1),
                      gpu_graph_ratio=0.5, gpu_feature_ratio=0.3, seed=3, sample_norm=norm)
    eng = MiniBatchEngine(g, _model(g, cfg), cfg, CPU)
    ref = _model(g, cfg)
    seeds = torch.tensor([7, 3, 150, 299, 42])
    se = (cfg.seed, 1)
    assert g.x is not None and g.y is not None
    full = ref(Block.from_graph(g, ref.adjacency), g.x, se)[seeds]  # dropout keyed by vertex: the same masks
    F.cross_entropy(full, g.y[seeds]).backward()
    batch = eng._prepare(eng.trainers[0], seeds, (-1, -1), key=0)
    out = eng._forward(batch, se)
    F.cross_entropy(out, g.y[seeds]).backward()
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(ref.named_parameters(), eng.model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_epoch_metrics_and_the_sampling_pipeline() -> None:
    g = csbm(nodes=2000, features=16, avg_degree=8, seed=2)
    cfg = TrainConfig(model="sage", layers=2, hidden=16, engine="minibatch", batch_size=64, fanouts=(5, 3),
                      gpu_graph_ratio=0.2, gpu_feature_ratio=0.4, epochs=2)
    eng = MiniBatchEngine(g, _model(g, cfg), cfg, CPU)
    stats = eng.train_epoch(1)
    assert stats["batches"] == -(-int(g.train_mask.sum()) // 64)  # type: ignore[union-attr]
    # the fanouts bound the sample: 5 edges per seed, then 3 for each of the (seed + 5 neighbours) rows
    assert 0 < stats["sampled_edges"] <= int(g.train_mask.sum()) * (5 + 6 * 3)  # type: ignore[union-attr]
    assert 0 < stats["feature_hit_rate"] < 1 and 0 < stats["graph_hit_rate"] < 1
    for key in ("sample_s", "extract_s", "train_s"):
        assert stats[key] > 0
    # another epoch shuffles differently but deterministically
    again = MiniBatchEngine(g, _model(g, cfg), cfg, CPU)
    assert again.train_epoch(1)["loss"] == stats["loss"]


def _full_fanout_epoch(device: torch.device, gather: str) -> dict[str, float]:
    g = csbm(nodes=2000, features=16, avg_degree=8, seed=2)
    cfg = TrainConfig(model="sage", layers=2, hidden=16, dropout=0.0, engine="minibatch", batch_size=128,
                      fanouts=(-1, -1), gpu_graph_ratio=0.3, gpu_feature_ratio=0.3, gather=gather, seed=1)
    return MiniBatchEngine(g, _model(g, cfg), cfg, device).train_epoch(1)


@only_cuda
@pytest.mark.parametrize("gather", ["index_select", "uva"])
def test_minibatch_on_cuda_trains_like_cpu_with_full_fanouts(gather: str) -> None:
    """The CUDA path (device sampler, host feature rows over PCIe by either gather): with full fanouts the sample
    is not random, so the epoch equals the CPU one up to float rounding."""
    if gather == "uva" and not triton_available():
        pytest.skip("triton is not installed")
    cpu, gpu = _full_fanout_epoch(CPU, "index_select"), _full_fanout_epoch(torch.device("cuda"), gather)
    assert gpu["batches"] == cpu["batches"] and gpu["sampled_edges"] == cpu["sampled_edges"]
    assert gpu["feature_hit_rate"] == pytest.approx(cpu["feature_hit_rate"])
    assert gpu["graph_hit_rate"] == pytest.approx(cpu["graph_hit_rate"])
    assert gpu["h2d_bytes"] > 0  # the cold feature rows came from host memory
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=1e-3)  # two batches, two optimiser steps


def test_a_sampler_failure_reaches_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    g = csbm(nodes=500, features=4, seed=3)
    cfg = TrainConfig(model="gcn", engine="minibatch", batch_size=32)
    eng = MiniBatchEngine(g, _model(g, cfg), cfg, CPU)

    def broken(ids: torch.Tensor) -> None:
        raise RuntimeError("store unavailable")

    monkeypatch.setattr(eng.trainers[0].reader, "request", broken)
    with pytest.raises(RuntimeError, match="store unavailable"):
        eng.train_epoch(1)


def test_auto_never_picks_minibatch() -> None:
    """Sampled training learns from samples, not the full graph: --engine auto considers it only in sampled mode
    (--mode sampled), never when the full-graph engines do not fit."""
    g = csbm(nodes=200, features=4, seed=4)
    with pytest.raises(Exception, match="in full mode") as err:
        select_engine(g, TrainConfig(engine="auto", memory_budget=1), CPU)
    assert "minibatch" not in str(err.value) and "offload" in str(err.value)


def _accuracy_gap(g: Graph, epochs: int, mini_epochs: int | None = None, **kw: object) -> tuple[float, float]:
    base = dict(model="sage", layers=2, hidden=64, dropout=0.5, lr=0.01, seed=0)
    full = train(g, TrainConfig(**base, epochs=epochs, engine="inmemory"), "cpu").summary  # type: ignore[arg-type]
    mini = train(g, TrainConfig(**base, epochs=mini_epochs or epochs, engine="minibatch", **kw),  # type: ignore[arg-type]
                 "cpu").summary
    return full["test_acc_at_best_val"], mini["test_acc_at_best_val"]


def test_sage_minibatch_matches_full_graph_accuracy_on_default_csbm() -> None:
    full, mini = _accuracy_gap(load_dataset("csbm"), epochs=30, batch_size=512, fanouts=(10, 5))
    assert full > 0.8, full  # both learned (5 classes: chance is 0.2), and the sampled model as well as the full one
    assert abs(full - mini) <= 0.02, (full, mini)


def test_sage_minibatch_matches_full_graph_accuracy_on_amazon_computers() -> None:
    # 20 labelled vertices per class: full-graph training takes one step per epoch and needs ~200 to converge;
    # batches of 100 take two steps per epoch
    g = load_dataset(f"npz:{need_file('gnn-benchmark/amazon_electronics_computers.npz')}")
    full, mini = _accuracy_gap(g, epochs=300, mini_epochs=150, batch_size=100, fanouts=(15, 10))
    assert full > 0.75, full
    assert abs(full - mini) <= 0.02, (full, mini)


def test_cli_minibatch_writes_its_counters(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", "csbm:nodes=600,features=8", "--engine", "minibatch", "--fanouts", "4,3",
                 "--batch-size", "50", "--gpu-feature-ratio", "0.5", "--epochs", "1", "--quiet",
                 "--metrics", str(metrics)]) == 0
    rec = json.loads(metrics.read_text().splitlines()[0])
    for key in ("sample_s", "extract_s", "train_s", "sampled_edges", "feature_hit_rate", "graph_hit_rate",
                "h2d_bytes"):
        assert key in rec, key


def test_sampled_evaluation_with_full_fanouts_equals_layerwise_inference() -> None:
    g = csbm(nodes=600, features=8, avg_degree=6, seed=5)
    exact = TrainConfig(model="sage", layers=2, hidden=16, engine="minibatch", batch_size=100, fanouts=(5, 5))
    sampled = TrainConfig(**{**exact.__dict__, "eval_fanouts": (-1, -1)})
    a, b = MiniBatchEngine(g, _model(g, exact), exact, CPU), MiniBatchEngine(g, _model(g, sampled), sampled, CPU)
    a.train_epoch(1), b.train_epoch(1)
    assert a.evaluate() == b.evaluate()
    few = MiniBatchEngine(g, _model(g, exact), TrainConfig(**{**exact.__dict__, "eval_fanouts": (1, 1)}), CPU)
    few.train_epoch(1)
    assert few.evaluate() != a.evaluate()  # one neighbour per hop: a different (sampled) answer


def test_presampled_hotness_puts_the_most_read_vertices_on_the_device() -> None:
    g = csbm(nodes=3000, features=8, avg_degree=8, seed=6)
    base = dict(model="sage", layers=2, hidden=16, engine="minibatch", batch_size=128, fanouts=(5, 5),
                gpu_graph_ratio=0.1, gpu_feature_ratio=0.1)
    hits = {}
    for hotness in ("degree", "presample"):
        cfg = TrainConfig(**base, hotness=hotness)  # type: ignore[arg-type]
        eng = MiniBatchEngine(g, _model(g, cfg), cfg, CPU)
        hits[hotness] = eng.train_epoch(1)["feature_hit_rate"]
    counts = eng.presampled_hotness()
    hot = eng.store.rank < eng.store.hot_features
    assert float(counts[hot].min()) >= float(counts[~hot].max())  # ranked by the counts
    # the training seeds and their neighbourhoods are what an epoch reads: counting them beats degree
    assert hits["presample"] > hits["degree"], hits
