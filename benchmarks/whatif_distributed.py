"""The distributed what-if validated: HopGNN's traffic model (``gnnscale plan --engine distributed --machines N``,
:mod:`gnnscale.plan.distributed_time`) against measured runs of 2, 3 and 4 ranks on this machine under emulated
networks.

    .venv/bin/python benchmarks/whatif_distributed.py            # 2,3,4 ranks x 1Gbit, 100Mbit x both strategies
    .venv/bin/python benchmarks/whatif_distributed.py --quick    # 2,4 ranks, one network, fewer epochs

The network is emulated by pacing the comm layer's sends (``GNNSCALE_EMULATE_NETWORK``, no network namespace;
the traffic stays on loopback): every collective lasts at least ``latency x messages + bytes / rate``. Each run::

    GNNSCALE_EMULATE_NETWORK=1Gbit,latency=100us OMP_NUM_THREADS=1 python -m gnnscale train --engine distributed \\
        --ranks K --strategy S --merge off --epochs E --batch-size B --dataset csbm:... --metrics FILE --quiet

Measured: the median ``epoch_time_s`` (training only) of epochs 2..E (epoch 1 warms up). Predicted: the engine's
``predict_epoch`` for the same setup: one machine with ``K`` ranks sharing its cores (that is where they run), the
emulated rate and latency (each collective no faster than this machine's loopback, measured and cached by the
prediction), this machine's calibrated rates. The runs are interleaved (rounds over the whole grid),
one JSON line per (ranks, network, strategy) goes to ``--out`` with the environment, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

try:
    from offload import append_records, environment
except ImportError:  # run as a module
    from benchmarks.offload import append_records, environment

from gnnscale.config import STRATEGIES, TrainConfig
from gnnscale.engines.sampled.distributed import DistributedEngine
from gnnscale.graph.datasets import load_dataset
from gnnscale.plan.epoch_time import Cluster
from gnnscale.plan.rates import rates
from gnnscale.units import parse_network

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "whatif_distributed.jsonl"
BOUND = 0.25


def train_cmd(args: argparse.Namespace, ranks: int, strategy: str, metrics: Path) -> list[str]:
    return [sys.executable, "-m", "gnnscale", "train", "--engine", "distributed", "--ranks", str(ranks),
            "--strategy", strategy, "--merge", "off", "--epochs", str(args.epochs), "--batch-size",
            str(args.batch_size), "--model", args.model, "--dataset", args.dataset, "--seed", "0", "--device", "cpu",
            "--metrics", str(metrics), "--quiet"]


def measure(args: argparse.Namespace, ranks: int, strategy: str, network: str, work: Path) -> dict[str, Any]:
    """One run's epoch times (after the first) and network bytes."""
    metrics = work / f"m{ranks}-{strategy}.jsonl"
    metrics.unlink(missing_ok=True)
    env = {**os.environ, "GNNSCALE_EMULATE_NETWORK": network, "OMP_NUM_THREADS": "1"}
    cmd = train_cmd(args, ranks, strategy, metrics)
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0 or not metrics.exists():
        return {"ok": False, "error": p.stderr[-2000:], "command": " ".join(cmd)}
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    ep = [r for r in recs if not r.get("summary")][1:]
    return {"ok": True, "epoch_s": [r["epoch_time_s"] for r in ep], "network_bytes": [r["network_bytes"] for r in ep]}


def predict(args: argparse.Namespace, ranks: int, strategy: str, network: str) -> dict[str, Any]:
    g = load_dataset(args.dataset, None, seed=0)
    rate, latency = parse_network(network)
    config = TrainConfig(model=args.model, engine="distributed", strategy=strategy, merge="off",
                         batch_size=args.batch_size, seed=0)
    cluster = Cluster(machines=1, devices_per_machine=ranks, network=rate, latency=latency or 0.0)
    r = rates(torch.device("cpu"))
    t0 = time.perf_counter()
    e = DistributedEngine.predict_epoch(g, replace(config), torch.device("cpu"), r, cluster=cluster)
    assert e is not None
    wall = time.perf_counter() - t0
    loop = rates(torch.device("cpu"))  # with the loopback rate and latency the prediction measured and cached
    return {"predicted_s": e.seconds, "terms": e.terms, "predicted_network_bytes": e.bytes.get("network", 0),
            "predict_wall_s": wall, "loopback_bytes_per_s": loop.network, "loopback_latency_s": loop.latency,
            "model": e.model}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--networks", default="1Gbit,latency=100us;100Mbit,latency=100us")
    ap.add_argument("--dataset", default="csbm:nodes=20000")
    ap.add_argument("--model", default="sage")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the grid (medians over all)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--quick", action="store_true", help="2,4 ranks, 100Mbit only, 3 epochs")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    if args.quick:
        args.ranks, args.networks, args.epochs = "2,4", "100Mbit,latency=100us", 3
    grid = [(int(k), n, s) for k in args.ranks.split(",") for n in args.networks.split(";") for s in STRATEGIES]
    work = Path(tempfile.mkdtemp(prefix="whatif-"))
    os.environ.setdefault("GNNSCALE_CACHE_DIR", str(work / "cache"))  # one plan directory: same partitions
    torch.set_num_threads(1)
    load = os.getloadavg()
    measured: dict[tuple[int, str, str], list[dict[str, Any]]] = {g: [] for g in grid}
    for _ in range(args.rounds):
        for key in grid:
            measured[key].append(measure(args, *key[:1], key[2], key[1], work))
    rows = []
    for (k, net, strat), runs in measured.items():
        ok = [r for r in runs if r["ok"]]
        row: dict[str, Any] = {"ranks": k, "network": net, "strategy": strat, "dataset": args.dataset,
                               "batch_size": args.batch_size, "model": args.model, "load_before": load,
                               "load_after": os.getloadavg()}
        if not ok:
            row.update(ok=False, error=runs[-1].get("error"))
        else:
            times = [t for r in ok for t in r["epoch_s"]]
            row.update(ok=True, measured_s=statistics.median(times), epoch_s=times,
                       measured_network_bytes=statistics.median(b for r in ok for b in r["network_bytes"]),
                       **predict(args, k, strat, net))
            row["error_frac"] = row["predicted_s"] / row["measured_s"] - 1
            row["within_bound"] = abs(row["error_frac"]) <= BOUND
        rows.append(row)
    common = environment(torch.device("cpu"))
    append_records(Path(args.out), [{**common, "benchmark": "whatif_distributed", **r} for r in rows])
    print(f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print("| ranks | network | strategy | measured s | predicted s | error | net MB meas. | net MB pred. |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if not r["ok"]:
            print(f"| {r['ranks']} | {r['network']} | {r['strategy']} | failed | | | | |")
            continue
        print(f"| {r['ranks']} | {r['network']} | {r['strategy']} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | "
              f"{100 * r['error_frac']:+.0f}% | {r['measured_network_bytes'] / 1e6:.2f} | "
              f"{r['predicted_network_bytes'] / 1e6:.2f} |")
    return 0 if all(r.get("within_bound") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
