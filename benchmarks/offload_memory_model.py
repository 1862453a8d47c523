"""The offload planner's estimated peak against the counted one (issues #30 and #47), for every layer kind.

    .venv/bin/python benchmarks/offload_memory_model.py                     # csbm 30K under 24 MB
    .venv/bin/python benchmarks/offload_memory_model.py --nodes 10000 --budget 8MB
    .venv/bin/python benchmarks/offload_memory_model.py --models gcn,sage --dedup auto \\
        --nodes 10000,30000,50000 --degrees 5,20,50 --features 32,64,256 --chunks 2,16   # issue #47's sweep

For each graph ``csbm(nodes=N, avg_degree=D, features=F, seed=0)``, each model and each ``--dedup`` mode: the
offload engine planned under ``--budget`` (or, with ``--chunks``, under the budget the planner's estimate of that
many chunks per partition sets, so that it cuts about that many) trains one epoch on the CPU; printed are the
chunks the planner cut, the epoch record's ``estimated_peak_device_bytes`` and ``peak_device_bytes`` (the device
bytes counted live), and their ratio. The counts are deterministic (no timing), so any machine reproduces them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gnnscale

from gnnscale import TrainConfig  # noqa: E402
from gnnscale.engines import OffloadEngine  # noqa: E402
from gnnscale.graph.generators import csbm  # noqa: E402
from gnnscale.graph.graph import Graph  # noqa: E402
from gnnscale.nn import build_model  # noqa: E402
from gnnscale.plan.offload import plan_offload  # noqa: E402
from gnnscale.units import parse_budget  # noqa: E402

CPU = torch.device("cpu")


def budget_for_chunks(g: Graph, model: str, dedup: str, chunks: int) -> int:
    """The budget under which the planner cuts at most ``chunks`` chunks per partition: its estimate of that
    split (the search takes the fewest chunks whose estimate fits)."""
    cfg = TrainConfig(model=model, engine="offload", memory_budget=1 << 40, dedup=dedup, chunks=chunks)
    return plan_offload(g, cfg, CPU).chunk_estimate


def measure(g: Graph, model: str, dedup: str, budget: int) -> tuple[int, int, int]:
    """One epoch of the offload engine on the CPU under ``budget``: chunks, estimated and counted peak bytes."""
    cfg = TrainConfig(model=model, engine="offload", memory_budget=budget, dedup=dedup)
    assert g.num_classes is not None
    net = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                      dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed, norm=cfg.norm)
    eng = OffloadEngine(g, net, cfg, CPU)
    rec = eng.train_epoch(1)
    return eng.plan.partition.chunks, rec["estimated_peak_device_bytes"], rec["peak_device_bytes"]


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="30000", help="comma list of vertex counts")
    ap.add_argument("--degrees", default="10", help="comma list of csbm average degrees (its default: 10)")
    ap.add_argument("--features", default="64", help="comma list of feature widths")
    ap.add_argument("--budget", default="24MB", help="device memory budget (default 24MB: 24,000,000 bytes)")
    ap.add_argument("--chunks", default="", help="comma list of chunk counts: the budget set to cut about as many")
    ap.add_argument("--models", default="gcn,gat,sage,gin")
    ap.add_argument("--dedup", default="auto,full", help="comma list of --dedup modes")
    args = ap.parse_args(argv)
    print("| nodes | degree | features | model | dedup | budget (bytes) | chunks | estimate (bytes) | counted (bytes) "
          "| estimate / counted |")
    print("|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
    ratios: list[float] = []
    for nodes in _ints(args.nodes):
        for degree in _ints(args.degrees):
            for features in _ints(args.features):
                g = csbm(nodes=nodes, avg_degree=degree, features=features, seed=0)
                for model in args.models.split(","):
                    for dedup in args.dedup.split(","):
                        budgets = ([budget_for_chunks(g, model, dedup, k) for k in _ints(args.chunks)]
                                   if args.chunks else [parse_budget(args.budget)])
                        for budget in budgets:
                            n, est, counted = measure(g, model, dedup, budget)
                            r = est / counted
                            ratios.append(r)
                            print(f"| {nodes} | {degree} | {features} | {model} | {dedup} | {budget:,} | {n} | "
                                  f"{est:,} | {counted:,} | {r:.3f} |", flush=True)
    if ratios:
        print(f"ratios in [{min(ratios):.3f}, {max(ratios):.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
