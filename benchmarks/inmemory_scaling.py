"""How the in-memory engine's epoch time grows with the graph (issue #30: "2x the edges at most 2.2x the time").

    python -m benchmarks inmemory_scaling                       # csbm 100K, 200K, 400K; GCN and SAGE; 3 rounds
    python -m benchmarks inmemory_scaling --sizes 100000,400000 --models gcn --rounds 3

Each (model, size) is a case (its own process with one torch thread): ``--warmup`` untimed epochs, then
``--epochs`` timed ones; the median is the run's figure. All cases are one group: every round runs each once, the
order rotating by one each round; per case the median over rounds. Graphs:
``csbm:nodes=N,avg_degree=10,features=128,classes=16`` (edges grow with the vertices), 2 layers, hidden 64,
dropout 0.5. Reported per model: each size's median epoch and its ratio to the smallest size's, beside the ratio
of their edges (time per edge, normalised: 1.0 is linear). One record per run (``"kind": "run"``; the script
before the harness also wrote ``"summary"`` records, which the table recomputes from the runs). ``--quick``: GCN
on 5,000 and 10,000 vertices, one round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks.harness import Case, Row, split_list
from benchmarks.harness.records import provenance, table

TITLE = "In-memory epoch against the graph's size (issue #30: 2x the edges at most 2.2x the time), CPU"
ROUNDS = 3


def spec(nodes: int) -> str:
    return f"csbm:nodes={nodes},avg_degree=10,features=128,classes=16"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", default="100000,200000,400000", help="vertex counts (comma list; --quick 5000,10000)")
    ap.add_argument("--models", default="gcn,sage", help="comma list (--quick gcn)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=3)


def cases(args: argparse.Namespace) -> list[Case]:
    quick = args.quick
    sizes = [5000, 10000] if quick and args.sizes == "100000,200000,400000" else [int(s) for s in
                                                                                  split_list(args.sizes)]
    models = ["gcn"] if quick and args.models == "gcn,sage" else split_list(args.models)
    return [Case(f"{m} {n}", {"model": m, "nodes": n, "warmup": args.warmup, "epochs": args.epochs}, group="scaling")
            for m in models for n in sizes]


def run(params: dict[str, Any]) -> dict[str, Any]:
    """Build the graph and the engine, time the epochs."""
    import torch

    from benchmarks.harness.graphs import device_name
    from gnnscale import TrainConfig, load_dataset
    from gnnscale.engines import InMemoryEngine
    from gnnscale.nn import build_model

    model, nodes, warmup, epochs = params["model"], params["nodes"], params["warmup"], params["epochs"]
    g = load_dataset(spec(nodes))
    cfg = TrainConfig(model=model, hidden=64, layers=2, dropout=0.5, engine="inmemory", epochs=warmup + epochs)
    m = build_model(model, g.num_features, 64, g.num_classes or 16, layers=2, dropout=0.5, heads=1, seed=0)
    eng = InMemoryEngine(g, m, cfg, torch.device("cpu"))
    times = []
    for e in range(1, warmup + epochs + 1):
        t = time.perf_counter()
        eng.train_epoch(e)
        if e > warmup:
            times.append(time.perf_counter() - t)
    return {"kind": "run", "model": model, "nodes": nodes, "edges": g.num_edges, "epoch_s": statistics.median(times),
            "epochs_s": times, "device": "cpu", "device_name": device_name("cpu")}


def describe(r: dict[str, Any]) -> str:
    return f"{r['edges']:,} edges: {r['epoch_s']:.3f} s"


def _series(r: dict[str, Any]) -> str:
    """The harness session, or the commit of a run of the old script (its ``revision``)."""
    return str(r.get("session") or r.get("revision"))


def latest(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run records of the latest session (for the old script's records: of the last revision measured)."""
    runs = [{"gnnscale_rev": r.get("revision"), **r} for r in records
            if r.get("kind") == "run" and r.get("ok", True)]
    return [r for r in runs if _series(r) == _series(runs[-1])] if runs else []


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, size): the median over the rounds, its range, and the time and edge ratios to the smallest."""
    out = []
    for model in dict.fromkeys(r["model"] for r in runs):
        base = None
        for n in sorted({r["nodes"] for r in runs if r["model"] == model}):
            rs = [r for r in runs if r["model"] == model and r["nodes"] == n]
            med = statistics.median(r["epoch_s"] for r in rs)
            edges = rs[0]["edges"]
            base = base or (med, edges)
            out.append({"model": model, "nodes": n, "edges": edges, "epoch_s": med,
                        "range": [min(r["epoch_s"] for r in rs), max(r["epoch_s"] for r in rs)],
                        "time_ratio": med / base[0], "edge_ratio": edges / base[1], "rounds": len(rs)})
    return out


def render(records: list[dict[str, Any]]) -> str:
    runs = latest(records)
    rows = [[s["model"], f"{s['nodes']:,}", f"{s['edges']:,}",
             f"{s['epoch_s']:.3f} s ({s['range'][0]:.3f}-{s['range'][1]:.3f})", f"{s['time_ratio']:.2f}x",
             f"{s['edge_ratio']:.2f}x", f"{s['time_ratio'] / s['edge_ratio']:.2f}", s["rounds"]]
            for s in summary(runs)]
    head = ["model", "vertices", "edges", "epoch, median (range)", "time ratio", "edge ratio",
            "time per edge, normalised", "rounds"]
    note = "" if any(r.get("command") for r in runs) else "Command: not recorded (a run before the harness).\n\n"
    return (f"{provenance(runs).rstrip()}\n\n{note}The latest run: per (model, size) the median over the "
            "interleaved rounds of each run's median epoch, and its ratios to the smallest size (1.00 per edge: "
            "linear).\n\n"
            f"{table(head, rows)}\n")


def headline(records: list[dict[str, Any]]) -> list[Row]:
    """The largest graph of the latest run: each model's epoch time there and how it grew against the edges."""
    runs = latest(records)
    tops = {}
    for s in summary(runs):
        tops[s["model"]] = s  # sizes ascend per model: the last is the largest
    if not tops:
        return []
    n, e = max((s["nodes"], s["edges"]) for s in tops.values())
    figs = [f"{m.upper()} {s['epoch_s']:.3f} s ({s['time_ratio']:.2f}x the time for {s['edge_ratio']:.2f}x the edges)"
            for m, s in tops.items() if s["nodes"] == n]
    return [Row("Scale in memory: epoch on the largest graph of the scaling run (one thread)",
                f"{n:,} vertices, {e:,} edges: " + ", ".join(figs), tuple(runs))]
