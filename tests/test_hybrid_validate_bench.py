"""benchmarks/hybrid_validate.py: its statistics (percentile, signed and absolute error summaries, which runs count
as away from the calibration point), its cases and plan of engines and points, one tiny run of its case function
(in this process; no timing asserts), and render() on the real records."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import hybrid_validate as bench
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records, session_of


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


def test_cases_of_the_default_and_quick_arguments() -> None:
    ap = parser("hybrid_validate", bench)
    default = bench.cases(ap.parse_args([]))
    assert [c.name for c in default] == ["cpu", "cpu,cpu:1"] and bench.ROUNDS == 3
    p = default[1].params
    assert (p["reference"], p["sizes"], p["fanouts_list"], p["epochs"], p["hidden"]) == (
        bench.REFERENCE, "20000,100000", "5,5;10,10;25,10", 2, 128)
    quick = bench.cases(ap.parse_args(["--quick", "--device-lists", "cpu,cpu:1", "--hidden", "32"]))
    assert len(quick) == 1 and quick[0].params["device_lists"] == "cpu,cpu:1"
    q = quick[0].params
    assert (q["reference"], q["sizes"], q["splits"], q["warmup"], q["epochs"], q["hidden"]) == (
        bench.QUICK["reference"], "2000", "0.3", 0, 1, 32)


def test_render_summarizes_the_latest_run_of_the_records() -> None:
    recs = read_records(RESULTS_DIR / "hybrid_validate.jsonl")
    text = bench.render(recs)
    last = [r for r in recs if session_of(r) == session_of(recs[-1])]
    stored = next(r for r in last if r["kind"] == "validate_summary")  # what the run itself summarized
    away = stored["away"]
    assert (f"| all away from calibration | {away['n']} | {100 * away['median_abs']:.1f}% | "
            f"{100 * away['p90_abs']:.1f}% | {100 * away['worst_abs']:.1f}% |") in text
    c = stored["per_config"]["cpu,cpu:1 split 0.9"]
    assert f"| cpu,cpu:1 split 0.9 | split | 3 | {100 * c['median']:+.1f}% [" in text
    assert str(recs[-1]["gnnscale_rev"]) in text


def test_quick_run_writes_point_records() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (case,) = bench.cases(parser("hybrid_validate", bench).parse_args(
            ["--quick", "--device-lists", "cpu,cpu:1", "--thread-sets", "1,1,1"]))
        points = bench.run(case.params)
    finally:
        torch.set_num_threads(before)
    assert all(r["kind"] == "validate" for r in points)
    # the calibration point, split 0.3, fanouts 5,5 and csbm 2K, own and transferred
    assert sorted(r["axis"] for r in points) == ["calibration", "fanouts", "fanouts (transferred)", "size",
                                                 "size (transferred)", "split"]
    for r in points:
        assert r["measured_epoch_s"] > 0 and r["predicted_epoch_s"] > 0
        assert r["error"] == pytest.approx(r["predicted_epoch_s"] / r["measured_epoch_s"] - 1)
        assert "device_name" in r
    own = next(r for r in points if r["axis"] == "fanouts")
    moved = next(r for r in points if r["axis"] == "fanouts (transferred)")
    ref = next(r for r in points if r["axis"] == "calibration")
    assert moved["calibration"] == ref["calibration"] and moved["calibration"] != own["calibration"]
    s = bench.summarize(points)
    assert s["away"]["n"] == 3 and "cpu,cpu:1 split 0.3" in bench.render(points)
