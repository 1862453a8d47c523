"""The offload benchmarks and the kernel / transfer micro-benchmarks without running them: their cases from the
command line, and their sections rendered from the real records (a figure checked against the record it came
from) and from made-up records shaped like a --quick run's."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import gather, h2d_split, offload, offload_dedup, offload_memory_model, profile_kernels
from benchmarks.harness import registry
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records, session_of

MINE = ("offload", "offload_dedup", "gather", "h2d_split", "offload_memory_model", "profile_kernels", "revisions")


def _cases(name: str, module: Any, *argv: str) -> list[Any]:
    return module.cases(parser(name, module).parse_args(list(argv)))


def test_they_are_benchmarks() -> None:
    known = registry.benchmarks()
    assert all(name in known for name in MINE)


def test_offload_cases() -> None:
    cs = _cases("offload", offload)
    assert [c.name for c in cs] == ["gcn offload chunks 1 full/range", "gcn offload chunks 4 full/range",
                                    "gcn offload chunks 16 full/range", "gcn offload chunks 64 full/range",
                                    "gcn inmemory", "gcn pyg", "gcn pyg-sparse"]
    assert {c.group for c in cs} == {"gcn"}
    p = cs[1].params
    assert (p["impl"], p["chunks_requested"], p["budget_spec"], p["hidden"], p["epochs"], p["dataset"]) == (
        "offload", 4, None, 256, 5, offload.DEFAULT_DATASET)
    q = _cases("offload", offload, "--quick")
    assert [c.name for c in q] == ["gcn offload chunks 4 full/range", "gcn inmemory", "gcn pyg-sparse"]
    assert q[0].params["dataset"] == offload.QUICK_DATASET and q[0].params["epochs"] == 2
    # the flags the GPU check passes
    g = _cases("offload", offload, "--device", "cuda", "--dataset", offload.PRODUCTS_LIKE, "--models", "gcn,gat",
               "--layers", "2", "--hidden", "256", "--chunks", "", "--gpu-memory", "6,24", "--skip-pyg",
               "--warmup", "2", "--epochs", "5")
    assert [c.name for c in g] == ["gcn offload 6 full/range", "gcn offload 24 full/range", "gcn inmemory",
                                   "gat offload 6 full/range", "gat offload 24 full/range", "gat inmemory"]
    assert (g[0].params["device"], g[0].params["budget_spec"], g[0].params["warmup"]) == ("cuda", "6", 2)
    for bad in (["--dedup", "most"], ["--pyg", "dense"], ["--epochs", "0"], ["--models", "mlp9"]):
        with pytest.raises(SystemExit):
            _cases("offload", offload, *bad)


def test_offload_section_from_the_real_records() -> None:
    recs = read_records(RESULTS_DIR / "offload.jsonl")
    text = offload.render(recs)
    r = recs[4]  # GCN hidden 64, 64MB budget: the planner's 99 chunks
    assert (r["model"], r["hidden"], r["budget_spec"], r["chunks"]) == ("gcn", 64, "64MB", 99)
    row = (f"| offload | 99 | 64MB | {r['alpha']:.2f} | {r['median_epoch_s']:.3f} | {r['h2d_bytes'] / 1e9:.2f} "
           f"| {r['h2d_GBps']:.2f} | {r['peak_bytes'] / 2**20:.0f} | {r['plan_estimate_bytes'] / 2**20:.0f} "
           f"| {r['host_peak_rss_bytes'] / 2**20:.0f} | {r['ratio_vs_inmemory']:.2f} | {r['ratio_vs_pyg']:.2f} |")
    assert row == "| offload | 99 | 64MB | 9.51 | 3.398 | 1.18 | 0.35 | 23 | 64 | 251 | 9.18 | 4.53 |"
    assert row in text
    # the hidden-256 command ran twice (default allocator, then mmap off): the table shows the second run
    assert "| gnnscale inmemory |  |  |  | 0.686 |" in text and "| 0.170 |" not in text
    assert "| gnnscale inmemory |  |  |  | 1.170 |" not in text
    assert text == offload.render(list(recs))
    cpu, gpu = offload.headline(recs)  # per device type: the latest CPU run, and the GPU check's (6 GiB budget)
    assert "AMD EPYC" in cpu.what and "H200" in gpu.what
    assert {r["device"] for r in cpu.records} == {"cpu"} and gpu.records[0]["budget_spec"] == "6"
    for head in (cpu, gpu):
        off, inmem = head.records
        assert off["impl"] == "offload" and inmem["impl"] == "inmemory" and session_of(off) == session_of(inmem)
        assert head.figure.startswith(f"{off['median_epoch_s'] / inmem['median_epoch_s']:.2f}x in-memory's epoch")
        assert f"{off['h2d_bytes'] / 1e9:.2f} GB host->device per epoch" in head.figure


def _quick_record(impl: str, median: float, **kw: Any) -> dict[str, Any]:
    return {"session": "q", "impl": impl, "status": "ok", "model": "gcn", "hidden": 16, "median_epoch_s": median,
            "chunks_requested": kw.pop("chunks_requested", None), "budget_spec": None, "dedup_requested": None,
            "chunker_requested": None, "peak_kind": "cpu peak RSS increase", "host_peak_rss_bytes": 2**20, **kw}


def test_offload_renders_quick_shaped_and_failed_records() -> None:
    recs = [_quick_record("offload", 0.2, chunks_requested=4, chunks=4, dedup_requested="full",
                          chunker_requested="range", peak_kind="LiveBytesCounter", peak_bytes=3 * 2**20,
                          h2d_bytes=10**8, h2d_GBps=0.5),
            _quick_record("inmemory", 0.1), _quick_record("pyg-sparse", 0.4),
            {**_quick_record("pyg", 0.0), "status": "oom", "reason": "CUDA out of memory"}]
    text = offload.render(recs)
    assert "| offload | 4 | (forced) |  | 0.200 | 0.10 | 0.50 | 3 |  | 1 | 2.00 | 0.50 |" in text
    assert "| PyG `GCNConv`, edge_index |  |  |  | oom: CUDA out of memory |" in text


def test_offload_dedup_cases_and_section() -> None:
    cs = _cases("offload_dedup", offload_dedup)
    assert len(cs) == 9 + 7
    assert [c.group for c in cs[:1] + cs[-1:]] == ["4x8 gcn", "1x16 gcn"]
    assert {c.params["partitions"] for c in cs} == {4, 1}
    assert not [c for c in cs if c.group == "1x16 gcn" and c.params["impl"].startswith("pyg")]
    q = _cases("offload_dedup", offload_dedup, "--quick")
    assert [c.name for c in q] == ["2x4 gcn offload chunks 4 none/range", "2x4 gcn offload chunks 4 full/range",
                                   "2x4 gcn inmemory", "2x4 gcn pyg-sparse"]
    recs = read_records(RESULTS_DIR / "offload_dedup.jsonl")
    text = offload_dedup.render(recs)
    r = next(r for r in recs[32:] if (r["dedup"], r.get("chunker"), r["partitions"]) == ("full", "range", 4))
    assert r["gnnscale_rev"] == "9b5da19"  # the latest run of the 4 x 8 layout
    h2d = r["rows_h2d"] / 2 / r["nodes"]
    assert f"| 4 x 8 | full | range | yes | {r['rows_ori'] / 2 / r['nodes']:.3f} | {h2d:.3f} |" in text
    assert "| 4 x 8 | full | range | yes | 5.661 | 1.541 | 0.272 | 2.319 | 3.254 | 0.113 | 0.032 |" in text
    assert f"| offload | full | range | {r['median_epoch_s']:.3f} |" in text  # 1.507, not the older runs'
    assert "0.943" not in text and "4878794" not in text


def test_gather_cases_and_section() -> None:
    cs = _cases("gather", gather)
    assert [c.name for c in cs] == ["F=100", "F=128", "F=256"]
    assert (cs[0].params["rows_total"], cs[0].params["rows"], cs[0].params["reps"]) == (16_000_000, 2_000_000, 10)
    q = _cases("gather", gather, "--quick")
    assert [c.name for c in q] == ["F=100"] and q[0].params["rows"] == 100_000
    g = _cases("gather", gather, "--rows-total", "4000", "--rows", "500", "--features", "128", "--reps", "5",
               "--warmup", "1")
    assert [(c.params["rows_total"], c.params["rows"], c.params["reps"], c.params["warmup"]) for c in g] == [
        (4000, 500, 5, 1)]
    recs = read_records(RESULTS_DIR / "gather.jsonl")
    r = recs[-1]
    assert (r["features"], r["label"], r["order"]) == (256, "uva 16x256x4", "sorted")
    text = gather.render(recs)
    assert (f"| 256 | UVA Triton kernel 16x256x4 | sorted | {r['median_ms']:.2f} | {r['gbps']:.2f} "
            f"| {r['gbps'] / recs[5]['gbps']:.2f} | ok |") in text
    assert "| 256 | UVA Triton kernel 16x256x4 | sorted | 40.02 | 51.18 | 0.93 | ok |" in text
    skipped = gather.render([{"session": "q", "features": 100, "status": "skipped", "reason": "no CUDA"}])
    assert "Not measured: no CUDA." in skipped


def test_offload_memory_model_cases_and_section() -> None:
    (c,) = _cases("offload_memory_model", offload_memory_model)
    assert (c.params["nodes"], c.params["models"], c.params["dedups"], c.params["budget"]) == (
        30000, ["gcn", "gat", "sage", "gin"], ["auto", "full"], "24MB")
    q = _cases("offload_memory_model", offload_memory_model, "--quick")
    assert [x.params["nodes"] for x in q] == [3000] and q[0].params["models"] == ["gcn", "gat"]
    assert len(_cases("offload_memory_model", offload_memory_model, "--nodes", "1000,2000", "--features",
                      "8,16")) == 4
    rec = {"session": "q", "nodes": 3000, "degree": 10, "features": 64, "model": "gcn", "dedup": "full",
           "budget_bytes": 2_000_000, "chunks": 3, "estimate_bytes": 1_500_000, "counted_bytes": 1_000_000,
           "ratio": 1.5}
    text = offload_memory_model.render([rec])
    assert "| 3000 | 10 | 64 | gcn | full | 2,000,000 | 3 | 1,500,000 | 1,000,000 | 1.500 |" in text
    assert "Ratios in [1.500, 1.500]." in text


def test_h2d_split_cases_and_section() -> None:
    (c,) = _cases("h2d_split", h2d_split)
    assert c.params == {"dataset": h2d_split.DEFAULT_DATASET, "model": "gcn", "hidden": 64, "chunks": 16,
                        "dedup": "full"}
    (q,) = _cases("h2d_split", h2d_split, "--quick")
    assert q.params["dataset"] == h2d_split.QUICK_DATASET
    base = {"session": "q", "dataset": "d", "nodes": 10, "model": "gcn", "hidden": 64, "chunks": 16, "dedup": "full"}
    recs = [{**base, "topology": t, "epoch": e, **dict.fromkeys(h2d_split.COUNTERS, 1000 * e)}
            for t in ("resent", "resident") for e in (1, 2)]
    assert "| resident | 2 | 2,000 | 2,000 | 2,000 | 2,000 | 2,000 |" in h2d_split.render(recs)


def test_profile_kernels_cases_and_section() -> None:
    cs = _cases("profile_kernels", profile_kernels)
    assert [c.name for c in cs] == [f"{w} this" for w in profile_kernels.WORKLOADS]
    assert cs[0].params["nodes"] == 200_000 and cs[0].params["data"].endswith("csbm-n200000-c16-s0")
    q = _cases("profile_kernels", profile_kernels, "--quick")
    assert [(c.name, c.params["nodes"], c.params["epochs"]) for c in q] == [("gcn this", 5000, 2),
                                                                           ("offload this", 5000, 2)]
    b = _cases("profile_kernels", profile_kernels, "--workloads", "gat", "--baseline", "HEAD~3")
    assert [(c.name, c.group, c.rev) for c in b] == [("gat HEAD~3", "gat", "HEAD~3"), ("gat this", "gat", None)]
    with pytest.raises(SystemExit):
        _cases("profile_kernels", profile_kernels, "--workloads", "gcn,dgl")
    recs = [{"session": "q", "workload": "gcn", "revision": rev, "nodes": 5000, "median_s": t, "median_cpu_s": t,
             "train_peak_bytes": 2**30, "table": f"op table {rev}  \n  ops  "}
            for rev, t in (("this", 0.5), ("this", 0.7))]
    text = profile_kernels.render(recs)
    assert "| gcn | this | 5000 | 2 | 0.600 | 0.600 | 1.000 | - |" in text and "op table this\n  ops\n```" in text


def test_a_run_of_several_rounds_shows_each_configurations_median_round() -> None:
    recs = [_quick_record(impl, t, round=k, chunks_requested=4 if impl == "offload" else None)
            for k, (a, b) in enumerate([(0.30, 0.20), (0.10, 0.25), (0.20, 0.15)])
            for impl, t in (("offload", a), ("inmemory", b))]
    (rows,) = offload.runs(recs, lambda r: r["model"])
    assert sorted((r["impl"], r["median_epoch_s"]) for r in rows) == [("inmemory", 0.20), ("offload", 0.20)]
    (row,) = [line for line in offload.render(recs).splitlines() if line.startswith("| offload |")]
    assert "| 1.00 |" in row and "1.33" not in row  # 0.20 against 0.20, not the last round's 0.20 against 0.15
