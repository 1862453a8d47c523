"""benchmarks/revisions.py without git or training: its cases and their interleaved order, the children's command
and environment, the metrics reader, the median / ratio / bound table from made-up run records, and its section
rendered from the real records."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import revisions as bench
from benchmarks.harness import schedule
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records


def _cases(*argv: str) -> list[Any]:
    return bench.cases(parser("revisions", bench).parse_args(list(argv)))


def test_default_and_quick_cases() -> None:
    cs = _cases()
    assert [c.name for c in cs] == ["inmemory base", "inmemory head", "offload base", "offload head",
                                    "minibatch base", "minibatch head"]
    assert [(c.group, c.rev) for c in cs[:2]] == [("inmemory", "db8e33a"), ("inmemory", "HEAD")]
    p = cs[0].params
    assert (p["dataset"], p["epochs"], p["bound"], p["side"]) == (bench.DEFAULT_DATASET, 6, 0.05, "base")
    assert bench.ROUNDS == 5
    q = _cases("--quick")
    assert [c.name for c in q] == ["inmemory base", "inmemory head", "offload base", "offload head"]
    assert q[0].params["dataset"] == bench.QUICK_DATASET and q[0].params["epochs"] == 2
    cs = _cases("--base", "abc", "--head", "def", "--engines", "offload, minibatch")
    assert [(c.name, c.rev) for c in cs] == [("offload base", "abc"), ("offload head", "def"),
                                             ("minibatch base", "abc"), ("minibatch head", "def")]
    for bad in (["--engines", "inmemory,hybrid"], ["--engines", ","], ["--epochs", "1"], ["--bound", "0"]):
        with pytest.raises(SystemExit):
            _cases(*bad)


def test_rounds_alternate_the_order_of_the_revisions() -> None:
    got = [(r, c.params["engine"], c.params["side"]) for r, c in schedule(3, _cases("--engines", "inmemory,offload"))]
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
    env = bench.child_env(tmp_path / "wt", tmp_path / "c", {"PYTHONPATH": "/work/main", "GNNSCALE_DEVICE": "sim"})
    assert env["PYTHONPATH"] == f"{tmp_path / 'wt'}:/work/main"
    assert env["GNNSCALE_CACHE_DIR"] == str(tmp_path / "c")
    assert "GNNSCALE_DEVICE" not in env
    assert bench.child_env(tmp_path / "wt", tmp_path / "c", {})["PYTHONPATH"] == str(tmp_path / "wt")


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


def test_a_run_reads_its_epochs_and_a_failed_run_raises(tmp_path: Path) -> None:
    m = tmp_path / "m.jsonl"
    epochs = [{"epoch": i + 1, "epoch_time_s": t} for i, t in enumerate([0.9, 0.3, 0.1, 0.2])]
    write = f"open({str(m)!r}, 'w').write({''.join(json.dumps(e) + chr(10) for e in epochs)!r})"
    assert bench.train([sys.executable, "-c", write], tmp_path, {}, m, 60) == [0.9, 0.3, 0.1, 0.2]
    with pytest.raises(RuntimeError, match="exit 1: boom"):
        bench.train([sys.executable, "-c", write + "; import sys; sys.exit('boom')"], tmp_path, {}, m, 60)
    one = f"open({str(m)!r}, 'w').write({json.dumps(epochs[0]) + chr(10)!r})"
    with pytest.raises(RuntimeError, match="1 epoch records in the metrics"):
        bench.train([sys.executable, "-c", one], tmp_path, {}, m, 60)


def test_the_section_from_the_real_records_matches_their_summaries() -> None:
    recs = read_records(RESULTS_DIR / "revisions.jsonl")
    text = bench.render(recs)
    assert text == bench.render(list(recs))  # pure
    summarised = [r["session"] for r in recs if r.get("record") == "summary"]  # sessions from before the harness
    last = [r for r in recs if r.get("record") == "summary" and r["session"] == summarised[-1]]
    assert [s["engine"] for s in last] == ["inmemory", "offload", "minibatch"]
    for s in last:  # the table's row of each engine, recomputed from the run records, is the recorded summary
        rr = s["round_ratios"]
        row = (f"| {s['engine']} | {s['base_median_s']:.3f} | {s['head_median_s']:.3f} | {s['ratio']:.3f} "
               f"| {min(rr):.3f}-{max(rr):.3f} | {s['verdict']} | 5/5, 5/5 |")
        assert row in text
    assert "| minibatch | 0.279 | 0.277 | 0.993 | 0.903-1.047 | yes | 5/5, 5/5 |" in text
    assert "| minibatch | 0.352 | 0.392 | 1.111 | 0.997-1.172 | **no** | 5/5, 5/5 |" in text  # the b8491fd session
    (row,) = bench.headline(recs)  # the latest session, recomputed from its run records
    runs = [r for r in recs if r["session"] == recs[-1]["session"] and r.get("ok")]
    ratios = []
    for engine in ("inmemory", "offload", "minibatch"):
        med = {side: statistics.median(t for r in runs if r["engine"] == engine and r["side"] == side
                                       for t in r["timed_s"]) for side in ("base", "head")}
        ratios.append(f"{engine} {med['head'] / med['base']:.3f}")
    assert [part.split(" (")[0] for part in row.figure.split(": ")[0].split("; ")] == ratios
    assert len(row.records) == len(runs) == 30


def test_harness_records_with_a_failed_case_render() -> None:
    def rec(engine: str, side: str, rnd: int, times: list[float] | None) -> dict[str, Any]:
        base = {"session": "s1", "round": rnd, "engine": engine, "side": side, "dataset": "d", "epochs": 3,
                "bound": 0.05, "rev_name": {"base": "db8e33a", "head": "HEAD"}[side], "date": "2026-11-28"}
        if times is None:
            return {**base, "ok": False, "error": "RuntimeError: exit 1: boom"}
        return {**base, "ok": True, "record": "run", "rev": side * 20, "timed_s": times, "median_s": times[0]}
    recs = [rec("offload", "base", 0, [1.0, 1.0]), rec("offload", "head", 0, None)]
    text = bench.render(recs)
    assert "| offload | 1.000 | - | - | - | failed (head) | 1/1, 0/1 |" in text
    assert "Base db8e33a (basebasebase) against head HEAD:" in text
