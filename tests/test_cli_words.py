"""Issue #44 item 23: what the refusals and the help say about engines comes from the registry's capabilities,
never from names written into a message."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.cli import build_parser, main
from gnnscale.engines import ENGINES, select_engine
from gnnscale.errors import EngineError
from gnnscale.graph.generators import csbm

TINY = "csbm:nodes=200,avg_degree=4,features=8"
ROOT = Path(__file__).resolve().parents[1]


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _listed(line: str, after: str) -> list[str]:
    return [n.strip() for n in line.split(after, 1)[1].split(";")[0].split(",")]


def test_a_named_engine_that_cannot_train_the_model_says_so_and_which_can(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error(capsys, ["train", "--dataset", TINY, "--engine", "minibatch", "--model", "dgcn", "--device", "cpu",
                           "--epochs", "1"])
    assert "no engine can" not in line and line.startswith("error: the minibatch engine cannot train")
    assert _listed(line, "the engines that train dgcn: ") == [n for n, c in ENGINES.items() if c.trains_decoupled]


def test_the_jk_refusal_lists_every_engine_that_trains_jk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks say it as this does (``train --engine distributed --ranks 2 --jk cat``: each rank selects)."""
    g = csbm(nodes=200, avg_degree=4, features=8, seed=0)
    config = TrainConfig(engine="distributed", ranks=2, jk="cat")
    with pytest.raises(EngineError) as refused:
        select_engine(g, config, torch.device("cpu"))
    able = [n for n, c in ENGINES.items() if c.trains_jk and c.trains_layered]
    assert len(able) > 1 and _listed(str(refused.value), "the engines that train gcn --jk cat: ") == able
    monkeypatch.setattr(ENGINES["offload"], "trains_jk", False)  # the list follows the capability
    with pytest.raises(EngineError) as refused:
        select_engine(g, config, torch.device("cpu"))
    assert "offload" not in _listed(str(refused.value), "the engines that train gcn --jk cat: ")


def _help(flag: str) -> str:
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    return next(a.help for a in train._actions if flag in a.option_strings) or ""


def test_the_help_of_jk_and_residual_names_the_engines_that_refuse_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for flag, option in (("--jk", {"jk": "cat"}), ("--residual", {"residual": True})):
        refusers = [n for n, c in ENGINES.items() if not c.trains_layered
                    or ("jk" in option and not c.trains_jk)]
        assert refusers and " ".join(_help(flag).split()).endswith(f"refused by {', '.join(refusers)}")
        assert all(ENGINES[n].model_option_reasons(TrainConfig(**option)) for n in refusers)
    monkeypatch.setattr(ENGINES["minibatch"], "trains_jk", False)
    assert "minibatch" in _help("--jk") and "minibatch" not in _help("--residual")


def test_the_architecture_page_names_every_disk_tier_engine() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    row = next(ln for ln in page.splitlines() if ln.startswith("| features of a converted directory under"))
    where = row.split("|")[1]
    named = [n for n in ENGINES if re.search(rf"\b{n}\b(?!\w)", where) and f"not {n}" not in where]
    readers = [n for n, c in ENGINES.items() if "host_memory" in c.also_reads
               or any("host_memory" in {f.name for f in fields(g)} for g in c.options)]  # the engines' own word
    assert named == readers and len(named) > 2
