"""benchmarks/own_model.py (issue #45): its cases; its case function in quick mode (in this process) gives a run
record per (model, engine) with its epoch times, the offload run's losses equal the in-memory run's, and the
summary per model has the ratio; the profiler breakdown sees gnnscale's CPU kernels and leaves them as they were;
render() and headline() on the real records quote them. No timing is asserted."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import own_model as bench
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records
from gnnscale.graph.datasets import load_dataset
from gnnscale.runtime import cpu_kernels


@pytest.fixture(scope="module")
def records() -> list[dict]:
    """Each quick case run in this process at one thread, marked as the harness marks them (one round)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cases = bench.cases(parser("own_model", bench).parse_args(["--quick"]))
        return [{**bench.run(c.params), "round": 0, "rounds": 1, "session": "s", "case": c.name} for c in cases]
    finally:
        torch.set_num_threads(threads)


def test_cases_of_the_default_and_quick_arguments() -> None:
    ap = parser("own_model", bench)
    default = bench.cases(ap.parse_args([]))
    assert [(c.name, c.group) for c in default] == [("graphconv inmemory", "graphconv"),
                                                    ("graphconv offload", "graphconv"),
                                                    ("gat inmemory", "gat"), ("gat offload", "gat")]
    p = default[0].params
    assert (p["dataset"], p["hidden"], p["epochs"], p["chunks"]) == (bench.DEFAULT_DATASET, 64, 5, 8)
    quick = bench.cases(ap.parse_args(["--quick", "--models", "graphconv", "--breakdown"]))
    assert [c.name for c in quick] == ["graphconv inmemory", "graphconv offload", "graphconv inmemory breakdown",
                                       "graphconv offload breakdown"]
    assert (quick[0].params["dataset"], quick[0].params["hidden"], quick[0].params["epochs"]) == (
        bench.QUICK_DATASET, 8, 2)
    assert quick[2].params["breakdown"] and quick[2].group is None


def test_a_run_per_model_and_engine_with_equal_losses(records: list[dict]) -> None:
    assert [(r["model"], r["engine"]) for r in records] == [("graphconv", "inmemory"), ("graphconv", "offload"),
                                                            ("gat", "inmemory"), ("gat", "offload")]
    for r in records:
        assert r["kind"] == "run" and r["status"] == "ok" and r["device_name"] and r["dataset"]
        assert len(r["epoch_times_s"]) == 2 and len(r["warmup_times_s"]) == 1 and r["median_epoch_s"] > 0
        assert len(r["losses"]) == 3
    offload = [r for r in records if r["engine"] == "offload"]
    assert all(r["chunks"] == 8 and "8 chunk(s)" in r["engine_detail"] for r in offload)
    assert all(r["counter_in_timed_epochs"] is False for r in offload)


def test_a_summary_per_model_with_the_ratio(records: list[dict]) -> None:
    summaries = {s["model"]: s for s, _ in bench.summaries(records)}
    assert list(summaries) == ["graphconv", "gat"]
    for s in summaries.values():
        med = s["median_epoch_s"]
        assert s["ratio"] == pytest.approx(med["offload"] / med["inmemory"])
        assert len(s["per_round_ratios"]) == 1 and s["runs_ok"] == s["runs"] == 2
        assert s["loss_max_abs_diff"] < 1e-4  # the engines are exact
    assert summaries["graphconv"]["bound"] == bench.BOUND
    assert summaries["graphconv"]["within_bound"] == (summaries["graphconv"]["ratio"] <= bench.BOUND)
    assert summaries["gat"]["within_bound"] is None
    assert f"{summaries['gat']['ratio']:.2f}" in bench.render(records)


def test_render_and_headline_quote_the_records() -> None:
    recs = read_records(RESULTS_DIR / "own_model.jsonl")
    text = bench.render(recs)
    # the latest commit's summaries (records before the harness carry them): each one's ratio is in the table
    latest = [r for r in recs if r.get("kind") == "summary" and r["gnnscale_rev"].startswith("0489656")]
    assert len(latest) == 4
    for s in latest:
        assert f"| {s['ratio']:.2f} |" in text and f"{min(s['per_round_ratios']):.2f}-" in text
    assert "1dbbf14" in text.split("Where the time goes")[1]  # the breakdown: the latest one, its own commit
    old = next(r for r in recs if r.get("breakdown_ms_per_epoch"))
    assert f"| {old['breakdown_ms_per_epoch']['offload']['wall']:.1f} |" in text
    rows = bench.headline(recs)
    conv = [r for r in latest if r["model"] == "graphconv" and r["dataset"] == bench.DEFAULT_DATASET]
    assert len(rows) == 1 and rows[0].figure.startswith(f"{conv[-1]['ratio']:.2f}x")
    assert {r["gnnscale_rev"] for r in rows[0].records} == {conv[-1]["gnnscale_rev"]}


@pytest.mark.usefixtures("one_thread")
def test_the_breakdown_times_the_kernels_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0)  # the fused kernels on a small graph too
    g = load_dataset("csbm:nodes=2000,avg_degree=10,features=64,classes=4")
    args = argparse.Namespace(seed=0, hidden=64, heads=2, dropout=0.5, chunks=2, warmup=1, epochs=1)
    before = cpu_kernels.csr_mm
    parts = bench.breakdown(g, "graphconv", "offload", args, epochs=1)
    assert cpu_kernels.csr_mm is before
    assert parts["wall"] > 0 and parts["dense"] > 0
    assert parts["sparse"] > 0 or not cpu_kernels.available()  # numba's kernels, seen through record_function
