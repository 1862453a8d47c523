"""Host->device bytes of one offload epoch, split into rows, topology and indices (issue #11).

Builds the offload engine on ``--dataset`` with ``--chunks`` range chunks, runs two epochs with the chunk topology
resent every pass and two with it resident on the device, and prints each epoch's counters as JSON:

    .venv/bin/python benchmarks/h2d_split.py --dataset kronecker:scale=18,edgefactor=16 --hidden 64 --chunks 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile

import torch

from gnnscale import TrainConfig, load_dataset
from gnnscale.engines import OffloadEngine
from gnnscale.nn import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="kronecker:scale=18,edgefactor=16")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--dedup", default="full")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = load_dataset(args.dataset)
    assert g.num_classes is not None
    out = {}
    with tempfile.TemporaryDirectory() as plans:
        for resident in (False, True):
            cfg = TrainConfig(model=args.model, hidden=args.hidden, engine="offload", chunks=args.chunks,
                              dedup=args.dedup, plan_dir=plans, memory_budget=1 << 40)
            model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                                dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
            eng = OffloadEngine(g, model, cfg, torch.device("cpu"))
            # a large budget holds the topology: resend it in the first run (a copy: the planner's memo stays)
            eng.plan = dataclasses.replace(eng.plan, resident_topology=resident)
            for w in eng.workers:
                w.io.resident = {} if resident else None
            for epoch in (1, 2):
                rec = eng.train_epoch(epoch)
                out[f"{'resident' if resident else 'resent'} epoch {epoch}"] = {
                    k: rec[k] for k in ("h2d_bytes", "h2d_row_bytes", "h2d_topology_bytes", "h2d_index_bytes",
                                        "rows_h2d_bytes")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
