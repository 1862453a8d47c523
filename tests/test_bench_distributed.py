"""benchmarks/distributed.py, whatif_distributed.py and predict_epoch.py on the harness: their cases, the commands
they launch, and their RESULTS sections rendered from the real records."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import distributed, predict_epoch, whatif_distributed
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records


def _args(name: str, module: object, *argv: str):  # type: ignore[no-untyped-def]
    return parser(name, module).parse_args(list(argv))


def test_distributed_cases_pair_three_runs_per_dataset_and_rank_count(tmp_path: Path) -> None:
    cs = distributed.cases(_args("distributed", distributed, "--datasets", "csbm:nodes=500;csbm:nodes=600",
                                 "--ranks", "2,4", "--cache-dir", str(tmp_path)))
    assert len(cs) == 12 and len({c.group for c in cs}) == 4
    assert [c.params["strategy"] for c in cs[:3]] == ["model-centric", "micrograph", "minibatch"]
    assert all(c.env == {"GNNSCALE_CACHE_DIR": str(tmp_path)} for c in cs)
    assert cs[0].params["config"] == {"epochs": 3, "seed": 0, "model": "sage", "batch_size": None,
                                      "pregather": "on", "merge": "auto", "device": "cpu"}
    quick = distributed.cases(_args("distributed", distributed, "--quick"))
    assert [(c.params["dataset"], c.params["ranks"]) for c in quick] == [(distributed.QUICK_DATASET, 2)] * 3
    assert quick[0].params["config"]["epochs"] == 2 and quick[0].params["config"]["batch_size"] == 64


def test_the_benchmark_runs_both_strategies_and_the_reference_with_real_flags(tmp_path: Path) -> None:
    from gnnscale.cli import build_parser

    cs = distributed.cases(_args("distributed", distributed, "--ranks", "2,4", "--datasets", "csbm:nodes=500",
                                 "--batch-size", "50"))
    cmds = [distributed.command(c.params["config"], c.params["dataset"], c.params["ranks"], c.params["strategy"],
                                tmp_path / "m.jsonl") for c in cs]
    parsed = [build_parser().parse_args(c[c.index("gnnscale") + 1:]) for c in cmds]  # every flag exists
    seen = {(a.engine, a.strategy if a.engine == "distributed" else None, a.ranks, a.batch_size) for a in parsed}
    assert seen == {("distributed", "model-centric", 2, 50), ("distributed", "micrograph", 2, 50),
                    ("minibatch", None, None, 100), ("distributed", "model-centric", 4, 50),
                    ("distributed", "micrograph", 4, 50), ("minibatch", None, None, 200)}


def test_distributed_renders_the_latest_comparison_per_setting_from_its_records() -> None:
    recs = read_records(RESULTS_DIR / "distributed.jsonl")
    sel = distributed.select(recs)
    assert len(sel) == 12 and {r["gnnscale_rev"] for r in sel} == {"9b5da19"}  # the reruns RESULTS quotes
    text = distributed.render(recs)
    b = next(r for r in sel if r["graph"] == "amazon_electronics_computers" and r["ranks"] == 2
             and distributed.config_of(r)["merge"] == "off" and distributed.config_of(r)["epochs"] == 3)
    assert f"**{b['network_ratio']:.3f}**" in text and "**0.394**" in text
    mc = b["runs"]["model-centric"]["digest"]
    assert f"| {mc['network_bytes_per_epoch'] / 2**20:.2f} |" in text  # 15.56
    assert "| Amazon Computers | 4 | 25 (100) | 25 | 0.7468 | 0.7468 | 0.7468 | 0.7468 |" in text
    assert "4, 4, 3, 2, then 1" in text
    assert distributed.render(recs) == text  # pure


def test_distributed_pairs_the_harness_run_records_into_a_row() -> None:
    old = distributed.select(read_records(RESULTS_DIR / "distributed.jsonl"))[0]
    facts = {k: old[k] for k in ("dataset", "graph", "nodes", "edges", "features", "classes", "train_vertices",
                                 "feature_dtype", "whole_feature_bytes")}
    base = {"benchmark": "distributed", "session": "s1", "round": 0, "ok": True, "ranks": old["ranks"],
            "kind": "distributed-run", "config": distributed.config_of(old), **facts}
    new = [{**base, "strategy": name, "run": json.loads(json.dumps({k: v for k, v in old["runs"][name].items()
                                                                    if k != "epochs"}))}
           for name in distributed.RUNS]
    (row,) = distributed.rows(new)
    assert row["network_ratio"] == old["network_ratio"] and row["acc_diff_points"] == old["acc_diff_points"]
    failed = distributed.rows([*new[:2], {**base, "strategy": "minibatch", "ok": False, "error": "boom"}])
    assert failed[0]["runs"]["minibatch"] == {"ok": False, "error": "boom", "command": "minibatch"}


def test_whatif_cases_and_render_from_its_records() -> None:
    full = whatif_distributed.cases(_args("whatif_distributed", whatif_distributed))
    assert len(full) == 12 and {c.group for c in full} == {"grid"}
    assert {(c.params["ranks"], c.params["network"]) for c in full} == {
        (k, n) for k in (2, 3, 4) for n in ("1Gbit,latency=100us", "100Mbit,latency=100us")}
    quick = whatif_distributed.cases(_args("whatif_distributed", whatif_distributed, "--quick"))
    assert [(c.params["ranks"], c.params["network"], c.params["strategy"], c.params["epochs"]) for c in quick] == [
        (2, "100Mbit,latency=100us", "micrograph", 3)]
    recs = read_records(RESULTS_DIR / "whatif_distributed.jsonl")
    text = whatif_distributed.render(recs)
    last = recs[-1]  # 4 ranks, 100 Mbit, model-centric of the latest run (23ff567)
    assert last["gnnscale_rev"] == "23ff567"
    row = (f"| 4 | 100 Mbit | model-centric | {statistics.median(last['epoch_s']):.3f} | "
           f"{last['predicted_s']:.3f} | {100 * last['error_frac']:+.0f}% |")
    assert row in text and row == "| 4 | 100 Mbit | model-centric | 0.525 | 0.520 | -1% |"
    assert "**12 of 12 within 25%** (worst -17%)" in text
    (head,) = whatif_distributed.headline(recs)
    assert head.figure.startswith("12 of 12 cells within 25%") and len(head.records) == 12


def test_predict_epoch_cases_and_render_from_its_records() -> None:
    full = predict_epoch.cases(_args("predict_epoch", predict_epoch, "--engines", "inmemory,offload"))
    assert {c.params["graph"] for c in full} <= set(predict_epoch.GRAPHS) and len(full) % 2 == 0
    assert all(c.group == c.params["graph"] for c in full)
    quick = predict_epoch.cases(_args("predict_epoch", predict_epoch, "--quick"))
    assert {c.params["graph"] for c in quick} == set(predict_epoch.QUICK)
    engines = {c.params["engine"] for c in quick}
    assert "distributed" not in engines and "inmemory" in engines
    recs = read_records(RESULTS_DIR / "predict_epoch.jsonl")
    text = predict_epoch.render(recs)
    mine = [r for r in recs if r.get("commit") == "d2cb84c" and r["engine"] == "hybrid"
            and r["graph"].startswith("csbm:nodes=200000")]
    assert len(mine) == 2  # two rounds of the latest run
    m = statistics.median(r["measured_s"] for r in mine)
    p = statistics.median(r["predicted_s"] for r in mine)
    assert f"| csbm 200K, degree 10, 64 features | hybrid | gcn | {m:.3f} | {p:.3f} | {100 * (p / m - 1):+.0f}% |" \
        in text
    assert "| 0.316 | 0.475 | +50% |" in text and "**12 of 15 within 25%.**" in text and "commit d2cb84c" in text
    (head,) = predict_epoch.headline(recs)
    assert "15 engine x graph cases" in head.figure and "p90" in head.figure
    assert predict_epoch.graph_label("edgelist:/x/web-cnr-2000.txt.gz") == "web-cnr-2000"
