"""A distributed run from Python (issue #28, item 14): ``gnnscale.launch(dataset, config, ranks=R)`` starts R ranks
through the launcher ``gnnscale train --ranks R`` uses (:func:`gnnscale.distributed.launch.run_ranks`) and returns
rank 0's result; its losses are the command's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gnnscale as gs
from gnnscale.errors import ConfigError
from gnnscale.graph import io
from gnnscale.graph.generators import csbm


def _graph() -> gs.Graph:
    return csbm(nodes=300, features=8, avg_degree=6, seed=5, train=0.5, communities=4)


def _config(**kw: object) -> gs.TrainConfig:
    options: dict[str, object] = {"engine": "distributed", "model": "sage", "batch_size": 50, "fanouts": (5, 3),
                                  "epochs": 2, "seed": 0, "merge": "off", **kw}
    return gs.TrainConfig(**options)  # type: ignore[arg-type]


def test_a_two_rank_run_from_python_returns_the_command_s_losses(tmp_path: Path) -> None:
    g = _graph()
    path = io.save(g, tmp_path / "graph")
    m = tmp_path / "cli.jsonl"
    p = subprocess.run(
        [sys.executable, "-m", "gnnscale", "train", "--dataset", str(path), "--engine", "distributed", "--model",
         "sage", "--batch-size", "50", "--fanouts", "5,3", "--epochs", "2", "--merge", "off", "--quiet", "--device",
         "cpu", "--ranks", "2", "--metrics", str(m)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    cli = [json.loads(line) for line in m.read_text().splitlines()]
    # a Graph in memory: saved once to a temporary converted directory the ranks read
    result = gs.launch(g, _config(), ranks=2, device="cpu")
    assert isinstance(result, gs.TrainResult) and result.engine == "distributed"
    assert [r["epoch"] for r in result.history] == [1, 2]
    assert [r["loss"] for r in result.history] == pytest.approx([r["loss"] for r in cli[:-1]], rel=1e-6)
    assert result.history[-1]["ranks"] == 2 and result.summary["summary"] is True
    assert result.summary["final_test_acc"] == pytest.approx(cli[-1]["final_test_acc"])
    assert result.best_state and set(result.best_state) == set(result.model.state_dict())
    pred = gs.predict(g, (result.model, _config()), "cpu", engine="inmemory")  # an ordinary model came back
    assert pred.shape[0] == g.num_nodes


def test_bad_input_is_raised_in_the_caller(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ranks"):  # before any rank starts
        gs.launch(_graph(), _config(), ranks=0)
    with pytest.raises(ConfigError, match="distributed"):
        gs.launch(_graph(), gs.TrainConfig(engine="inmemory"), ranks=2)
    tiny = io.save(csbm(nodes=3, features=4, avg_degree=1, seed=1, train=0.34), tmp_path / "tiny")
    with pytest.raises(ConfigError, match="more than the graph's 3 vertices"):  # found by the ranks: rank 0's error
        gs.launch(str(tiny), _config(epochs=1), ranks=4, device="cpu")


UNGUARDED = """
import gnnscale as gs
print("top level ran", flush=True)
cfg = gs.TrainConfig(engine="distributed", model="sage", batch_size=50, fanouts=(5, 3), epochs=1, merge="off")
try:
    gs.launch("csbm:nodes=200,features=8,avg_degree=4", cfg, ranks=2, device="cpu")
except gs.GnnscaleError as exc:
    print(f"caught {type(exc).__name__}: {exc}", flush=True)
"""


def test_a_launch_without_the_main_guard_says_how_to_fix_it(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])})
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    caught = [line for line in p.stdout.splitlines() if line.startswith("caught")]
    # the caller gets one ConfigError: the ranks met the call again as they imported the script, and stopped there
    assert len(caught) == 1, p.stdout
    assert caught[0].startswith("caught ConfigError: gnnscale.launch was called again in a rank as it imported the "
                                "script; put the gnnscale.launch call"), caught
    assert '`if __name__ == "__main__":`' in caught[0]
    # the caller's import and each rank's that got that far (the first rank's error stops the job, so the other
    # may be ended before it prints): never more, and nothing trained
    assert 2 <= p.stdout.count("top level ran") <= 3, p.stdout
    assert "accuracy" not in p.stdout + p.stderr, p.stdout


def test_launch_inside_a_rank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match="called in rank 1 of a launched job"):
        gs.launch(_graph(), _config(), ranks=2, device="cpu")
