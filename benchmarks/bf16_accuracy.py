"""Accuracy cost of bfloat16 feature storage (issue #29): GCN in memory, float32 against bfloat16 features.

Accuracy cost of bfloat16 feature storage (issue #29 item 5): GCN trained in memory on float32 features against
the same run on the features stored in bfloat16 (``feature_dtype=bf16``: rounded to bfloat16, upcast to float32 on
the device), on Cora, CiteSeer and Amazon Computers.

    python -m benchmarks bf16_accuracy
    python -m benchmarks bf16_accuracy --datasets cora --seeds 0 --epochs 20

The goal: the bfloat16 run within 0.5 point of the float32 run (median over the seeds of the per-seed difference
of the test accuracy at the best validation epoch).

Datasets (``--root``, default ``../shared/datasets`` from the repository root): ``planetoid/ind.cora.*`` and
``planetoid/ind.citeseer.*`` (standard Planetoid split, row-normalised features) and
``gnn-benchmark/amazon_electronics_computers.npz`` (20/30 per class, the rest test, drawn with the seed). A data
set whose files are missing is one case that records why (``"skipped"``).

Protocol: ``TrainConfig`` defaults (GCN, 2 layers, hidden 64, dropout 0.5, lr 0.01, weight decay 5e-4), 200
epochs, engine ``inmemory`` on the CPU, seeds 0, 1, 2; both runs of a seed use the same split and initialisation,
so the only difference is the features' rounding. Cases: one per (data set, seed, dtype), the two dtypes of a
(data set, seed) one group; one record each (test accuracy at best validation, the feature matrix's bytes). The
table: per data set the per-seed accuracies (fp32 / bf16), the median difference in points and whether its absolute
value is at most ``--bound`` (0.5). ``--quick``: Cora, seed 0, 20 epochs.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, Row, latest_session, split_list
from benchmarks.harness.records import provenance, table

TITLE = "bf16 feature storage (issue #29)"
ROUNDS = 1  # training on the CPU with fixed seeds: a second round gives the same accuracies
REPO = Path(__file__).resolve().parents[1]
SPECS = {
    "cora": ("planetoid:cora", "planetoid", "planetoid/ind.cora.x"),
    "citeseer": ("planetoid:citeseer", "planetoid", "planetoid/ind.citeseer.x"),
    "computers": ("npz:gnn-benchmark/amazon_electronics_computers.npz", "",
                  "gnn-benchmark/amazon_electronics_computers.npz"),
}
DTYPES = ("fp32", "bf16")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--root", default=str(REPO.parent / "shared" / "datasets"))
    ap.add_argument("--datasets", default="cora,citeseer,computers", help="comma list (--quick cora)")
    ap.add_argument("--seeds", default="0,1,2", help="comma list (--quick 0)")
    ap.add_argument("--epochs", type=int, default=200, help="default 200 (--quick 20)")
    ap.add_argument("--bound", type=float, default=0.5, help="goal, in points (default 0.5)")


def cases(args: argparse.Namespace) -> list[Case]:
    quick = args.quick
    names = ["cora"] if quick and args.datasets == "cora,citeseer,computers" else split_list(args.datasets)
    seeds = [0] if quick and args.seeds == "0,1,2" else [int(s) for s in split_list(args.seeds)]
    epochs = 20 if quick and args.epochs == 200 else args.epochs
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise SystemExit(f"error: --datasets: unknown {unknown}; known: {', '.join(SPECS)}")
    out = []
    for name in names:
        need = Path(args.root) / SPECS[name][2]
        common = {"dataset": name, "root": args.root, "epochs": epochs, "bound_points": args.bound}
        if not need.exists():
            out.append(Case(f"{name}: missing", {**common, "skipped": f"{need} not found"}))
            continue
        out += [Case(f"{name} seed {seed} {dtype}", {**common, "seed": seed, "dtype": dtype},
                     group=f"{name} seed {seed}") for seed in seeds for dtype in DTYPES]
    return out


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One GCN training in memory with the features in ``params["dtype"]``; or the record of a missing data set."""
    keep = {k: params[k] for k in ("dataset", "epochs", "bound_points")}
    if params.get("skipped"):
        return {**keep, "skipped": params["skipped"]}
    from benchmarks.harness.graphs import device_name
    from gnnscale import TrainConfig, load_dataset, train

    spec, sub, _ = SPECS[params["dataset"]]
    root = Path(params["root"])
    g = load_dataset(f"{spec}:feature_dtype={params['dtype']}", root / sub if sub else root, seed=params["seed"])
    cfg = TrainConfig(model="gcn", engine="inmemory", epochs=params["epochs"], seed=params["seed"])
    res = train(g, cfg, "cpu")
    return {**keep, "spec": spec, "graph": g.name, "nodes": g.num_nodes, "seed": params["seed"],
            "dtype": params["dtype"], "feature_bytes": int(g.nbytes()["features"]),
            "test_acc_at_best_val": float(res.summary["test_acc_at_best_val"]),
            "final_test_acc": float(res.summary["final_test_acc"]), "device": "cpu",
            "device_name": device_name("cpu")}


