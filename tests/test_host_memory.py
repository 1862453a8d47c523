"""Host memory is priced before any work (issue #28, item 8): every engine's estimate of what it keeps in host memory
is checked against what the machine has, and a run that cannot fit is one error naming both, instead of a
traceback from the allocator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gnnscale as gs
import gnnscale.runtime as rt
from gnnscale import TrainConfig
from gnnscale.cli import main
from gnnscale.engines import ENGINES, OffloadEngine, select_engine
from gnnscale.errors import EngineError
from gnnscale.graph import io
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.plan.memory import estimate_host_bytes
from gnnscale.units import format_bytes

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def graph() -> gs.Graph:
    return csbm(nodes=400, features=16, avg_degree=4, classes=3, seed=0)


def _available(monkeypatch: pytest.MonkeyPatch, host_bytes: int) -> None:
    """The host reports ``host_bytes`` available (devices other than the CPU are left alone)."""
    real = rt.mem_get_info

    def fake(device: rt.Device) -> tuple[int, int]:
        if isinstance(device, torch.device) and device.type == "cpu":
            return host_bytes, host_bytes
        return real(device)

    monkeypatch.setattr(rt, "mem_get_info", fake)


def test_the_estimate_counts_the_model_and_each_engines_host_rows(graph: gs.Graph) -> None:
    cfg = TrainConfig(hidden=32, layers=3)
    n, f, c = graph.num_nodes, graph.num_features, graph.num_classes
    params = f * 32 + 32 * 32 + 32 * c
    assert estimate_host_bytes(graph, cfg, layer_copies=0) == {"model": 16 * params}
    one = estimate_host_bytes(graph, cfg, layer_copies=1)
    two = estimate_host_bytes(graph, cfg, layer_copies=2)
    assert one["activations"] == 4 * n * (32 + 32)
    assert two["activations"] == 2 * 4 * n * (32 + 32) + 4 * n * f  # input and gradient, and the features' copy
    assert {name: cls.host_layer_copies for name, cls in ENGINES.items()} == {
        "inmemory": 0, "taskparallel": 2, "offload": 2, "minibatch": 1, "hybrid": 1, "distributed": 1}


def test_offloads_estimate_is_a_lower_bound_of_what_it_allocates(graph: gs.Graph) -> None:
    cfg = TrainConfig(engine="offload", hidden=32, layers=3, chunks=2)
    model = build_model("gcn", graph.num_features, 32, graph.num_classes or 1, layers=3, dropout=0.5, heads=1, seed=0)
    eng = OffloadEngine(graph, model, cfg, CPU)
    rows = eng.host
    allocated = sum(t.numel() * 4 for d in (rows.inputs, rows.input_grads, rows.projected, rows.projected_grads,
                                          rows.aggregates) for t in d.values())
    est = estimate_host_bytes(graph, cfg, layer_copies=2)["activations"] - 4 * graph.num_nodes * graph.num_features
    assert 0 < est <= allocated


@pytest.mark.parametrize("engine", ["offload", "taskparallel", "minibatch", "hybrid"])
def test_an_engine_that_cannot_fit_in_host_memory_is_refused_naming_both(
        graph: gs.Graph, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = "dgcn" if engine == "taskparallel" else "gcn"
    cfg = TrainConfig(engine=engine, model=model, hidden=256, devices=("cpu",) if engine == "hybrid" else None)
    need = sum(estimate_host_bytes(graph, cfg, layer_copies=ENGINES[engine].host_layer_copies).values())
    _available(monkeypatch, need - 1)
    with pytest.raises(EngineError, match="of host memory") as info:
        select_engine(graph, cfg, CPU)
    assert f"needs about {format_bytes(need)} of host memory" in str(info.value)
    assert f"more than is available ({format_bytes(need - 1)})" in str(info.value)
    _available(monkeypatch, need)
    assert select_engine(graph, cfg, CPU)[0] is ENGINES[engine]


def test_the_cli_says_it_in_one_line_before_training(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _available(monkeypatch, 1 << 20)  # 1 MiB: the in-memory engine does not fit either
    assert main(["train", "--dataset", "csbm:nodes=300,features=8", "--hidden", "4096", "--epochs", "1",
                 "--device", "cpu", "--metrics", "/dev/null"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no engine can train")
    assert "offload: " in err[0] and "of host memory" in err[0]
    assert "more than is available (1.0 MiB)" in err[0]


# --host-memory and --scratch across the commands (issue #44, item 20)
@pytest.fixture(scope="module")
def gdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostmem_cli") / "g"
    io.save(csbm(nodes=2000, features=64, avg_degree=5, seed=2), out)
    return out


def test_auto_takes_an_engine_that_honours_the_host_budget(gdir: Path) -> None:
    g = io.open_dir(gdir)
    assert select_engine(g, TrainConfig(), CPU)[0] is ENGINES["inmemory"]
    chosen, rejected = select_engine(g, TrainConfig(host_memory="4MB"), CPU)
    assert chosen is not ENGINES["inmemory"] and chosen.honours_host_memory()
    assert "does not take --host-memory" in rejected["inmemory"][0]
    assert select_engine(g, TrainConfig(host_memory="4GB"), CPU)[0] is ENGINES["inmemory"]  # it fits: the cheapest


def test_plan_takes_host_memory_and_prints_the_base(gdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--dataset", str(gdir), "--device", "cpu", "--host-memory", "4MB"]) == 0
    out = capsys.readouterr().out
    assert "inmemory      rejected: does not take --host-memory" in out
    line = next(x for x in out.splitlines() if "host base" in x)
    assert line.startswith("offload: host base") and "bounds the peak resident memory at" in line
    # nothing fits: the table, then train's own error line and exit status 2 (one planner for both)
    assert main(["plan", "--dataset", str(gdir), "--device", "cpu", "--mode", "sampled", "--host-memory", "20KB"]) == 2
    assert "minibatch     rejected: --host-memory 19.5 KiB cannot hold" in capsys.readouterr().out


def test_train_help_lists_host_memory_under_every_engine_that_takes_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    takers = [n for n, cls in ENGINES.items() if cls.honours_host_memory()]
    assert set(takers) == {"minibatch", "offload", "taskparallel", "hybrid", "distributed"}
    head = f"host memory (engines {', '.join(takers)}):"
    assert head in text  # its own group, titled by every engine that takes it (not the minibatch group)
    assert "--host-memory SIZE" in text.split(head)[1][:300]


def test_scratch_without_host_memory_says_it_does_nothing(gdir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    args = ["train", "--dataset", str(gdir), "--engine", "offload", "--epochs", "1", "--quiet", "--device", "cpu",
            "--scratch", str(tmp_path), "--metrics", str(tmp_path / "m.jsonl")]
    assert main(args) == 0
    warned = [x for x in capsys.readouterr().err.splitlines() if "--scratch" in x]
    assert warned == ["warning: --scratch has no effect without --host-memory: nothing spills to files unless a "
                      "host budget cannot hold it"]


def test_convert_help_names_the_specs_that_stream(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "kronecker and edgelist specs stream" in text and "every other spec is loaded whole" in text
