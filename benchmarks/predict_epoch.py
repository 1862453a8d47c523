"""Predicted against measured epoch time, for every engine with a prediction (``Engine.predict_epoch``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/predict_epoch.py --rounds 3
    .venv/bin/python benchmarks/predict_epoch.py --quick --no-save      # a smoke run on one small graph

Graphs: a csbm synthetic (200K vertices, degree 10, 64 features), another (100K vertices, degree 30, 256
features) and a SNAP graph (web-cnr-2000 from ../shared/datasets/snap: 325K vertices, 3.2M arcs; 64 features and
labels synthesised by the loader; skipped when absent). Epochs of 0.1-1 s: a graph of a few thousand vertices
trains in milliseconds, where the fixed cost of each op (not a term of the models) is most of the epoch.
Every engine of the registry but distributed (its ranks: benchmarks/whatif_distributed.py) is tried with the model
it trains (``gcn``, or ``dgcn`` for an engine of decoupled models only; the sampled engines at their default batch
size and fanouts, hybrid on the CPU alone); the offload engine under a device budget of a quarter of the in-memory
estimate, so its chunks move (Eq. 4). An engine that cannot run the case, or predicts nothing, is skipped.

Each case runs in its own process at one torch thread: the rates (``gnnscale.plan.rates``, cached), the prediction,
the engine's set-up, ``--warmup`` untimed epochs, then ``--epochs`` timed ``train_epoch`` calls (median). Rounds
are interleaved; the table shows per case the median measured and predicted seconds and the signed error
(predicted / measured - 1). Records: benchmarks/results/predict_epoch.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

SNAP = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "snap" / "web-cnr-2000.txt.gz"
GRAPHS = ["csbm:nodes=200000,avg_degree=10,features=64", "csbm:nodes=100000,avg_degree=30,features=256",
          f"edgelist:{SNAP}"]
QUICK = ["csbm:nodes=4000,avg_degree=10,features=64"]


def one(spec: str, engine: str, epochs: int, warmup: int) -> dict[str, object]:
    """One case in this process: predicted and measured seconds per epoch."""
    import torch

    torch.set_num_threads(1)
    from gnnscale import runtime as rt
    from gnnscale.config import TrainConfig
    from gnnscale.engines import ENGINES
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.nn import build_model
    from gnnscale.plan.memory import estimate_inmemory_bytes
    from gnnscale.plan.rates import rates

    cls = ENGINES[engine]
    g = load_dataset(spec, seed=0)
    config = TrainConfig(model="gcn" if cls.trains_layered else "dgcn", hidden=64, engine=engine, epochs=1)
    if engine == "offload":
        config = replace(config, memory_budget=estimate_inmemory_bytes(g, config, None)["total"] // 4)
    device = torch.device("cpu")
    if cls.mode == "distributed" or cls.not_supported_reasons(g, config, device):
        return {"skipped": "cannot run"}  # distributed: ranks, benchmarks/whatif_distributed.py
    r = rates(rt.torch_device(device))
    p = cls.predict_epoch(g, config, device, r)
    if p is None:
        return {"skipped": "no prediction"}
    assert g.num_classes is not None
    model = build_model(config.model, g.num_features, config.hidden, g.num_classes, **config.model_kwargs())
    eng = cls(g, model, config, device)
    times = []
    for epoch in range(1, warmup + epochs + 1):
        t0 = time.perf_counter()
        eng.train_epoch(epoch)
        if epoch > warmup:
            times.append(time.perf_counter() - t0)
    close = getattr(eng, "close", None)
    if close is not None:
        close()
    return {"predicted_s": p.seconds, "measured_s": statistics.median(times), "terms": p.terms, "bytes": p.bytes,
            "model": config.model, "budget": config.memory_budget, "machine": r.machine, "versions": r.versions,
            "rates_measured": r.measured}


def _commit() -> str:
    """The checkout's commit, ``+dirty`` when it has uncommitted changes (a figure names a clean commit)."""
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                           text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/predict_epoch.jsonl")
    ap.add_argument("--one", nargs=2, metavar=("SPEC", "ENGINE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.epochs, args.warmup)))
        return 0
    from gnnscale.engines import ENGINES

    graphs = QUICK if args.quick else [g for g in GRAPHS if not g.startswith("edgelist") or SNAP.exists()]
    rounds = 1 if args.quick else args.rounds
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", ".")}
    got: dict[tuple[str, str], list[dict[str, object]]] = {}
    commit = _commit()
    for rnd in range(rounds):
        for spec in graphs:
            for engine in ENGINES:
                out = subprocess.run([sys.executable, __file__, "--one", spec, engine, "--epochs", str(args.epochs),
                                      "--warmup", str(args.warmup)], env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{spec} {engine}: failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                    continue
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                if "skipped" in rec:
                    continue
                rec.update(graph=spec, engine=engine, round=rnd, commit=commit)
                got.setdefault((spec, engine), []).append(rec)
                if not args.no_save:
                    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps({"kind": "predict_epoch", **rec}) + "\n")
    print("| graph | engine | model | measured s | predicted s | error |")
    print("|---|---|---|---|---|---|")
    for (spec, engine), recs in got.items():
        m = statistics.median(float(r["measured_s"]) for r in recs)  # type: ignore[arg-type]
        p = statistics.median(float(r["predicted_s"]) for r in recs)  # type: ignore[arg-type]
        name = spec.split("/")[-1]
        print(f"| {name} | {engine} | {recs[0]['model']} | {m:.3f} | {p:.3f} | {100 * (p / m - 1):+.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
