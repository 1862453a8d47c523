"""benchmarks/taskparallel.py: its cases, and its case function on tiny graphs (in this process: each case's
``run`` writes engine or replication records with their fields); replication factors match the CLI's and, on a
complete graph, equal the part count; a hybrid P group's factor (the engine's assignment) is the engine's own count
of the rows it sends to the group; the peak explainer sees the tensors live at the peak; render() on the real
records quotes them."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest
import torch

from benchmarks import taskparallel as bench
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records
from gnnscale import load_dataset
from gnnscale.cli import main as cli_main
from gnnscale.config import TrainConfig
from gnnscale.graph.graph import Graph
from gnnscale.plan.taskparallel import p_group_parts, plan_taskparallel, replication_factor

DATASET = "csbm:nodes=300,avg_degree=30,features=8"  # dense: every part count replicates more rows
SPARSE = "kronecker:scale=10,edgefactor=2"  # sparse: a P group of 2 replicates some rows, not all


def _run(argv: list[str]) -> list[dict[str, Any]]:
    """Every case of ``argv`` run in this process at one thread (as the harness's child runs it), in order."""
    args = parser("taskparallel", bench).parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [r for case in bench.cases(args) for r in bench.run(case.params)]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return _run(["--device", "cpu", "--dataset", DATASET, "--devices", "4", "--hidden", "16", "--warmup", "1",
                 "--repeats", "2", "--parts", "1,2,4,8", "--explain-peaks"])


@pytest.fixture(scope="module")
def records8() -> list[dict]:
    """taskparallel alone on 8 devices (hybrid, P groups of 2) on a sparse graph."""
    return _run(["--device", "cpu", "--dataset", SPARSE, "--devices", "8", "--hidden", "16", "--warmup", "1",
                 "--repeats", "2", "--parts", "2,8", "--engines", "taskparallel"])


def test_cases_of_the_default_and_quick_arguments() -> None:
    ap = parser("taskparallel", bench)
    default = bench.cases(ap.parse_args(["--device", "cpu"]))
    assert [c.name.split(" ")[0] for c in default] == ["taskparallel", "offload", "inmemory", "replication"]
    assert {c.group for c in default[:3]} == {f"{bench.DEFAULT_DATASET}, 4 devices"} and default[3].group is None
    p = default[0].params
    assert (p["dataset"], p["devices"], p["hidden"], p["repeats"], p["warmup"]) == (
        bench.DEFAULT_DATASET, ["cpu"] * 4, 64, 5, 1)
    assert default[3].params["parts"] == [2, 4, 8, 16]
    quick = bench.cases(ap.parse_args(["--device", "cpu", "--quick", "--devices", "cpu,cpu"]))
    assert quick[0].params["dataset"] == bench.QUICK_DATASET and quick[0].params["devices"] == ["cpu", "cpu"]
    assert (quick[0].params["hidden"], quick[0].params["repeats"], quick[3].params["parts"]) == (16, 2, [2, 4])
    assert len(bench.cases(ap.parse_args(["--device", "cpu", "--parts", "", "--dataset", "a", "--dataset", "b"]))) == 6


def test_render_quotes_the_latest_cpu_runs_of_the_records() -> None:
    recs = read_records(RESULTS_DIR / "taskparallel.jsonl")
    text = bench.render(recs)
    cpu = [r for r in recs if r.get("kind") == "engine" and r.get("device") == "cpu"]
    kron = [r for r in cpu if r["engine"] == "offload" and len(r["devices"]) == 4 and "kronecker" in r["dataset"]]
    assert len(kron) == 3  # three runs of the same command: one value each, in order
    assert " / ".join(f"{r['mean_epoch_s']:.3f}" for r in kron) in text
    assert " / ".join(f"{r['tp_over_this_time']:.2f}" for r in kron) in text  # the ratios render() takes anew
    assert f"| {kron[-1]['tp_over_this_peak']:.2f} |" in text
    assert "NVIDIA" not in text and "cuda" not in text  # the GPU check's records are not this section's
    rows = bench.headline(recs)
    assert len(rows) == 1 and "kronecker" in rows[0].what  # the acceptance case, its latest run
    assert f"peak {rows[0].records[-1]['tp_over_this_peak']:.2f}x" in rows[0].figure


def test_engine_records_have_times_peaks_and_ratios(records: list[dict]) -> None:
    engines = {r["engine"]: r for r in records if r["kind"] == "engine"}
    assert list(engines) == ["taskparallel", "offload", "inmemory"]
    for name, r in engines.items():
        assert r["status"] == "ok" and r["device_name"] and r["kind"] == "engine"
        assert r["dataset"].startswith("csbm:") and r["nodes"] == 300
        assert r["repeats"] == 2 and len(r["epoch_times_s"]) == 2 and len(r["warmup_times_s"]) == 1
        assert 0 < r["min_epoch_s"] <= r["mean_epoch_s"]
        peaks = r["device_peak_bytes"]
        assert len(peaks) == (1 if name == "inmemory" else 4) and all(p > 0 for p in peaks)
        assert r["peak_device_bytes"] == max(peaks)
        assert len(r["peak_tensors"]) == len(peaks) and all(top for top in r["peak_tensors"])
    ratios = bench.compare(list(engines.values()))
    assert all(ratios[name]["time"] > 0 and ratios[name]["peak"] > 0 for name in engines)
    tp, off, mem = engines["taskparallel"], engines["offload"], engines["inmemory"]
    assert tp["model"] == mem["model"] == "dgcn" and off["model"] == "gcn" and "declines" in off["note"]
    assert off["partitions"] == 4 and off["dedup"] == "none" and off["workers"] == 4
    assert tp["regime"] == "one task per device" and tp["dependency"] == "exact"
    assert tp["p_rows_replication"] == 1.0  # one P task per device: every row sent once
    assert tp["p_rows_replication_per_epoch"] == tp["p_group_replication_per_epoch"] == [1.0, 1.0, 1.0]
    assert ratios["taskparallel"] == {"time": 1.0, "peak": 1.0}
    assert tp["losses"] == pytest.approx(mem["losses"], rel=1e-5)  # --dependency exact is the in-memory model
    # the in-memory engine's count starts from what it keeps on its device: the graph's features at least
    base = mem["counter_baseline_bytes"][0]
    assert base >= 300 * 8 * 4 and mem["peak_device_bytes"] > base
    assert ratios["offload"]["peak"] == pytest.approx(tp["peak_device_bytes"] / off["peak_device_bytes"])
    assert ratios["inmemory"]["time"] == pytest.approx(tp["mean_epoch_s"] / mem["mean_epoch_s"])
    assert f"| {ratios['offload']['peak']:.2f} |" in bench.render(records)


def test_replication_records_grow_with_parts_and_match_the_cli(records: list[dict]) -> None:
    rep = [r for r in records if r["kind"] == "replication"]
    assert [r["parts"] for r in rep] == [1, 2, 4, 8] and all(r["method"] == "metis" for r in rep)
    alphas = [r["data_parallel_replication"] for r in rep]
    assert alphas[0] == 1.0 and all(a >= 1.0 for a in alphas)
    assert all(b > a for a, b in zip(alphas, alphas[1:], strict=False)), alphas  # dense graph: strictly more
    assert [r["neutrontask_table2_papers100m"] for r in rep] == [None, 1.25, 1.52, 2.13]
    by = {r["parts"]: r for r in rep}
    assert by[4]["regime"] == "one task per device" and by[4]["p_group_size"] == 1
    assert by[4]["p_group_replication"] == 1.0
    assert by[8]["p_group_size"] == 2
    assert by[8]["metis_parts_of_group_replication"] == by[2]["data_parallel_replication"]
    # the P group's factor is the engine's assignment (chunks to members by slot), not METIS parts of the group
    g = load_dataset(DATASET)
    plan = plan_taskparallel(g, TrainConfig(model="dgcn", hidden=16, engine="taskparallel", devices=("cpu",) * 8),
                             torch.device("cpu"))
    assert by[8]["p_group_replication"] == replication_factor(g, p_group_parts(plan, 0)) > 1.0
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli_main(["partition", "--engine", "taskparallel", "--json", "--dataset", DATASET, "--hidden", "16",
                         "--devices", "cpu,cpu,cpu,cpu"]) == 0
    st = json.loads(buf.getvalue())
    assert st["data_parallel_replication"] == by[4]["data_parallel_replication"]
    assert st["p_group_replication"] == by[4]["p_group_replication"]


def test_hybrid_p_group_factor_is_the_engines_row_count(records8: list[dict]) -> None:
    tp = next(r for r in records8 if r["kind"] == "engine")
    assert tp["engine"] == "taskparallel" and tp["status"] == "ok" and len(tp["device_peak_bytes"]) == 8
    assert tp["regime"].startswith("hybrid") and tp["p_group_size"] == 2
    # rows sent T -> P per epoch over |V|, every epoch (regrouped each epoch) as the assignment predicts
    measured, predicted = tp["p_rows_replication_per_epoch"], tp["p_group_replication_per_epoch"]
    assert len(measured) == 3 and measured == pytest.approx(predicted, rel=1e-12)
    assert all(1.0 < x < 2.0 for x in measured)  # a group of 2: some rows twice (before #13's fix: all, 2.0)
    rep = {r["parts"]: r for r in records8 if r["kind"] == "replication"}
    assert rep[8]["p_group_size"] == 2 and tp["p_rows_replication"] == pytest.approx(rep[8]["p_group_replication"])
    assert set(bench.compare([tp])) == {"taskparallel"}  # nothing to compare with


def test_complete_graph_replicates_every_row_in_every_part() -> None:
    n = 8
    src, dst = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    off = src != dst
    g = Graph.from_edge_index(torch.stack([src[off], dst[off]]), n, x=torch.randn(n, 4),
                              y=torch.arange(n) % 2, train_mask=torch.ones(n, dtype=torch.bool), name="k8")
    rep = bench.replication_factors(g, [1, 2, 4, 8], TrainConfig(model="dgcn", hidden=4), torch.device("cpu"),
                                    "range", 0)
    assert [r["data_parallel_replication"] for r in rep] == [1.0, 2.0, 4.0, 8.0]
    assert [r["p_group_replication"] for r in rep] == [1.0, 1.0, 1.0, 2.0]  # 8 devices: P groups of 2


def test_peak_tensors_sees_what_is_live_at_the_peak() -> None:
    counter = bench.PeakTensors(baseline=100)
    with counter:
        a = torch.zeros(1000)  # 4000 bytes
        b = torch.ones(10, 10, dtype=torch.float64)  # 800 bytes: the peak, a and b live
        del a
        c = torch.ones(5)  # below the peak
    assert counter.peak == 100 + 4000 + 800
    top = counter.summary()
    assert [(t["shape"], t["dtype"], t["bytes"]) for t in top] == [([1000], "float32", 4000),
                                                                    ([10, 10], "float64", 800)]
    del b, c
