"""benchmarks/accuracy.py: its cases, which records it shows, and its tables from the real records."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from benchmarks import accuracy
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records


def _args(*argv: str) -> Any:
    return parser("accuracy", accuracy).parse_args(list(argv))


def test_default_cases_are_every_workload_seed_and_system() -> None:
    cs = accuracy.cases(_args())
    want = sum(len(w.seeds) * len(w.systems) for w in accuracy.WORKLOADS.values())
    assert len(cs) == want == len({c.name for c in cs})
    assert cs[0].name == "cora-gcn/gnnscale/seed0"
    assert cs[0].params["epochs"] == 200 and cs[0].group is None
    gin = [c for c in cs if c.params["workload"] == "photo-gin-bn"]
    assert [(c.params["system"], c.params["seed"]) for c in gin] == [
        (s, seed) for seed in (0, 1, 2) for s in ("gnnscale", "pyg")]
    assert {c.group for c in gin if c.params["seed"] == 1} == {"photo-gin-bn/seed1"}  # one comparison per seed
    assert Path(cs[0].params["root"]).is_absolute()  # the case process runs in a temporary folder


def test_quick_and_flags() -> None:
    cs = accuracy.cases(_args("--quick"))
    assert [(c.params["workload"], c.params["seed"], c.params["epochs"]) for c in cs] == [
        ("cora-gcn", 0, 50), ("cora-gcn", 1, 50)]
    cs = accuracy.cases(_args("--workloads", "computers-gcn", "--seeds", "7", "--epochs", "3"))
    assert [(c.name, c.params["epochs"]) for c in cs] == [("computers-gcn/gnnscale/seed7", 3)]
    with pytest.raises(SystemExit, match="unknown workload"):
        accuracy.cases(_args("--workloads", "nope"))


def test_a_missing_dataset_fails_with_the_path_looked_for(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"planetoid/ind\.cora\.x not found"):
        accuracy.run({"workload": "cora-gcn", "system": "gnnscale", "seed": 0, "epochs": 1, "root": str(tmp_path),
                      "device": "cpu"})


def _rec(workload: str, system: str, seed: int, acc: float, session: str, **kw: Any) -> dict[str, Any]:
    w = accuracy.WORKLOADS[workload]
    return {"workload": workload, "system": system, "seed": seed, "test_acc_at_best_val": acc, "session": session,
            "ok": True, "dataset": w.label, "model": w.model, "hidden": w.hidden, "norm": w.norm,
            "input_dropout": w.input_dropout, "epochs": w.epochs, "engine": "inmemory", "command": "c",
            "gnnscale_rev": "abc", **kw}


def test_the_latest_run_per_workload_and_system_is_shown() -> None:
    recs = [_rec("cora-gcn", "gnnscale", s, 0.5, "old") for s in range(3)]
    recs += [_rec("cora-gcn", "gnnscale", 0, 0.80, "new"), _rec("cora-gcn", "gnnscale", 1, 0.82, "new"),
             {"workload": "cora-gcn", "system": "gnnscale", "seed": 2, "ok": False, "session": "new", "error": "x"},
             _rec("photo-gin-bn", "gnnscale", 0, 0.7759, "gin"), _rec("photo-gin-bn", "pyg", 0, 0.7749, "gin")]
    sel = accuracy.selected(recs)
    assert list(sel) == [("cora-gcn", "gnnscale"), ("photo-gin-bn", "gnnscale"), ("photo-gin-bn", "pyg")]
    assert [r["test_acc_at_best_val"] for r in sel[("cora-gcn", "gnnscale")]] == [0.80, 0.82]
    text = accuracy.render(recs)
    assert "| Cora, Planetoid split | GCN, hidden 16, 200 epochs | 81.0 ± 1.4% (seeds 0, 1) | 81.5% |" in text
    assert '| PyG `GIN(norm="batch_norm")` | 0.7749 | 0 | **0.7749** |' in text
    rows = accuracy.headline(recs)
    assert rows[0].figure == "Cora GCN 81.0% (published 81.5%)"
    assert rows[1].figure == "median 0.7759 vs PyG 0.7749 (1 seeds)"
    assert accuracy.render([]) == "No successful run recorded.\n"


def test_render_of_the_real_records_quotes_them() -> None:
    records = read_records(RESULTS_DIR / "accuracy.jsonl")
    assert records, "benchmarks/results/accuracy.jsonl holds the benchmark's runs"
    text = accuracy.render(records)
    sel = accuracy.selected(records)
    for key, name in (("cora-gcn", "Cora"), ("computers-gcn", "Amazon Computers")):
        accs = [r["test_acc_at_best_val"] for r in sel[(key, "gnnscale")]]
        assert len(accs) == 5
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {name}"))
        assert f"{100 * statistics.mean(accs):.1f} ± {100 * statistics.stdev(accs):.1f}% (seeds 0-4)" in line
        assert f"{100 * accuracy.PUBLISHED[key][0]:.1f}%" in line
    pyg = [r["test_acc_at_best_val"] for r in sel[("photo-gin-bn", "pyg")]]
    assert f"**{statistics.median(pyg):.4f}**" in text
    assert " / ".join(f"{a:.4f}" for a in pyg) in text
    assert "Command: `python -m benchmarks accuracy`" in text
    figure = accuracy.headline(records)[0].figure
    cora = statistics.mean(r["test_acc_at_best_val"] for r in sel[("cora-gcn", "gnnscale")])
    assert figure.startswith(f"Cora GCN {100 * cora:.1f}% (published 81.5%); Computers GCN ")
