"""benchmarks/revisions.py without git or training: its arguments, the interleaved order, the children's command
and environment, the metrics reader and the median / ratio / bound table from made-up run records."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import revisions as bench  # noqa: E402


def test_defaults_and_checks() -> None:
    a = bench.parse_args([])
    assert (a.base, a.head, a.engines) == ("db8e33a", "HEAD", ["inmemory", "offload", "minibatch"])
    assert (a.rounds, a.epochs, a.bound, a.threads) == (5, 6, 0.05, 1)
    assert a.out == ROOT / "benchmarks" / "results" / "revisions.jsonl"
    a = bench.parse_args(["--base", "abc", "--head", "def", "--engines", "offload, minibatch", "--rounds", "2"])
    assert (a.base, a.head, a.engines, a.rounds) == ("abc", "def", ["offload", "minibatch"], 2)
    for bad in (["--engines", "inmemory,hybrid"], ["--engines", ","], ["--epochs", "1"], ["--rounds", "0"],
                ["--bound", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_rounds_alternate_the_order_of_the_revisions() -> None:
    got = [(s.round, s.engine, s.side) for s in bench.schedule(3, ["inmemory", "offload"])]
    assert got == [(0, "inmemory", "base"), (0, "inmemory", "head"), (0, "offload", "base"), (0, "offload", "head"),
                   (1, "inmemory", "head"), (1, "inmemory", "base"), (1, "offload", "head"), (1, "offload", "base"),
                   (2, "inmemory", "base"), (2, "inmemory", "head"), (2, "offload", "base"), (2, "offload", "head")]


def test_child_command_and_environment(tmp_path: Path) -> None:
    m = tmp_path / "m.jsonl"
    cmd = bench.train_command("/py", "csbm:nodes=10", "offload", 4, m)
    assert cmd[:4] == ["/py", "-m", "gnnscale", "train"]
    text = " ".join(cmd)
    for part in ("--dataset csbm:nodes=10", "--model gcn", "--layers 2", "--hidden 64", "--engine offload",
                 "--chunks 4", "--epochs 4", "--device cpu", "--quiet", f"--metrics {m}"):
        assert part in text
    assert "--batch-size 1024" in " ".join(bench.train_command("/py", "d", "minibatch", 4, m))
    assert "--chunks" not in bench.train_command("/py", "d", "inmemory", 4, m)
    env = bench.child_env(tmp_path / "wt", 1, tmp_path / "c", {"PYTHONPATH": "/work/main", "GNNSCALE_DEVICE": "sim"})
    assert env["PYTHONPATH"] == f"{tmp_path / 'wt'}:/work/main"
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "1")
    assert env["GNNSCALE_CACHE_DIR"] == str(tmp_path / "c")
    assert "GNNSCALE_DEVICE" not in env
    assert bench.child_env(tmp_path / "wt", 2, tmp_path / "c", {})["PYTHONPATH"] == str(tmp_path / "wt")


def test_reads_epoch_times_but_not_the_summary(tmp_path: Path) -> None:
    m = tmp_path / "m.jsonl"
    lines = [{"epoch": 1, "loss": 1.0, "epoch_time_s": 0.9}, {"epoch": 2, "loss": 0.9, "epoch_time_s": 0.25},
             {"epoch": 3, "loss": 0.8, "epoch_time_s": 0.5}, {"summary": True, "epoch_time_s": 7.0, "epochs": 3}]
    m.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert bench.read_epoch_times(m) == [0.9, 0.25, 0.5]
    assert bench.read_epoch_times(tmp_path / "missing.jsonl") == []


def _run(engine: str, side: str, rnd: int, timed: list[float] | None, error: str | None = None) -> dict[str, Any]:
    return {"engine": engine, "side": side, "round": rnd, "ok": timed is not None, "timed_s": timed or [],
            "error": error}


def test_medians_ratios_and_bound_from_fake_runs() -> None:
    runs = [
        # inmemory: pooled base [1.0, 1.2, 0.8, 1.0, 1.0, 1.4] -> 1.0; head [1.02, 1.04, 1.06, 1.04] -> 1.04
        _run("inmemory", "base", 0, [1.0, 1.2, 0.8]), _run("inmemory", "head", 0, [1.02, 1.04]),
        _run("inmemory", "head", 1, [1.06, 1.04]), _run("inmemory", "base", 1, [1.0, 1.0, 1.4]),
        # offload: head 10% slower
        _run("offload", "base", 0, [2.0, 2.0]), _run("offload", "head", 0, [2.2, 2.2]),
        # minibatch: head 20% faster, one head run failed
        _run("minibatch", "base", 0, [1.0, 1.0]), _run("minibatch", "head", 0, None, "exit 1: boom"),
        _run("minibatch", "head", 1, [0.8, 0.8]), _run("minibatch", "base", 1, [1.0]),
    ]
    s = {x["engine"]: x for x in bench.summarise(runs + [_run("gat", "base", 0, [1.0])],
                                                 ["inmemory", "offload", "minibatch"], 0.05)}
    assert list(s) == ["inmemory", "offload", "minibatch"]
    im = s["inmemory"]
    assert (im["base_median_s"], im["head_median_s"]) == pytest.approx((1.0, 1.04))
    assert im["ratio"] == pytest.approx(1.04) and im["within_bound"] is True and im["verdict"] == "yes"
    assert im["round_ratios"] == pytest.approx([1.03 / 1.0, 1.05 / 1.0])
    assert (im["base_epochs"], im["head_epochs"], im["base_runs_ok"], im["head_runs"]) == (6, 4, 2, 2)
    off = s["offload"]
    assert off["ratio"] == pytest.approx(1.1) and off["within_bound"] is False and off["verdict"] == "**no**"
    mb = s["minibatch"]
    assert mb["ratio"] == pytest.approx(0.8) and mb["within_bound"] is True and mb["verdict"] == "yes (faster)"
    assert (mb["head_runs_ok"], mb["head_runs"], mb["head_errors"]) == (1, 2, ["exit 1: boom"])
    assert mb["round_ratios"] == pytest.approx([0.8])  # round 0 has no head run

    table = bench.format_table(list(s.values()), 0.05).splitlines()
    assert table[0].startswith("| engine | base median (s) | head median (s) | head/base |") and "within 5%" in table[0]
    assert table[2] == "| inmemory | 1.000 | 1.040 | 1.040 | 1.030-1.050 | yes | 2/2, 2/2 |"
    assert table[3] == "| offload | 2.000 | 2.200 | 1.100 | 1.100-1.100 | **no** | 1/1, 1/1 |"
    assert table[4] == "| minibatch | 1.000 | 0.800 | 0.800 | 0.800-0.800 | yes (faster) | 2/2, 1/2 |"


def test_an_engine_that_failed_on_one_side_is_reported_failed() -> None:
    runs = [_run("offload", "base", 0, [2.0, 2.1]), _run("offload", "head", 0, None, "exit 1: ImportError")]
    (s,) = bench.summarise(runs, ["offload"], 0.05)
    assert s["ratio"] is None and s["within_bound"] is None and s["verdict"] == "failed (head)"
    assert s["base_median_s"] == pytest.approx(2.05) and s["head_median_s"] is None
    assert bench.format_table([s], 0.05).splitlines()[2] == "| offload | 2.050 | - | - | - | failed (head) | 1/1, 0/1 |"


def test_a_run_drops_the_first_epoch_and_a_failed_run_is_recorded(tmp_path: Path) -> None:
    m = tmp_path / "m.jsonl"
    epochs = [{"epoch": i + 1, "epoch_time_s": t} for i, t in enumerate([0.9, 0.3, 0.1, 0.2])]
    write = f"open({str(m)!r}, 'w').write({''.join(json.dumps(e) + chr(10) for e in epochs)!r})"
    ok = bench.run_one([sys.executable, "-c", write], tmp_path, {}, m, 60)
    assert ok["ok"] and ok["error"] is None
    assert ok["epoch_times_s"] == [0.9, 0.3, 0.1, 0.2] and ok["timed_s"] == [0.3, 0.1, 0.2]
    assert ok["median_s"] == pytest.approx(0.2)
    bad = bench.run_one([sys.executable, "-c", write + "; import sys; sys.exit('boom')"], tmp_path, {}, m, 60)
    assert not bad["ok"] and bad["error"] == "exit 1: boom" and bad["timed_s"] == [] and bad["median_s"] is None
    one = f"open({str(m)!r}, 'w').write({json.dumps(epochs[0]) + chr(10)!r})"
    short = bench.run_one([sys.executable, "-c", one], tmp_path, {}, m, 60)
    assert not short["ok"] and short["error"] == "1 epoch records in the metrics"
