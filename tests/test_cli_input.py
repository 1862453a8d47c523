"""Issue #44's CLI input points: integers beyond what the code can hold are refused at parse time with one line
(item 14); convert's own feature and label files (item 24)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.cli import main
from gnnscale.cli.parser import build_parser
from gnnscale.errors import ConfigError
from gnnscale.graph import io

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


# ---------------------------------------------------------------------------- item 24: convert's own vertex data
EDGES = "10 20\n20 30\n30 10\n40 10\n50 40\n"  # ids 10..50: vertices 0..4 in id order


def _files(tmp: Path) -> tuple[Path, Path, np.ndarray]:
    (tmp / "e.txt").write_text(EDGES)
    x = np.random.default_rng(0).standard_normal((5, 3))
    np.save(tmp / "x.npy", x)
    (tmp / "y.csv").write_text("id,label\n50,dog\n10,cat\n20,dog\n40,bird\n")  # 30 unlabelled
    return tmp / "x.npy", tmp / "y.csv", x


def test_convert_takes_features_and_named_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xf, yf, x = _files(tmp_path)
    out = tmp_path / "g"
    assert main(["convert", "--dataset", f"edgelist:{tmp_path / 'e.txt'}", "--features", str(xf), "--labels",
                 str(yf), "--out", str(out)]) == 0
    g = io.open_dir(out)
    assert torch.equal(g.x, torch.from_numpy(x.astype(np.float32)))  # type: ignore[arg-type]
    assert json.loads((out / "classes.json").read_text()) == ["bird", "cat", "dog"]  # sorted names: classes 0..2
    assert g.y is not None and g.y.tolist() == [1, 2, -1, 0, 2] and g.num_classes == 3
    masks = [m for m in (g.train_mask, g.val_mask, g.test_mask) if m is not None]
    assert sum(int(m.sum()) for m in masks) == 4 and not any(bool(m[2]) for m in masks)  # the labelled, once
    assert not set(g.meta.get("made_up") or []) & {"features", "labels"}
    capsys.readouterr()
    assert main(["info", "--dataset", str(out)]) == 0
    info = capsys.readouterr().out
    assert "bird, cat, dog" in info and "1 of 5 vertices unlabelled" in info and "made up" not in info


def test_integer_labels_are_the_classes(tmp_path: Path) -> None:
    _files(tmp_path)
    (tmp_path / "y.csv").write_text("10,2\n20,0\n30,1\n")
    out = tmp_path / "g"
    assert main(["convert", "--dataset", f"edgelist:{tmp_path / 'e.txt'}", "--labels", str(tmp_path / "y.csv"),
                 "--out", str(out)]) == 0
    g = io.open_dir(out)
    assert g.y is not None and g.y.tolist() == [2, 0, 1, -1, -1] and not (out / "classes.json").exists()


@pytest.mark.parametrize(("flag", "content", "words"), [
    ("--features", np.zeros((4, 3)), "shape [4, 3]"),
    ("--features", np.zeros(5), "shape [5]"),
    ("--features", np.array([["a"]] * 5), "not numbers"),
    ("--features", np.array([[None]] * 5, dtype=object), "not a .npy array file"),  # a pickle: refused, not run
    ("--features", np.full((5, 2), np.nan), "row 0 is not finite"),
    ("--labels", "10,cat\n99,dog\n", "vertex id 99 is not a vertex"),
    ("--labels", "10,cat\n10,dog\n", "vertex id 10 is listed twice"),
    ("--labels", "10;cat\n", "line 1: expected 'id,label'"),
    ("--labels", "ten,cat\n", "line 1: vertex id 'ten' is not an integer"),
    ("--labels", "# nothing\n", "no 'id,label' lines"),
])
def test_convert_refuses_files_that_do_not_fit_the_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         flag: str, content: object, words: str) -> None:
    (tmp_path / "e.txt").write_text(EDGES)
    f = tmp_path / ("f.npy" if flag == "--features" else "f.csv")
    if isinstance(content, str):
        f.write_text(content)
    else:
        np.save(f, content, allow_pickle=True)
    assert main(["convert", "--dataset", f"edgelist:{tmp_path / 'e.txt'}", flag, str(f), "--out",
                 str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the reader's note on renumbered ids, then one error
    line = err[-1]
    assert [ln.startswith("note: ") for ln in err[:-1]] == [True] * (len(err) - 1) and line.startswith("error: ")
    assert f"{flag} {f}" in line and words in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["e.txt", f.name])  # nothing half-written


@pytest.mark.parametrize("flag", ["--lr", "--weight-decay", "--dropout", "--timeout"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e400"])
def test_number_flags_must_be_finite(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--lr inf` trained on (to NaN weights) and `--timeout 1e400` was taken as a timeout: a number flag is finite,
    checked as it is parsed, in one line."""
    code = main(["train", "--dataset", "csbm:nodes=200", "--epochs", "1", "--quiet", flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and flag in err[0], err


def test_the_python_api_refuses_an_infinite_learning_rate() -> None:
    from gnnscale.errors import ConfigError

    for kw in ({"lr": float("inf")}, {"weight_decay": float("inf")}, {"timeout": float("inf")}):
        with pytest.raises(ConfigError, match="finite"):
            TrainConfig(**kw)  # type: ignore[arg-type]
