"""The offload planner's estimated peak against the counted one (issues #30 and #47), for every layer kind.

    python -m benchmarks offload_memory_model                           # csbm 30K under 24 MB
    python -m benchmarks offload_memory_model --nodes 10000 --budget 8MB
    python -m benchmarks offload_memory_model --models gcn,sage --dedup auto \\
        --nodes 10000,30000,50000 --degrees 5,20,50 --features 32,64,256 --chunks 2,16   # issue #47's sweep

One case per graph ``csbm(nodes=N, avg_degree=D, features=F, seed=0)``; in it, for each model and each ``--dedup``
mode, the offload engine planned under ``--budget`` (or, with ``--chunks``, under the budget the planner's
estimate of that many chunks per partition sets, so that it cuts about that many) trains one epoch on the CPU.
One record per (model, dedup, budget): the chunks the planner cut, the epoch record's
``estimated_peak_device_bytes`` and ``peak_device_bytes`` (the device bytes counted live), and their ratio. The
counts are deterministic (no timing), so any machine reproduces them: one round.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.harness import Case, latest_session, split_list
from benchmarks.harness.graphs import device_name
from benchmarks.harness.records import provenance, table

TITLE = "Offload memory model: the planner's estimated peak against the counted one"
ROUNDS = 1


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--nodes", default="30000", help="comma list of vertex counts (--quick: 3000)")
    ap.add_argument("--degrees", default="10", help="comma list of csbm average degrees (its default: 10)")
    ap.add_argument("--features", default="64", help="comma list of feature widths")
    ap.add_argument("--budget", default="24MB", help="device memory budget (default 24MB: 24,000,000 bytes)")
    ap.add_argument("--chunks", default="", help="comma list of chunk counts: the budget set to cut about as many")
    ap.add_argument("--models", default="gcn,gat,sage,gin", help="comma list (--quick: gcn,gat)")
    ap.add_argument("--dedup", default="auto,full", help="comma list of --dedup modes (--quick: full)")


def _ints(s: str) -> list[int]:
    return [int(v) for v in split_list(s)]


def cases(args: argparse.Namespace) -> list[Case]:
    q = args.quick
    nodes = _ints("3000" if q and args.nodes == "30000" else args.nodes)
    models = split_list("gcn,gat" if q and args.models == "gcn,gat,sage,gin" else args.models)
    dedups = split_list("full" if q and args.dedup == "auto,full" else args.dedup)
    budget = "2MB" if q and args.budget == "24MB" else args.budget
    return [Case(f"csbm n={n} d={d} f={f}", {"nodes": n, "degree": d, "features": f, "models": models,
                                             "dedups": dedups, "budget": budget, "chunks": _ints(args.chunks)})
            for n in nodes for d in _ints(args.degrees)
            for f in _ints(args.features)]


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (model, dedup, budget) on one graph: chunks, estimated and counted peak bytes."""
    import torch

    from gnnscale import TrainConfig
    from gnnscale.engines import OffloadEngine
    from gnnscale.graph.generators import csbm
    from gnnscale.nn import build_model
    from gnnscale.plan.offload import plan_offload
    from gnnscale.units import parse_budget

    cpu = torch.device("cpu")
    g = csbm(nodes=params["nodes"], avg_degree=params["degree"], features=params["features"], seed=0)
    assert g.num_classes is not None
    out = []
    for model in params["models"]:
        for dedup in params["dedups"]:
            # with --chunks: the planner's estimate of that split (the search takes the fewest chunks that fit)
            budgets = [plan_offload(g, TrainConfig(model=model, engine="offload", memory_budget=1 << 40,
                                                   dedup=dedup, chunks=k), cpu).chunk_estimate
                       for k in params["chunks"]] or [parse_budget(params["budget"])]
            for budget in budgets:
                cfg = TrainConfig(model=model, engine="offload", memory_budget=budget, dedup=dedup)
                net = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                                  dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed, norm=cfg.norm)
                eng = OffloadEngine(g, net, cfg, cpu)
                rec = eng.train_epoch(1)
                est, counted = rec["estimated_peak_device_bytes"], rec["peak_device_bytes"]
                out.append({"nodes": params["nodes"], "degree": params["degree"], "features": params["features"],
                            "model": model, "dedup": dedup, "budget_bytes": budget,
                            "chunks": eng.plan.partition.chunks, "estimate_bytes": est, "counted_bytes": counted,
                            "ratio": est / counted, "device": "cpu", "device_name": device_name()})
    return out


def describe(r: dict[str, Any]) -> str:
    return f"{r['model']} {r['dedup']}: {r['chunks']} chunks, estimate / counted {r['ratio']:.3f}"


def render(records: list[dict[str, Any]]) -> str:
    recs = latest_session(records, lambda r: r.get("ratio") is not None)
    rows = [[r["nodes"], r["degree"], r["features"], r["model"], r["dedup"], f"{r['budget_bytes']:,}", r["chunks"],
             f"{r['estimate_bytes']:,}", f"{r['counted_bytes']:,}", f"{r['ratio']:.3f}"] for r in recs]
    ratios = [r["ratio"] for r in recs]
    span = f"Ratios in [{min(ratios):.3f}, {max(ratios):.3f}]." if ratios else "No record."
    head = ["nodes", "degree", "features", "model", "dedup", "budget (bytes)", "chunks", "estimate (bytes)",
            "counted (bytes)", "estimate / counted"]
    return (f"{provenance(recs)}\n\nThe latest run: the offload planner's estimated peak device bytes against "
            f"those counted live in one CPU epoch. {span}\n\n{table(head, rows)}\n")
