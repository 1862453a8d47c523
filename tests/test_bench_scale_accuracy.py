"""The scale and accuracy benchmarks (``python -m benchmarks disk_scale|inmemory_scaling|sampled_accuracy|
bf16_accuracy``): their cases for the default and --quick flags, their pure summaries, and render()/headline() on
the real records files, each checked against the record a figure comes from."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from benchmarks import bf16_accuracy, disk_scale, inmemory_scaling, sampled_accuracy
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records


def _args(name: str, module: object, *argv: str):  # noqa: ANN202 - an argparse namespace
    return parser(name, module).parse_args(list(argv))


# ------------------------------------------------------------------------------------------------------ disk_scale
def test_disk_scale_cases() -> None:
    cases = disk_scale.cases(_args("disk_scale", disk_scale, "--dir", "/d", "--pair", "--extra", "--batch-size", "8"))
    assert [(c.name, c.group, c.params["host_memory"]) for c in cases] == [("disk", "train", "4GiB"),
                                                                           ("ram", "train", None)]
    assert cases[0].params["extra"] == ["--batch-size", "8"] and cases[0].params["dir"] == "/d"
    conv = disk_scale.cases(_args("disk_scale", disk_scale, "--dir", "/d", "--spec", "kronecker:scale=9",
                                  "--convert-only"))
    assert [(c.name, c.params["spec"], c.params["replace"]) for c in conv] == [("convert", "kronecker:scale=9", False)]
    quick = disk_scale.cases(_args("disk_scale", disk_scale, "--quick"))
    assert [c.name for c in quick] == ["convert", "disk", "ram"]
    assert quick[0].params["dir"] == str(disk_scale.QUICK_DIR) and quick[0].params["replace"]
    with pytest.raises(SystemExit):
        disk_scale.cases(_args("disk_scale", disk_scale))


def test_disk_scale_render_and_headline() -> None:
    records = read_records(RESULTS_DIR / "disk_scale.jsonl")
    text = disk_scale.render(records)
    k18 = [disk_scale.flat(r) for r in records if r["kind"] == "train" and r["dir"] == "/tmp/hm/k18acc"]
    mb = next(r for r in k18 if r["engine"] == "minibatch" and r["host_memory"])
    assert mb["peak_rss_bytes"] // 2**20 == 910 and mb["within_bound"]
    assert f"| {mb['peak_rss_bytes'] / 2**20:.0f} | {mb['host_bound_bytes'] / 2**20:.0f} | yes |" in text
    assert "| `/work/big/k22` | minibatch sage | c9e15c8 | 3.7, 3.6, 4.1 | 3.3, 3.0, 3.2 | 3.71 | 3.20 | **1.16x** |" \
        in text
    assert "killed (OOM)" in text and text.count("| `kronecker:scale=") == 6
    (row,) = disk_scale.headline(records)
    (rec,) = row.records
    assert rec["gnnscale_rev"] == "c4aabae" and rec["dir"] == "/work/big/k25" and rec["command"]
    assert "33,554,432 vertices, 1,047,214,494 edges" in row.figure
    assert f"epoch {rec['epoch_time_s']:.1f} s" in row.figure and "epoch 133.1 s" in row.figure


# -------------------------------------------------------------------------------------------------- inmemory_scaling
def test_inmemory_scaling_cases() -> None:
    cases = inmemory_scaling.cases(_args("inmemory_scaling", inmemory_scaling))
    assert [c.name for c in cases] == [f"{m} {n}" for m in ("gcn", "sage") for n in (100000, 200000, 400000)]
    assert {c.group for c in cases} == {"scaling"} and cases[0].params == {"model": "gcn", "nodes": 100000,
                                                                            "warmup": 1, "epochs": 3}
    quick = inmemory_scaling.cases(_args("inmemory_scaling", inmemory_scaling, "--quick"))
    assert [c.name for c in quick] == ["gcn 5000", "gcn 10000"]


def test_inmemory_scaling_render_and_headline() -> None:
    records = read_records(RESULTS_DIR / "inmemory_scaling.jsonl")
    runs = [r for r in records if r["kind"] == "run" and r["revision"] == "ca569ee" and r["model"] == "gcn"
            and r["nodes"] == 400000]
    med = statistics.median(r["epoch_s"] for r in runs)
    text = inmemory_scaling.render(records)
    assert f"| gcn | 400,000 | 3,999,576 | {med:.3f} s (" in text and f"{med:.3f}" == "0.884"
    assert "| 4.58x | 4.00x | 1.14 | 3 |" in text and "commit ca569ee" in text
    (row,) = inmemory_scaling.headline(records)
    assert "400,000 vertices" in row.figure and "GCN 0.884 s" in row.figure and len(row.records) == 18


# -------------------------------------------------------------------------------------------------- sampled_accuracy
def test_sampled_accuracy_cases(tmp_path: Path) -> None:
    root = tmp_path / "datasets"
    (root / sampled_accuracy.AMAZON).parent.mkdir(parents=True)
    (root / sampled_accuracy.AMAZON).write_bytes(b"")
    cases = sampled_accuracy.cases(_args("sampled_accuracy", sampled_accuracy, "--root", str(root)))
    assert len(cases) == 3 * (5 + 3)  # seeds x (GCN: 4 sampled + in-memory; GAT: 2 sampled + in-memory)
    assert cases[0].group == "gcn seed 0" and cases[0].params["flags"] == [] and cases[0].params["epochs"] == 30
    quick = sampled_accuracy.cases(_args("sampled_accuracy", sampled_accuracy, "--root", str(root), "--quick"))
    assert [(c.params["model"], c.params["seed"], c.params["fanouts"], c.params["epochs"]) for c in quick] == [
        ("gcn", 0, "default", 3), ("gcn", 0, "all", 3)]
    with pytest.raises(SystemExit):
        sampled_accuracy.cases(_args("sampled_accuracy", sampled_accuracy, "--root", str(tmp_path / "none")))


def test_sampled_accuracy_summary_marks_failed_seeds() -> None:
    runs = [{"model": "gcn", "engine": "minibatch", "fanouts": f, "norm": "sampled", "seed": s, "ok": ok,
             "test_acc_at_best_val": a, "final_test_acc": a, "median_epoch_s": 0.1}
            for f, s, ok, a in [("default", 0, True, 0.70), ("default", 1, False, None), ("all", 0, True, 0.71),
                                ("all", 1, True, 0.73)]]
    default, ref = sampled_accuracy.summarise(runs, 2.0)
    assert default["failed_seeds"] == [1] and ref["median_test_acc_at_best_val"] == pytest.approx(0.72)
    assert default["diff_points_test_acc_at_best_val"] == pytest.approx(-2.0)
    assert not default["within_bound"]  # a failed seed: not a pass, whatever the figure


def test_sampled_accuracy_render_and_headline() -> None:
    records = read_records(RESULTS_DIR / "sampled_accuracy.jsonl")
    text = sampled_accuracy.render(records)
    assert text.count("| model | engine |") == 3  # one table per run of the benchmark
    nine = [r for r in records if r["kind"] == "summary" and len(r["seeds"]) == 9 and r["fanouts"] == "default"]
    (s,) = nine
    assert f"| -{abs(s['diff_points_test_acc_at_best_val']):.2f} | FAIL |" in text
    assert f"**{100 * s['median_test_acc_at_best_val']:.2f}**" in text and "**73.20**" in text
    assert "| gat | minibatch | default | sampled | 0, 1, 2 | **82.13**" in text
    rows = {r.what.split(",")[1].split()[0]: r for r in sampled_accuracy.headline(records)}
    assert rows["GCN"].figure.startswith("-4.02 points (73.20 vs 77.23 %, median of 9 seeds, lr 0.005")
    assert rows["GAT"].figure.startswith("+1.11 points") and "PASS" in rows["GAT"].figure
    assert {r["gnnscale_rev"] for r in rows["GCN"].records} == {"41d3011"}


# ----------------------------------------------------------------------------------------------------- bf16_accuracy
def test_bf16_cases(tmp_path: Path) -> None:
    (tmp_path / "planetoid").mkdir()
    (tmp_path / "planetoid" / "ind.cora.x").write_bytes(b"")
    cases = bf16_accuracy.cases(_args("bf16_accuracy", bf16_accuracy, "--root", str(tmp_path)))
    assert [c.name for c in cases][:2] == ["cora seed 0 fp32", "cora seed 0 bf16"] and cases[0].group == "cora seed 0"
    assert [c.name for c in cases][6:] == ["citeseer: missing", "computers: missing"]
    quick = bf16_accuracy.cases(_args("bf16_accuracy", bf16_accuracy, "--root", str(tmp_path), "--quick"))
    assert [(c.name, c.params["epochs"]) for c in quick] == [("cora seed 0 fp32", 20), ("cora seed 0 bf16", 20)]
    assert bf16_accuracy.run(cases[-1].params)["skipped"].endswith("not found")


def test_bf16_render_of_records() -> None:
    recs = [{"session": "s", "dataset": "cora", "seed": s, "dtype": d, "test_acc_at_best_val": a,
             "feature_bytes": 2**20 * (4 if d == "fp32" else 2), "bound_points": 0.5, "command": "c",
             "gnnscale_rev": "r"}
            for s, d, a in [(0, "fp32", 0.830), (0, "bf16", 0.831), (1, "fp32", 0.818), (1, "bf16", 0.818)]]
    recs.append({"session": "s", "dataset": "citeseer", "skipped": "x not found", "bound_points": 0.5})
    text = bf16_accuracy.render(recs)
    assert "| cora | 83.0 / 81.8 | 83.1 / 81.8 | +0.05 | 0.10 | 4.0 / 2.0 MiB | yes |" in text
    assert "| citeseer | not run: x not found |" in text
    (row,) = bf16_accuracy.headline(recs)
    assert "cora +0.05" in row.figure and len(row.records) == 4


def test_bf16_render_of_the_records_file() -> None:
    saved = read_records(RESULTS_DIR / "bf16_accuracy.jsonl")
    text = bf16_accuracy.render(saved)
    last = saved[-1]["session"]
    cora = {(r["seed"], r["dtype"]): r for r in saved if r["dataset"] == "cora" and r["session"] == last}
    fp32 = " / ".join(f"{100 * cora[(s, 'fp32')]['test_acc_at_best_val']:.1f}" for s in (0, 1, 2))
    assert f"| cora | {fp32} |" in text and fp32 == "83.0 / 81.8 / 82.3"
    assert "| citeseer | not run:" in text and "| computers | 82.4 / 84.0 / 83.1 |" in text
