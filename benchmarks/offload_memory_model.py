"""The offload planner's estimated peak against the counted one (issue #30, point 3), for every layer kind.

    .venv/bin/python benchmarks/offload_memory_model.py                     # csbm 30K under 24 MB
    .venv/bin/python benchmarks/offload_memory_model.py --nodes 10000 --budget 8MB

For each model and each ``--dedup`` mode: the offload engine planned under ``--budget`` on
``csbm(nodes=N, seed=0)`` trains one epoch on the CPU; printed are the chunks the planner cut, the epoch record's
``estimated_peak_device_bytes`` and ``peak_device_bytes`` (the device bytes counted live), and their ratio. The
counts are deterministic (no timing), so any machine reproduces them.
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
from gnnscale.nn import build_model  # noqa: E402
from gnnscale.units import parse_budget  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=30_000)
    ap.add_argument("--budget", default="24MB", help="device memory budget (default 24MB: 24,000,000 bytes)")
    ap.add_argument("--models", default="gcn,gat,sage,gin")
    ap.add_argument("--dedup", default="auto,full", help="comma list of --dedup modes")
    args = ap.parse_args(argv)
    g = csbm(nodes=args.nodes, seed=0)
    assert g.num_classes is not None
    budget = parse_budget(args.budget)
    print(f"csbm {args.nodes:,} vertices under {budget:,} bytes")
    print("| model | dedup | chunks | estimate (bytes) | counted (bytes) | estimate / counted |")
    print("|---|---|---:|---:|---:|---:|")
    for model in args.models.split(","):
        for dedup in args.dedup.split(","):
            cfg = TrainConfig(model=model, engine="offload", memory_budget=budget, dedup=dedup)
            net = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                              dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed, norm=cfg.norm)
            eng = OffloadEngine(g, net, cfg, torch.device("cpu"))
            rec = eng.train_epoch(1)
            est, counted = rec["estimated_peak_device_bytes"], rec["peak_device_bytes"]
            print(f"| {model} | {dedup} | {eng.plan.partition.chunks} | {est:,} | {counted:,} | {est / counted:.3f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
