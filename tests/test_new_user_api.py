"""Issue #28, the Python API and the CLI as a second new user found them: memory units (item 4), settings the API
ignores (16), TrainConfig fields given as the CLI writes them (18), ``--fanouts -1,-1`` (19) and wording (22)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gnnscale as gs
from gnnscale import TrainConfig
from gnnscale.cli import main
from gnnscale.cli.parser import join_negative_lists
from gnnscale.errors import ConfigError, EngineError
from gnnscale.graph.generators import csbm
from gnnscale.units import parse_budget, parse_bytes

SMALL = "csbm:nodes=300,features=8"


# ------------------------------------------------------------------------------------------------ 4: units
@pytest.mark.parametrize(("text", "want"), [
    ("512MB", 512 * 10**6), ("512mb", 512 * 10**6), ("1kB", 1000), ("2GB", 2 * 10**9), ("1TB", 10**12),
    ("512MiB", 512 << 20), ("1KiB", 1024), ("2GiB", 2 << 30), ("1.5GiB", 3 << 29),
    ("8G", 8 << 30), ("4M", 4 << 20), ("1000", 1000), ("1000B", 1000),
])
def test_sizes_read_si_as_powers_of_ten_and_iec_as_powers_of_two(text: str, want: int) -> None:
    assert parse_bytes(text) == want


def test_a_plain_budget_is_gib_and_a_sized_one_follows_its_unit() -> None:
    assert parse_budget("6") == 6 << 30
    assert parse_budget("6GB") == 6 * 10**9
    assert parse_budget("6GiB") == 6 << 30
    with pytest.raises(ConfigError, match="powers of 1000"):
        parse_budget("6XB")


def test_the_metrics_config_records_the_budget_in_bytes(tmp_path: Path) -> None:
    m = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", SMALL, "--epochs", "1", "--device", "cpu", "--quiet", "--gpu-memory", "64MB",
                 "--metrics", str(m)]) == 0
    records = [json.loads(line) for line in m.read_text().splitlines()]
    configs = [r["config"] for r in records if "config" in r]
    assert configs and all(c["memory_budget"] == 64 * 10**6 for c in configs)


# ------------------------------------------------------------------------------------------------ 16: ignored
@pytest.fixture(scope="module")
def graph() -> gs.Graph:
    return csbm(nodes=200, features=8, avg_degree=4, classes=3, seed=0)


def test_the_api_warns_about_settings_the_run_ignores_naming_the_component(
        graph: gs.Graph, capsys: pytest.CaptureFixture[str]) -> None:
    gs.train(graph, TrainConfig(fanouts=(5, 5), partitions=4, heads=8, epochs=1), "cpu")
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if line.startswith("warning:")]
    assert len(warnings) == 1, err
    w = warnings[0]
    assert "fanouts=(5, 5) (--fanouts)" in w and "partitions=4 (--partitions)" in w
    assert "no effect on the inmemory engine" in w
    assert "heads=8 (--heads) has no effect on the gcn model" in w  # the model ignores it, not the engine


def test_hidden_of_a_one_layer_model_is_said_to_have_no_effect(
        graph: gs.Graph, capsys: pytest.CaptureFixture[str]) -> None:
    gs.train(graph, TrainConfig(layers=1, hidden=32, epochs=1), "cpu")
    err = capsys.readouterr().err
    assert "hidden=32 (--hidden) has no effect on a 1-layer model" in err


def test_nothing_is_said_when_every_setting_is_read(graph: gs.Graph, capsys: pytest.CaptureFixture[str]) -> None:
    gs.train(graph, TrainConfig(model="gat", heads=2, hidden=8, epochs=1), "cpu")
    assert "warning" not in capsys.readouterr().err


def test_the_cli_says_it_once_as_the_api_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", SMALL, "--epochs", "1", "--device", "cpu", "--quiet", "--heads", "8"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert err == ["warning: heads=8 (--heads) has no effect on the gcn model (only gat has attention heads)"]


# ------------------------------------------------------------------------------------------------ 18: fields
def test_fields_written_as_the_cli_writes_them_are_read_as_the_cli_reads_them() -> None:
    cfg = TrainConfig(devices="cpu,cpu", fanouts="5,5", eval_fanouts="-1", memory_budget="6GB", hidden="32",
                      lr="0.1", shares="0.25, 0.75", merge=2)
    assert cfg.devices == ("cpu", "cpu")
    assert cfg.fanouts == (5, 5) and cfg.eval_fanouts == (-1,)
    assert cfg.memory_budget == 6 * 10**9
    assert cfg.hidden == 32 and cfg.lr == 0.1 and cfg.shares == (0.25, 0.75) and cfg.merge == "2"
    assert TrainConfig(memory_budget="6").memory_budget == 6 << 30  # as --gpu-memory 6
    assert TrainConfig(memory_budget=6 << 30).memory_budget == 6 << 30  # an int is bytes
    assert TrainConfig(fanouts=[10, 5]).fanouts == (10, 5)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"fanouts": "5,x"}, "fanouts= (--fanouts): cannot read 'x'"),
    ({"hidden": 1.5}, "hidden= (--hidden) takes an integer"),
    ({"hidden": True}, "hidden= (--hidden) takes an integer"),
    ({"model": 3}, "model= (--model) takes a string"),
    ({"memory_budget": "6XB"}, "memory_budget= (--gpu-memory"),
    ({"epochs": None}, "epochs= (--epochs) cannot be None"),
    ({"devices": {"cpu": 1}}, "devices= (--devices) takes a tuple"),
])
def test_a_field_of_the_wrong_type_is_one_config_error_naming_it(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs)  # type: ignore[arg-type]
    assert words.replace(" (--gpu-memory", "") in str(info.value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------ 19: -1,-1
def test_negative_fanouts_may_follow_the_flag_as_the_readme_writes_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert join_negative_lists(["--fanouts", "-1,-1", "--epochs", "1"]) == ["--fanouts=-1,-1", "--epochs", "1"]
    assert join_negative_lists(["--eval-fanouts", "-1"]) == ["--eval-fanouts=-1"]
    assert join_negative_lists(["--lr", "-1"]) == ["--lr", "-1"]  # only the list flags
    assert main(["train", "--dataset", SMALL, "--engine", "minibatch", "--fanouts", "-1,-1", "--epochs", "1",
                 "--device", "cpu", "--quiet"]) == 0
    assert "fanouts -1,-1" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ 22: wording
def test_one_epoch_is_singular(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", SMALL, "--epochs", "1", "--device", "cpu", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert " 1 epoch in " in out and "1 epochs" not in out


def test_predict_under_a_small_budget_says_it_cannot_predict(tmp_path: Path) -> None:
    model = tmp_path / "m.pt"
    assert main(["train", "--dataset", SMALL, "--epochs", "1", "--device", "cpu", "--quiet",
                 "--save-model", str(model)]) == 0
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.predict import predict

    with pytest.raises(EngineError, match="no engine can predict for"):
        predict(load_dataset(SMALL), model, "cpu", memory_budget=1)
