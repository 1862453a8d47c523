"""benchmarks/own_model.py (issue #45) in its quick mode: one round writes a run record per (model, engine) with
its epoch times, the offload run's losses equal the in-memory run's, and a summary per model with the ratio; the
profiler breakdown sees gnnscale's CPU kernels and leaves them as they were. No timing is asserted."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

from gnnscale.graph.datasets import load_dataset
from gnnscale.runtime import cpu_kernels

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import own_model as bench  # noqa: E402


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("bench") / "own_model.jsonl"
    threads = torch.get_num_threads()
    assert bench.main(["--quick", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads  # the benchmark's one thread does not outlive it
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_run_per_model_and_engine_with_equal_losses(records: list[dict]) -> None:
    runs = [r for r in records if r["kind"] == "run"]
    assert [(r["model"], r["engine"]) for r in runs] == [("graphconv", "inmemory"), ("graphconv", "offload"),
                                                         ("gat", "inmemory"), ("gat", "offload")]
    for r in runs:
        assert r["status"] == "ok" and r["round"] == 1 and r["threads"] == 1
        assert len(r["epoch_times_s"]) == 2 and len(r["warmup_times_s"]) == 1 and r["median_epoch_s"] > 0
        assert len(r["losses"]) == 3 and r["loss_max_abs_diff"] < 1e-4
        assert r["device_name"] and r["torch"] == torch.__version__ and r["command"] and r["dataset"]
    offload = [r for r in runs if r["engine"] == "offload"]
    assert all(r["chunks"] == 8 and "8 chunk(s)" in r["engine_detail"] for r in offload)
    assert all(r["counter_in_timed_epochs"] is False for r in offload)


def test_a_summary_per_model_with_the_ratio(records: list[dict]) -> None:
    summaries = {r["model"]: r for r in records if r["kind"] == "summary"}
    assert list(summaries) == ["graphconv", "gat"]
    for s in summaries.values():
        med = s["median_epoch_s"]
        assert s["ratio"] == pytest.approx(med["offload"] / med["inmemory"])
        assert len(s["per_round_ratios"]) == 1 and s["runs_ok"] == s["runs"] == 2
    assert summaries["graphconv"]["bound"] == bench.BOUND
    assert summaries["graphconv"]["within_bound"] == (summaries["graphconv"]["ratio"] <= bench.BOUND)
    assert summaries["gat"]["within_bound"] is None


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