def describe(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"
    return f"test acc at best val {100 * r['test_acc_at_best_val']:.1f}%"


def summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per data set: per-seed accuracies (%) of each dtype, median and max |bf16 - fp32| (points), feature bytes."""
    out = []
    for name in dict.fromkeys(r["dataset"] for r in records):
        rs = [r for r in records if r["dataset"] == name]
        skipped = next((r["skipped"] for r in rs if r.get("skipped")), None)
        if skipped:
            out.append({"dataset": name, "skipped": skipped})
            continue
        acc = {(r["seed"], r["dtype"]): 100 * r["test_acc_at_best_val"] for r in rs}
        seeds = sorted({s for s, d in acc if (s, "fp32") in acc and (s, "bf16") in acc})
        diff = [acc[(s, "bf16")] - acc[(s, "fp32")] for s in seeds]
        size = {r["dtype"]: r["feature_bytes"] for r in rs}
        med = statistics.median(diff) if diff else None
        out.append({"dataset": name, "seeds": seeds, "fp32": [acc[(s, "fp32")] for s in seeds],
                    "bf16": [acc[(s, "bf16")] for s in seeds], "median_diff": med,
                    "max_abs_diff": max(map(abs, diff)) if diff else None, "bytes": size,
                    "within": None if med is None else abs(med) <= rs[0].get("bound_points", 0.5)})
    return out


def render(records: list[dict[str, Any]]) -> str:
    recs = latest_session(records, lambda r: r.get("dataset") in SPECS)
    rows = []
    for s in summary(recs):
        if s.get("skipped"):
            rows.append([s["dataset"], f"not run: {s['skipped']}", "", "", "", "", ""])
            continue
        b = s["bytes"]
        rows.append([s["dataset"], " / ".join(f"{a:.1f}" for a in s["fp32"]),
                     " / ".join(f"{a:.1f}" for a in s["bf16"]),
                     "-" if s["median_diff"] is None else f"{s['median_diff']:+.2f}",
                     "-" if s["max_abs_diff"] is None else f"{s['max_abs_diff']:.2f}",
                     f"{b.get('fp32', 0) / 2**20:.1f} / {b.get('bf16', 0) / 2**20:.1f} MiB",
                     "-" if s["within"] is None else "yes" if s["within"] else "**no**"])
    head = ["dataset", "fp32, per seed (%)", "bf16, per seed (%)", "median bf16 - fp32 (points)",
            "max abs (points)", "features fp32 / bf16", "within the bound"]
    return (f"{provenance(recs)}\n\nGCN in memory, test accuracy at the best validation epoch, float32 features "
            "against the same runs (same split and initialisation) on features stored in bfloat16.\n\n"
            f"{table(head, rows)}\n")


def headline(records: list[dict[str, Any]]) -> list[Row]:
    recs = latest_session(records, lambda r: r.get("dataset") in SPECS)
    done = [s for s in summary(recs) if s.get("median_diff") is not None]
    if not done:
        return []
    fig = ", ".join(f"{s['dataset']} {s['median_diff']:+.2f}" for s in done)
    return [Row("bf16 feature storage: accuracy against float32 (GCN, median bf16 - fp32)",
                f"{fig} points (goal: within 0.5)", tuple(r for r in recs if not r.get("skipped")))]
