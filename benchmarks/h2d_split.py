"""Host->device bytes of one offload epoch, split into rows, topology and indices (issue #11).

    python -m benchmarks h2d_split --dataset kronecker:scale=18,edgefactor=16 --hidden 64 --chunks 16
    python -m benchmarks h2d_split --quick

One case: the offload engine on ``--dataset`` with ``--chunks`` range chunks trains two epochs with the chunk
topology resent every pass and two with it resident on the device (the budget is large enough to hold it either
way). One record per (topology, epoch) with the engine's counters ``h2d_bytes``, ``h2d_row_bytes``,
``h2d_topology_bytes``, ``h2d_index_bytes`` and ``rows_h2d_bytes``. The counts are deterministic: one round.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from typing import Any

from benchmarks.harness import Case, latest_session
from benchmarks.harness.graphs import device_name, load_graph
from benchmarks.harness.records import provenance, table

TITLE = "Host->device bytes per offload epoch: rows, topology and indices"
ROUNDS = 1
DEFAULT_DATASET = "kronecker:scale=18,edgefactor=16"
QUICK_DATASET = "kronecker:scale=12,edgefactor=8"
COUNTERS = ("h2d_bytes", "h2d_row_bytes", "h2d_topology_bytes", "h2d_index_bytes", "rows_h2d_bytes")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dataset", default=DEFAULT_DATASET, help=f"default {DEFAULT_DATASET} (--quick: {QUICK_DATASET})")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--dedup", default="full")


def cases(args: argparse.Namespace) -> list[Case]:
    dataset = QUICK_DATASET if args.quick and args.dataset == DEFAULT_DATASET else args.dataset
    return [Case(dataset, {"dataset": dataset, "model": args.model, "hidden": args.hidden, "chunks": args.chunks,
                           "dedup": args.dedup})]


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    from gnnscale import TrainConfig
    from gnnscale.engines import OffloadEngine
    from gnnscale.nn import build_model

    g, _ = load_graph(params["dataset"])
    assert g.num_classes is not None
    out = []
    with tempfile.TemporaryDirectory() as plans:
        for resident in (False, True):
            cfg = TrainConfig(model=params["model"], hidden=params["hidden"], engine="offload",
                              chunks=params["chunks"], dedup=params["dedup"], plan_dir=plans, memory_budget=1 << 40)
            model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                                dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
            eng = OffloadEngine(g, model, cfg, torch.device("cpu"))
            # a large budget holds the topology: resend it in the first run (a copy: the planner's memo stays)
            eng.plan = dataclasses.replace(eng.plan, resident_topology=resident)
            for w in eng.workers:
                w.io.resident = {} if resident else None
            for epoch in (1, 2):
                rec = eng.train_epoch(epoch)
                out.append({**{k: params[k] for k in ("model", "hidden", "chunks", "dedup")},
                            "dataset": g.meta.get("spec", params["dataset"]), "nodes": g.num_nodes,
                            "edges": g.num_edges, "topology": "resident" if resident else "resent", "epoch": epoch,
                            "device": "cpu", "device_name": device_name(), **{k: int(rec[k]) for k in COUNTERS}})
    return out


def describe(r: dict[str, Any]) -> str:
    return f"{r['topology']} epoch {r['epoch']}: {r['h2d_bytes']:,} bytes host->device"


def render(records: list[dict[str, Any]]) -> str:
    recs = latest_session(records, lambda r: r.get("topology") is not None)
    rows = [[r["topology"], r["epoch"], *(f"{r[k]:,}" for k in COUNTERS)] for r in recs]
    what = "" if not recs else (f" `{recs[0]['dataset']}` ({recs[0]['nodes']:,} nodes), {recs[0]['model']} hidden "
                                f"{recs[0]['hidden']}, {recs[0]['chunks']} chunks, dedup {recs[0]['dedup']}:")
    return (f"{provenance(recs)}\n\nThe latest run, bytes per epoch by kind, chunk topology resent every pass or "
            f"resident on the device;{what}\n\n{table(['topology', 'epoch', *COUNTERS], rows)}\n")
