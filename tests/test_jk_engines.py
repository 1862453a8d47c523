"""``--jk`` outside the in-memory engine: the sampled forward combines every layer's output at the seeds (the
leading rows of every block), layer-wise evaluation keeps one running table for the head (not one per layer), and
the engines train it as their references do (offload's is in tests/test_norm_offload.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gnnscale import TrainConfig, train
from gnnscale.engines.sampled.eval import layerwise
from gnnscale.graph.block import Block
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.sample import CSRTopology, SampledAdjacency

THREE = ("cpu", "cpu:1", "cpu:2")


def _all_train(g: Graph) -> Graph:
    """Every vertex a training vertex: one full-fanout batch of them all is the whole graph."""
    g.train_mask, g.val_mask, g.test_mask = torch.ones(g.num_nodes, dtype=torch.bool), None, None
    return g


@pytest.mark.parametrize(("model", "jk", "norm"), [("gcn", "cat", "none"), ("sage", "max", "batch"),
                                                   ("gin", "last", "layer")])
def test_minibatch_with_one_full_batch_equals_inmemory(model: str, jk: str, norm: str) -> None:
    """One batch of every vertex with all neighbours: the head sees every layer's rows of the whole graph, as in
    the in-memory engine; evaluation (layer-wise, with the running head) gives its accuracies."""
    g = _all_train(csbm(nodes=300, features=12, avg_degree=6, seed=1))
    kw: dict[str, Any] = dict(model=model, layers=3, hidden=16, dropout=0.5, seed=3, epochs=2, norm=norm, jk=jk)
    ref = train(g, TrainConfig(engine="inmemory", **kw), "cpu")
    got = train(g, TrainConfig(engine="minibatch", batch_size=300, fanouts=(-1, -1, -1), **kw), "cpu")
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-5)
    assert [r["train_acc"] for r in got.history] == pytest.approx([r["train_acc"] for r in ref.history], abs=2 / 300)


@pytest.mark.parametrize("jk", ["cat", "max", "last"])
def test_layerwise_inference_with_a_running_head_equals_the_whole_graph(jk: str) -> None:
    """Layer-wise inference (every vertex, and only some targets' neighbourhoods) equals the model on the whole
    graph, row for row: the running sum of ``lin``'s shares (cat) or maximum (max) is the head."""
    g = csbm(nodes=400, features=10, avg_degree=5, seed=4)
    model = build_model("sage", g.num_features, 12, g.num_classes, layers=3, dropout=0.5, heads=1, seed=0,
                        norm="batch", jk=jk)
    model.eval()
    with torch.no_grad():
        want = model(Block.from_graph(g, model.adjacency), g.x)
    topo = CSRTopology.from_graph(g, model.adjacency)
    adjacency = SampledAdjacency.from_graph(g, model.adjacency)
    assert g.x is not None
    x = g.x
    got = layerwise(model, topo, lambda ids: x[ids], g.num_nodes, adjacency, batch_size=64, device=torch.device("cpu"))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    targets = torch.tensor([3, 50, 51, 399])
    pred = layerwise(model, topo, lambda ids: x[ids], g.num_nodes, adjacency, batch_size=64,
                     device=torch.device("cpu"), targets=targets)
    assert torch.equal(pred[targets], want[targets].argmax(-1))
    assert bool((pred[torch.ones(g.num_nodes, dtype=torch.bool).index_fill_(0, targets, False)] == -1).all())


def test_three_trainers_with_jk_and_batch_norm_equal_one() -> None:
    """The head's norm (the last layer's output, at the seeds) is reduced over the trainers like the others."""
    g = csbm(nodes=600, features=12, avg_degree=8, seed=5)
    kw: dict[str, Any] = dict(model="gcn", layers=2, hidden=16, dropout=0.5, fanouts=(4, 3), seed=2, batch_size=29,
                              epochs=2, norm="batch", jk="cat")
    ref = train(g, TrainConfig(engine="minibatch", **kw), "cpu")
    got = train(g, TrainConfig(engine="minibatch", devices=THREE, **kw), "cpu")
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-5)
