"""``--norm batch`` in the offload engine: a statistics pass and a gradient-sums pass over the chunks per BatchNorm
make every chunk normalise (and backpropagate) with the whole layer's statistics, so an epoch equals the in-memory
engine's; the statistics span every vertex, not one chunk's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gnnscale import TrainConfig, train
from gnnscale.engines.offload.layers import LayerPasses
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.nn.batchnorm import SplitBatchNorm
from gnnscale.plan.offload import chunk_peak_bytes, norm_bytes


def _graph() -> Any:
    return csbm(nodes=300, features=12, avg_degree=8, seed=2)


def _kw(model: str, residual: bool = False, layers: int = 2) -> dict[str, Any]:
    return dict(model=model, layers=layers, hidden=16, dropout=0.5, seed=1, epochs=2, norm="batch",
                residual=residual)


@pytest.mark.parametrize(("model", "residual", "layers", "passes"), [("gcn", False, 2, 2), ("sage", True, 2, 2),
                                                                     ("gat", False, 2, 2), ("gin", True, 3, 10)])
def test_offload_batch_norm_equals_inmemory(model: str, residual: bool, layers: int, passes: int) -> None:
    """Losses per epoch within 1e-5, the accuracies equal, every weight and running statistic (in the model, so in
    checkpoints and evaluation) as the in-memory run's -- the biases just before a BatchNorm and the running means
    they shift too (their gradients are exactly zero in every engine: ``GNN.biases_before_norm``); one statistics
    and one gradient-sums pass per norm (GIN: two norms a layer, its MLP's and the layer output's, one in the last
    layer)."""
    g = _graph()
    ref = train(g, TrainConfig(engine="inmemory", **_kw(model, residual, layers)), "cpu")
    got = train(g, TrainConfig(engine="offload", partitions=2, chunks=3, **_kw(model, residual, layers)), "cpu")
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-5)
    for k in ("train_acc", "val_acc", "test_acc"):
        assert [r[k] for r in got.history] == [r[k] for r in ref.history], k
    assert all(r["norm_passes"] == passes for r in got.history)
    assert all(r["norm_reduced_bytes"] > 0 for r in got.history)
    mine, theirs = got.model.state_dict(), ref.model.state_dict()
    assert mine.keys() == theirs.keys()
    for k, t in theirs.items():
        torch.testing.assert_close(mine[k], t, rtol=1e-4, atol=1e-5, msg=k)
    for k in (k for k in theirs if "running_var" in k):
        assert int(mine[k.replace("running_var", "num_batches_tracked")]) == 2


def test_two_workers_add_their_statistics() -> None:
    """Two CPU workers, each with its replica and half of the chunks: their moments and gradient sums are added
    before any chunk normalises, so the epoch is still the in-memory engine's."""
    g = _graph()
    kw = _kw("gin", layers=3)
    ref = train(g, TrainConfig(engine="inmemory", **kw), "cpu")
    got = train(g, TrainConfig(engine="offload", partitions=2, chunks=3, devices=("cpu", "cpu"), **kw), "cpu")
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-5)


def test_the_statistics_span_every_vertex(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every frozen statistic counts all vertices (not one chunk's), and without the passes (each chunk its own
    BatchNorm) the losses leave the in-memory run's: the equality above can see a missing pass."""
    g = _graph()
    counts: list[float] = []
    end_stats = SplitBatchNorm.end_stats

    def counting(self: SplitBatchNorm, reduce: Any = None) -> None:
        end_stats(self, reduce)
        counts.append(self.count)

    monkeypatch.setattr(SplitBatchNorm, "end_stats", counting)
    kw = _kw("gcn")
    ref = train(g, TrainConfig(engine="inmemory", **kw), "cpu")
    got = train(g, TrainConfig(engine="offload", partitions=2, chunks=3, **kw), "cpu")
    assert counts and set(counts) == {float(g.num_nodes)}
    monkeypatch.setattr(LayerPasses, "_statistics", lambda self, layer, run: None)
    monkeypatch.setattr(LayerPasses, "_gradient_sums", lambda self, layer, run: None)
    per_chunk = train(g, TrainConfig(engine="offload", partitions=2, chunks=3, **kw), "cpu")
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-5)
    assert [r["loss"] for r in per_chunk.history] != pytest.approx([r["loss"] for r in ref.history], rel=1e-3)


def test_the_planner_prices_the_norms() -> None:
    """Each norm adds its normalised rows, what backward saves and their gradient per chunk destination (GIN: its
    MLP's norm too), and the chunk peak grows by them: a tight budget cuts chunks for them."""
    V, R, E = 400, 900, 4000
    for kind, per_layer in (("gcn", [1, 1, 0]), ("gin", [2, 2, 1])):
        plain = build_model(kind, 12, 16, 4, layers=3, dropout=0.5, heads=1, seed=0)
        normed = build_model(kind, 12, 16, 4, layers=3, dropout=0.5, heads=1, seed=0, norm="batch")
        widths = [layer.out_features for layer in normed.block_layers]
        expected = [12 * V * w * n for w, n in zip(widths, per_layer, strict=True)]
        assert [norm_bytes(normed, l, V) for l in range(3)] == expected
        assert all(norm_bytes(plain, l, V) == 0 for l in range(3))
        assert chunk_peak_bytes(normed, V, R, E) > chunk_peak_bytes(plain, V, R, E)


@pytest.mark.parametrize(("model", "jk", "norm"), [("gcn", "cat", "none"), ("sage", "max", "batch"),
                                                   ("gin", "last", "layer")])
def test_offload_trains_jumping_knowledge_as_inmemory(model: str, jk: str, norm: str) -> None:
    """``--jk``: the last layer's pass reads every earlier layer's stored output beside it, the head's gradient
    goes back into each of them, and prediction combines them the same way."""
    g = _graph()
    kw = dict(model=model, layers=3, hidden=16, dropout=0.5, seed=1, epochs=2, norm=norm, jk=jk)
    ref = train(g, TrainConfig(engine="inmemory", **kw), "cpu")
    got = train(g, TrainConfig(engine="offload", partitions=2, chunks=3, **kw), "cpu")
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-5)
    assert [r["test_acc"] for r in got.history] == pytest.approx([r["test_acc"] for r in ref.history], abs=0.02)
    assert got.model.lin is not None
    torch.testing.assert_close(got.model.lin.weight, ref.model.lin.weight, rtol=1e-4, atol=1e-5)
