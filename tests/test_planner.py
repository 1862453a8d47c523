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
    assert main(["plan", "--dataset", GRAPH, "--json", "--gpu-memory", "1KB"]) == 0
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
