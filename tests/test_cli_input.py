"""Issue #44's CLI input points: integers beyond what the code can hold are refused at parse time with one line
(item 14); convert's own feature and label files (item 24)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnscale import TrainConfig
from gnnscale.cli import main
from gnnscale.cli.parser import build_parser
from gnnscale.errors import ConfigError

HUGE = "99999999999999999999999"
MAX_SEED = 2**32 - 1  # numpy.random.seed's range, as PyG's seed_everything
SMALL = "csbm:nodes=100,avg_degree=4,features=4"


def _one_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("command", ["train", "info", "convert"])
def test_an_edge_list_id_beyond_int64_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   command: str) -> None:
    edges = tmp_path / "e.txt"
    edges.write_text("0 1\n1 99999999999999999999\n")
    argv = [command, "--dataset", f"edgelist:{edges}"]
    out = tmp_path / "out"
    argv += {"train": ["--epochs", "1", "--device", "cpu"], "info": [], "convert": ["--out", str(out)]}[command]
    line = _one_error(capsys, argv)
    assert "line 2" in line and "int64" in line
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--seed", "--batch-size", "--layers", "--heads", "--partitions", "--hidden"])
def test_huge_integer_flags_are_refused_when_parsed(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    line = _one_error(capsys, ["train", "--dataset", SMALL, flag, HUGE])
    assert f"argument {flag}: {HUGE} is out of range" in line


def test_every_integer_flag_is_range_checked() -> None:
    """The mechanism: no flag of any command is parsed by a bare ``int`` (unbounded in Python, not in torch)."""
    parser = build_parser()
    subs = next(a for a in parser._actions if a.choices and "train" in a.choices).choices
    bare = [f"{name} {a.option_strings[0]}" for name, sub in subs.items() for a in sub._actions if a.type is int]
    assert not bare


def test_seed_range_is_what_numpy_and_torch_take(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["info", "--dataset", SMALL, "--seed", str(MAX_SEED)]).seed == MAX_SEED
    line = _one_error(capsys, ["info", "--dataset", SMALL, "--seed", str(MAX_SEED + 1)])
    assert f"0 to {MAX_SEED}" in line
    with pytest.raises(ConfigError, match="--seed"):
        TrainConfig(seed=2**63)


@pytest.mark.parametrize("flag", ["--fanouts", "--threads"])
def test_huge_numbers_in_lists_are_one_line(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    line = _one_error(capsys, ["train", "--dataset", SMALL, "--engine", "hybrid", flag, f"1,{HUGE}"])
    assert flag in line and "out of range" in line


def test_layers_have_a_sane_maximum(capsys: pytest.CaptureFixture[str]) -> None:
    """Beyond it a model is too big to build (a MemoryError, or minutes of building, before any message)."""
    with pytest.raises(ConfigError, match="--layers must be from 1 to"):
        TrainConfig(layers=100_000)
    assert "--layers must be from 1 to" in _one_error(capsys, ["train", "--dataset", SMALL, "--layers", "100000"])
