"""How the in-memory engine's epoch time grows with the graph (issue #30: "2x the edges at most 2.2x the time").

    .venv/bin/python benchmarks/inmemory_scaling.py                       # csbm 100K, 200K, 400K; GCN and SAGE
    .venv/bin/python benchmarks/inmemory_scaling.py --sizes 100000,400000 --models gcn --rounds 3

Each (model, size) runs in its own process with one torch thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``): ``--warmup`` untimed epochs, then ``--epochs`` timed ones; the median is the run's
figure. ``--rounds`` interleaved rounds (every case once per round, the order rotating by one each round); per
case the median over rounds. Graphs: ``csbm:nodes=N,avg_degree=10,features=128,classes=16`` (edges grow with the
vertices), 2 layers, hidden 64, dropout 0.5. Reported per model: each size's median epoch and its ratio to the
smallest size's, beside the ratio of their edges (time per edge, normalised: 1.0 is linear). One JSON line per run
and one per summary are appended to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gnnscale, not the one the venv was installed from
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "inmemory_scaling.jsonl"


def spec(nodes: int) -> str:
    return f"csbm:nodes={nodes},avg_degree=10,features=128,classes=16"


def worker(model: str, nodes: int, warmup: int, epochs: int) -> dict[str, Any]:
    """One process: build the graph and the engine, time the epochs."""
    import torch

    torch.set_num_threads(1)
    from gnnscale import TrainConfig, load_dataset
    from gnnscale.engines import InMemoryEngine
    from gnnscale.nn import build_model

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
    return {"model": model, "nodes": nodes, "edges": g.num_edges, "epoch_s": statistics.median(times),
            "epochs_s": times}


def revision() -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "gnnscale", "benchmarks/inmemory_scaling.py"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return rev.strip() + ("-dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,200000,400000")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--worker", nargs=4, metavar=("MODEL", "NODES", "WARMUP", "EPOCHS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        m, n, w, e = args.worker
        print(json.dumps(worker(m, int(n), int(w), int(e))))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    models = args.models.split(",")
    cases = [(m, n) for m in models for n in sizes]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    rev = revision()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(args.rounds):
        order = cases[r % len(cases):] + cases[: r % len(cases)]
        for m, n in order:
            out = subprocess.run([sys.executable, __file__, "--worker", m, str(n), str(args.warmup), str(args.epochs)],
                                 env=env, capture_output=True, text=True, check=True).stdout
            rec = json.loads(out.strip().splitlines()[-1])
            rec.update(kind="run", round=r + 1, revision=rev, threads=1)
            runs[(m, n)].append(rec)
            print(f"round {r + 1}: {m} {n:,} vertices {rec['edges']:,} edges: {rec['epoch_s']:.3f} s", flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
    machine = f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), 1 torch thread"
    print(f"\nrevision {rev}; {machine}; {args.rounds} interleaved rounds, median of {args.epochs} epochs each")
    print("| model | vertices | edges | epoch (median, range) | time ratio | edge ratio | time / edges ratio |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for m in models:
        base = None
        for n in sizes:
            rs = runs[(m, n)]
            med = statistics.median(r["epoch_s"] for r in rs)
            lo, hi = min(r["epoch_s"] for r in rs), max(r["epoch_s"] for r in rs)
            edges = rs[0]["edges"]
            if base is None:
                base = (med, edges)
            tr, er = med / base[0], edges / base[1]
            print(f"| {m} | {n:,} | {edges:,} | {med:.3f} s ({lo:.3f}-{hi:.3f}) | {tr:.2f}x | {er:.2f}x | "
                  f"{tr / er:.2f} |")
            with args.out.open("a") as f:
                f.write(json.dumps({"kind": "summary", "model": m, "nodes": n, "edges": edges, "epoch_s": med,
                                    "range": [lo, hi], "time_ratio": tr, "edge_ratio": er, "revision": rev,
                                    "rounds": args.rounds, "threads": 1, "machine": machine}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
