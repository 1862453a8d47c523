"""How the sampled engines evaluate a graph read from disk (issue #29): exact layer-wise inference, unless it would
read many times the feature rows of sampled inference (:data:`~gnnscale.engines.sampled.eval.EVAL_READ_RATIO`):
layer-wise inference reads the labelled vertices' whole two-hop neighbourhoods at random, which a disk serves at a
few thousand rows a second. The choice is counted from the graph's degrees, not timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.engines import ENGINES
from gnnscale.engines.sampled.eval import SampledInference, eval_reads
from gnnscale.graph import Graph, io
from gnnscale.nn import build_model

CPU = torch.device("cpu")
HUBS, TARGETS, N = 10, 10, 2000


def test_eval_reads_counts_the_first_layer_s_neighbourhoods_and_the_sampled_tree() -> None:
    degree = torch.tensor([3, 1, 0, 2])
    # rows 0 and 2 read their 3 + 0 in-neighbours and themselves; 2 seeds sample 2, then 3 each
    assert eval_reads(degree, torch.tensor([0, 2]), 2, (2, 3)) == (5, 2 + 4 + 12)
    assert eval_reads(degree, None, 2, (2,)) == (6 + 4, 2 + 4)  # every vertex
    assert eval_reads(degree, None, 2, (-1,)) == (10, 2 + 3)  # -1: the mean degree, 1.5


def _hub_graph() -> Graph:
    """Labelled vertices ``100..109`` read the hubs ``0..9``, each of which every vertex points to: layer-wise
    inference reads ``HUBS x N`` rows, sampled inference a few per labelled vertex."""
    src = [v for _ in range(HUBS) for v in range(N)] + [h for _ in range(TARGETS) for h in range(HUBS)]
    dst = [h for h in range(HUBS) for _ in range(N)] + [t for t in range(100, 100 + TARGETS) for _ in range(HUBS)]
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(N, dtype=torch.bool)
    train, val, test = mask.clone(), mask.clone(), mask.clone()
    train[100:104], val[104:107], test[107:110] = True, True, True
    return Graph.from_edge_index(torch.tensor([src, dst]), N, x=torch.randn(N, 8, generator=g),
                                 y=torch.randint(0, 3, (N,), generator=g), train_mask=train, val_mask=val,
                                 test_mask=test, name="hubs")


@pytest.fixture(scope="module")
def hubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("disk_eval") / "hubs"
    io.save(_hub_graph(), out)
    return out


def _engine(gdir: Path, **kw: Any) -> Any:
    g = io.open_dir(gdir)
    cfg = TrainConfig(engine="minibatch", model="sage", layers=2, hidden=8, seed=1, fanouts=(2, 2), **kw)
    assert g.num_classes is not None
    net = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=2, dropout=cfg.dropout,
                      heads=cfg.heads, seed=1)
    return ENGINES["minibatch"](g, net, cfg, CPU)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Which inference each evaluation ran: ``"layerwise"`` or the fanouts of a sampled one."""
    seen: list[Any] = []
    layerwise, sampled = SampledInference.layerwise, SampledInference.sampled

    def spy_layerwise(self: SampledInference, targets: Any = None) -> Any:
        seen.append("layerwise")
        return layerwise(self, targets)

    def spy_sampled(self: SampledInference, ids: Any, fanouts: Any, key: int) -> Any:
        seen.append(fanouts)
        return sampled(self, ids, fanouts, key)

    monkeypatch.setattr(SampledInference, "layerwise", spy_layerwise)
    monkeypatch.setattr(SampledInference, "sampled", spy_sampled)
    return seen


def test_from_disk_a_costly_layerwise_evaluation_samples_with_the_training_fanouts(
        hubs: Path, calls: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    eng = _engine(hubs, host_memory="2MB")
    assert eng.tier is not None
    layerwise, sampled = eng.inference.reads(torch.arange(100, 110), eng.graph.in_degree(), (2, 2))
    assert layerwise == HUBS * (N + 1) + TARGETS * (HUBS + 1) and sampled == TARGETS * 7
    eng.train_epoch(1)
    first, second = eng.evaluate(), eng.evaluate()
    assert calls == [(2, 2), (2, 2)] and first == second  # chosen once, the same keyed sample each time
    err = capsys.readouterr().err
    assert err.count("evaluation samples with the training fanouts 2,2") == 1 and f"{layerwise:,}" in err


@pytest.mark.parametrize("kw, want", [({}, "layerwise"),  # in RAM: exact, whatever it reads
                                      ({"host_memory": "2MB", "eval_fanouts": (3, 3)}, (3, 3))])
def test_in_ram_or_with_eval_fanouts_the_choice_is_not_made(hubs: Path, calls: list[Any], kw: dict[str, Any],
                                                             want: Any) -> None:
    eng = _engine(hubs, **kw)
    eng.evaluate()
    assert calls == [want]


def test_from_disk_a_cheap_layerwise_evaluation_stays_exact(tmp_path: Path, calls: list[Any]) -> None:
    g = _hub_graph()
    for m in ("train_mask", "val_mask", "test_mask"):  # every vertex labelled: layer-wise reads E + N rows
        setattr(g, m, torch.arange(N) % 3 == ("train_mask", "val_mask", "test_mask").index(m))
    io.save(g, tmp_path / "g")
    eng = _engine(tmp_path / "g", host_memory="2MB")
    eng.evaluate()
    assert calls == ["layerwise"]
