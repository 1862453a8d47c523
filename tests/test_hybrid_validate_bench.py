"""benchmarks/hybrid_validate.py: its statistics (percentile, signed and absolute error summaries, which runs count
as away from the calibration point), its plan of engines and points, and one tiny smoke run writing its records
(no timing asserts)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hybrid_validate as bench  # noqa: E402


def test_percentile_is_linear_between_order_statistics() -> None:
    assert bench.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert bench.percentile([0.0, 10.0], 0.9) == pytest.approx(9.0)
    assert bench.percentile([5.0], 0.9) == 5.0


def test_error_stats_signed_and_absolute() -> None:
    s = bench.error_stats([-0.3, 0.1, 0.2])
    assert s["median"] == pytest.approx(0.1)
    assert (s["min"], s["max"]) == (-0.3, 0.2)
    assert s["median_abs"] == pytest.approx(0.2)
    assert s["worst_abs"] == pytest.approx(0.3)
    assert s["within_bound"] == pytest.approx(2 / 3)
    assert bench.error_stats([]) == {"n": 0}


def _row(label: str, axis: str, err: float) -> dict:
    return {"label": label, "axis": axis, "error": err, "iteration_error": err, "uncalibrated_error": -0.5,
            "measured_epoch_s": 1.0, "predicted_epoch_s": 1.0 + err}


def test_summary_counts_only_runs_away_from_calibration() -> None:
    rows = [_row("cal", "calibration", 0.9), _row("cal", "calibration", 0.9),
            _row("s", "split", 0.1), _row("s", "split", 0.3), _row("s", "split", 0.2),
            _row("f", "fanouts (transferred)", -0.1), _row("own", "fanouts", 0.8)]
    s = bench.summarize(rows)
    assert s["away"]["n"] == 4  # the calibration point and the self-calibrated fanouts run are not away
    assert s["per_config"]["s"]["median"] == pytest.approx(0.2)
    assert s["holds_config_medians"]  # medians 0.2 and -0.1
    assert not s["holds_every_run"]  # one split run at +30%
    assert list(s["per_config"]) == ["cal", "s", "f", "own"]


def test_plan_builds_puts_references_first_and_sizes_keep_the_spec() -> None:
    args = argparse.Namespace(ref_fanouts="15,10", device_lists="cpu;cpu,cpu:1", splits="0.1,0.9",
                              thread_sets="1,1,2;2,1,1", fanouts_list="5,5", sizes="20000",
                              reference="csbm:nodes=50000,features=128,train=0.5")
    builds = bench.plan_builds(args)
    assert [b["ref"] for b in builds][:2] == [True, True] and not any(b["ref"] for b in builds[2:])
    one, two = builds[0], builds[1]
    assert [p[1] for p in one["points"]] == ["calibration", "threads"]  # a sampler thread means nothing alone
    assert [p[1] for p in two["points"]] == ["calibration", "split", "split", "threads", "threads"]
    assert two["points"][1][2] == [0.1, 0.9]
    assert {b["spec"] for b in builds[2:]} == {args.reference, "csbm:nodes=20000,features=128,train=0.5"}


def test_quick_run_writes_point_and_summary_records(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    out = tmp_path / "v.jsonl"
    try:
        assert bench.main(["--quick", "--threads", "1", "--device-lists", "cpu,cpu:1", "--thread-sets", "1,1,1",
                           "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(before)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    points = [r for r in recs if r["kind"] == "validate"]
    assert recs[-1]["kind"] == "validate_summary" and recs[-1]["rounds"] == 1
    # the calibration point, split 0.3, fanouts 5,5 and csbm 2K, own and transferred
    assert sorted(r["axis"] for r in points) == ["calibration", "fanouts", "fanouts (transferred)", "size",
                                                 "size (transferred)", "split"]
    for r in points:
        assert r["measured_epoch_s"] > 0 and r["predicted_epoch_s"] > 0
        assert r["error"] == pytest.approx(r["predicted_epoch_s"] / r["measured_epoch_s"] - 1)
        assert r["gnnscale_rev"] is not None and "device_name" in r
    own = next(r for r in points if r["axis"] == "fanouts")
    moved = next(r for r in points if r["axis"] == "fanouts (transferred)")
    ref = next(r for r in points if r["axis"] == "calibration")
    assert moved["calibration"] == ref["calibration"] and moved["calibration"] != own["calibration"]
