"""Layer-wise evaluation computes only what the evaluated vertices read (ogbn-papers100M labels 1.3% of its vertices),
with the same predictions as computing every vertex."""

from __future__ import annotations

import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.engines import MiniBatchEngine
from gnnscale.engines.sampled import eval as sampled_eval
from gnnscale.graph.generators import kronecker
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model

CPU = torch.device("cpu")


def _engine(g: Graph, cfg: TrainConfig) -> MiniBatchEngine:
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return MiniBatchEngine(g, model, cfg, CPU)


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_targeted_layerwise_predicts_as_every_vertex_and_computes_fewer_rows(model: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    g = kronecker(scale=10, features=8, train=0.02, val=0.01, test=0.01)
    cfg = TrainConfig(engine="minibatch", model=model, layers=3, hidden=8, epochs=1, batch_size=16)
    eng = _engine(g, cfg)
    eng.model.eval()
    targets = sampled_eval.eval_ids(eng.masks)
    rows: list[int] = []
    real = sampled_eval.sample_blocks

    def counting(topo, seeds, fanouts, key=0, adjacency=None):  # type: ignore[no-untyped-def]
        rows.append(int(seeds.numel()))
        return real(topo, seeds, fanouts, key, adjacency)

    need = sampled_eval.needed_rows(eng.inference.topology, targets, 3, eng.adjacency.exact(), 1 << 20, CPU,
                                    g.num_nodes)
    assert need[-1] is not None and need[1] is not None  # the upper layers compute a subset
    sizes = [g.num_nodes if n is None else n.numel() for n in need]
    with torch.no_grad():
        full = eng.inference.layerwise()
        monkeypatch.setattr(sampled_eval, "sample_blocks", counting)
        pred = eng.inference.layerwise(targets)
    assert pred.shape == (g.num_nodes,) and pred.dtype == torch.int64
    assert torch.equal(pred[targets], full.argmax(-1)[targets])
    outside = torch.ones(g.num_nodes, dtype=torch.bool)
    outside[targets] = False
    assert bool((pred[outside] == -1).all())
    # the last layer computes the targets only; every layer fewer rows than the 3 x N of the full pass
    assert sizes[-1] == targets.numel() and sizes[0] <= g.num_nodes
    assert all(a >= b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    computed = sum(sizes)
    assert computed < 3 * g.num_nodes
    expanded = sum(n.numel() for n in need[1:] if n is not None)  # the sets' pass reads each upper layer once
    assert sum(rows) == computed + expanded


def test_evaluate_uses_the_targeted_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    g = kronecker(scale=8, features=4, train=0.05, val=0.05, test=0.05)
    cfg = TrainConfig(engine="minibatch", model="sage", hidden=8, epochs=1, batch_size=16)
    eng = _engine(g, cfg)
    seen: list[object] = []
    real = eng.inference.layerwise
    monkeypatch.setattr(eng.inference, "layerwise", lambda targets=None: seen.append(targets) or real(targets))
    accs = eng.evaluate()
    assert seen and seen[0] is not None and int(seen[0].numel()) < g.num_nodes  # type: ignore[attr-defined]
    assert accs["test_acc"] is not None


def test_targets_covering_most_of_the_graph_compute_every_vertex_without_a_neighbourhood_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    g = kronecker(scale=9, features=8)  # the default split: every vertex is in a mask
    cfg = TrainConfig(engine="minibatch", model="sage", hidden=8, epochs=1, batch_size=16)
    eng = _engine(g, cfg)
    eng.model.eval()
    targets = sampled_eval.eval_ids(eng.masks)
    assert targets.numel() > sampled_eval.ALL_ROWS_SHARE * g.num_nodes
    calls: list[int] = []
    real = sampled_eval.sample_blocks
    monkeypatch.setattr(sampled_eval, "sample_blocks",
                        lambda topo, seeds, fanouts, key=0, adjacency=None: calls.append(int(seeds.numel()))
                        or real(topo, seeds, fanouts, key, adjacency))
    with torch.no_grad():
        pred = eng.inference.layerwise(targets)
        full_calls = list(calls)
        calls.clear()
        full = eng.inference.layerwise()
    assert full_calls == calls  # the same steps as the plain pass: no neighbourhood pass
    assert torch.equal(pred[targets], full.argmax(-1)[targets])
