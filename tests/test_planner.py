"""One planner across engines: ``--engine auto`` chooses among the engines of the requested training mode,
``gnnscale plan`` lists each with its estimate or its reasons, and every engine declares the option groups it
reads (``--help`` groups the flags by them; a flag of another group is named as having no effect)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch

from gnnscale import ConfigError, TrainConfig
from gnnscale.cli import build_parser, main
from gnnscale.config import OPTION_GROUPS, ModelOptions, RunOptions
from gnnscale.engines import ENGINES, candidate_names, ignored_options, readers_of, requested_mode, select_engine
from gnnscale.graph.generators import csbm

GRAPH = "csbm:nodes=300,features=8,classes=3"


def test_each_mode_has_its_engines_in_registry_order() -> None:
    modes = {name: cls.mode for name, cls in ENGINES.items()}
    assert set(modes.values()) == {"full", "sampled", "distributed"}
    for mode in ("full", "sampled", "distributed"):
        assert candidate_names(TrainConfig(mode=mode)) == [n for n in ENGINES if modes[n] == mode]
    assert requested_mode(TrainConfig()) == "full"
    assert requested_mode(TrainConfig(ranks=2)) == "distributed"
    assert requested_mode(TrainConfig(engine="hybrid")) == "sampled"
    assert candidate_names(TrainConfig(engine="offload", mode="sampled")) == ["offload"]  # a named engine wins


def test_auto_picks_a_sampled_engine_only_in_sampled_mode() -> None:
    g = csbm(nodes=300, features=8, classes=3, seed=0)
    cls, rejected = select_engine(g, TrainConfig(), torch.device("cpu"))
    assert cls.mode == "full" and not any(ENGINES[n].mode != "full" for n in rejected)
    cls, _ = select_engine(g, TrainConfig(mode="sampled"), torch.device("cpu"))
    assert cls.mode == "sampled"


def test_plan_lists_every_candidate_with_its_estimate_or_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--dataset", GRAPH, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in out["candidates"]]
    assert names == [n for n in ENGINES if ENGINES[n].mode == "full"] and out["mode"] == "full"
    assert out["chosen"] == "inmemory"
    inmem = next(c for c in out["candidates"] if c["name"] == "inmemory")
    assert inmem["reasons"] == [] and "device memory" in inmem["estimate"]
    tp = next(c for c in out["candidates"] if c["name"] == "taskparallel")
    assert tp["reasons"] and tp["estimate"] == ""  # gcn is not a decoupled model
    assert main(["plan", "--dataset", GRAPH, "--json", "--gpu-memory", "1KB"]) == 2  # none fits: as train
    tight = json.loads(capsys.readouterr().out)
    assert next(c for c in tight["candidates"] if c["name"] == "inmemory")["reasons"]
    assert tight["chosen"] != "inmemory"


def test_every_option_group_is_read_by_some_engine_and_every_field_has_a_flag() -> None:
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    dests = {a.dest: a for a in train._actions}
    titles = {a.dest: g.title for g in train._action_groups for a in g._group_actions}
    for group in OPTION_GROUPS:
        readers = readers_of(group)
        if group in (ModelOptions, RunOptions):
            continue
        assert readers, f"{group.__name__} is read by no engine"
        for f in fields(group):
            dest = "gpu_memory" if f.name == "memory_budget" else f.name
            assert dest in dests, f"{f.name} has no flag"
            title = titles[dest]
            # a field other engines read too (Engine.also_reads: --host-memory) is titled by all its readers
            field_readers = [n for n, cls in ENGINES.items() if n in readers or f.name in cls.also_reads]
            assert (title == f"{readers[0]} engine") if len(field_readers) == 1 else (
                ", ".join(field_readers) in title), (f.name, title)
    own = {g.title for g in train._action_groups}
    for name, cls in ENGINES.items():
        if any(readers_of(g) == [name] for g in cls.options):
            assert f"{name} engine" in own


def test_flags_of_groups_an_engine_does_not_read_are_named() -> None:
    assert ignored_options(TrainConfig(engine="minibatch", partitions=2), "minibatch") == ["partitions"]
    assert ignored_options(TrainConfig(engine="offload", fanouts=(5, 5)), "offload") == ["fanouts"]
    assert ignored_options(TrainConfig(engine="offload", chunks=3, plan_dir="/tmp"), "offload") == []
    assert ignored_options(TrainConfig(heads=8), "inmemory") == ["heads"]
    assert ignored_options(TrainConfig(model="gat", heads=8), "inmemory") == []
    with pytest.raises(ConfigError, match="unknown --mode"):
        TrainConfig(mode="fast")


TINY = "csbm:nodes=500,avg_degree=4,features=8"


def test_plan_and_train_ask_one_planner(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #44 item 21: ``plan`` and ``train`` both take their answer from ``engines.assess``; ``plan`` exits 2
    where nothing fits, as ``train`` does."""
    import gnnscale.engines as registry

    asked: list[tuple[str, str]] = []
    real = registry.assess

    def spy(name: str, *a: object, **k: object) -> registry.Candidate:
        asked.append((name, sys_command[0]))
        return real(name, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(registry, "assess", spy)
    sys_command = ["plan"]
    assert main(["plan", "--dataset", TINY, "--mode", "sampled", "--device", "cpu"]) == 0
    sys_command[0] = "train"
    assert main(["train", "--dataset", TINY, "--mode", "sampled", "--device", "cpu", "--epochs", "1",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert ("minibatch", "plan") in asked and ("hybrid", "plan") in asked and ("minibatch", "train") in asked


@pytest.mark.parametrize("argv", [
    ["--mode", "sampled", "--gpu-memory", "1KB"],  # the memory store's directory alone overflows: both refuse
    ["--mode", "sampled"],
    ["--mode", "full", "--gpu-memory", "1KB"],  # nothing fits: both exit 2
    ["--mode", "full"],
])
def test_plan_and_train_agree(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--dataset", TINY, "--device", "cpu", "--json", *argv])
    out, err = capsys.readouterr()
    plan = json.loads(out)
    trained = main(["train", "--dataset", TINY, "--device", "cpu", "--epochs", "1", "--quiet", *argv])
    train_out, train_err = capsys.readouterr()
    assert code == trained, (err, train_err)
    if plan["chosen"] is None:
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: no engine can train")
        assert err == train_err  # the same line
    else:
        assert f"engine {plan['chosen']} on cpu" in train_out


def test_the_store_budget_plan_advises_is_enough(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--dataset", TINY, "--device", "cpu", "--mode", "sampled", "--gpu-memory", "1KB"]) == 2
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.split()[:1] == ["minibatch"])
    advice = line.split("give --gpu-memory at least ")[1].split()  # e.g. ['7.9', 'KiB']
    assert main(["train", "--dataset", TINY, "--device", "cpu", "--engine", "minibatch", "--epochs", "1", "--quiet",
                 "--gpu-memory", "".join(advice)]) == 0


def test_plan_says_auto_skips_hybrid_that_train_runs_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --devices, ``--engine hybrid`` trains on the CPU alone; ``--engine auto`` leaves it to that."""
    assert main(["plan", "--dataset", TINY, "--device", "cpu", "--mode", "sampled", "--json"]) == 0
    hybrid = next(c for c in json.loads(capsys.readouterr().out)["candidates"] if c["name"] == "hybrid")
    assert hybrid["reasons"] == [] and "--devices" in hybrid["skipped"]
    assert main(["train", "--dataset", TINY, "--device", "cpu", "--engine", "hybrid", "--epochs", "1",
                 "--quiet"]) == 0
    assert "engine hybrid on cpu" in capsys.readouterr().out
