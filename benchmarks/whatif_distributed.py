"""The distributed what-if validated: the predicted epoch of 2-4 ranks against measured runs, emulated networks.

HopGNN's traffic model (``gnnscale plan --engine distributed --machines N``, :mod:`gnnscale.plan.distributed_time`)
against measured runs of 2, 3 and 4 ranks on this machine under emulated networks.

    python -m benchmarks whatif_distributed            # 2,3,4 ranks x 1Gbit, 100Mbit x both strategies, 2 rounds
    python -m benchmarks whatif_distributed --quick    # micrograph, 2 ranks, one network, a small graph, 3 epochs

The network is emulated by pacing the comm layer's sends (``GNNSCALE_EMULATE_NETWORK``, no network namespace;
the traffic stays on loopback): every collective lasts at least ``latency x messages + bytes / rate``. One case
per (ranks, network, strategy), all one group (their order rotates per round); each launches::

    GNNSCALE_EMULATE_NETWORK=1Gbit,latency=100us OMP_NUM_THREADS=1 python -m gnnscale train --engine distributed \\
        --ranks K --strategy S --merge off --epochs E --batch-size B --dataset csbm:... --metrics FILE --quiet

Measured: the ``epoch_time_s`` (training only) of epochs 2..E (epoch 1 warms up). Predicted: the engine's
``predict_epoch`` for the same setup: one machine with ``K`` ranks sharing its cores (that is where they run), the
emulated rate and latency (each collective no faster than this machine's loopback, measured and cached by the
prediction), this machine's calibrated rates. Training and prediction share one ``GNNSCALE_CACHE_DIR`` (the same
partitions; ``--cache-dir``). The table gives per cell the median of the measured epochs of all rounds against
the median prediction.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.distributed import cache_env, train_run
from benchmarks.harness import Case, Row, latest_session
from benchmarks.harness.records import provenance, table
from benchmarks.predict_epoch import error_summary

TITLE = ("What-if past one box: the distributed engine's prediction against runs of 2-4 ranks (issue #47), CPU")
ROUNDS = 2
BOUND = 0.25
NETWORKS = "1Gbit,latency=100us;100Mbit,latency=100us"
STRATEGIES = ("micrograph", "model-centric")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ranks", default=None, help="rank counts (comma list; default 2,3,4; --quick: 2)")
    ap.add_argument("--networks", default=None,
                    help=f"';'-separated emulated networks (default {NETWORKS}; --quick: the second)")
    ap.add_argument("--dataset", default=None, help="default csbm:nodes=20000 (--quick: csbm:nodes=5000)")
    ap.add_argument("--strategies", default=None, help="comma list (default micrograph,model-centric; --quick: "
                                                       "micrograph)")
    ap.add_argument("--model", default="sage")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=None, help="default 4 (--quick: 3); the first is not timed")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one training run may take")
    ap.add_argument("--cache-dir", default=None, help="GNNSCALE_CACHE_DIR of the trainings and predictions")


def cases(args: argparse.Namespace) -> list[Case]:
    q = args.quick
    ranks = [int(k) for k in (args.ranks or ("2" if q else "2,3,4")).split(",") if k.strip()]
    nets_text = args.networks or (NETWORKS.split(";")[-1] if q else NETWORKS)
    nets = [n.strip() for n in nets_text.split(";") if n.strip()]
    base = {"dataset": args.dataset or ("csbm:nodes=5000" if q else "csbm:nodes=20000"), "model": args.model,
            "batch_size": args.batch_size, "epochs": args.epochs or (3 if q else 4), "timeout": args.timeout}
    if base["epochs"] < 2:
        raise SystemExit("error: need --epochs >= 2 (the first is not timed)")
    env = cache_env(args, "whatif_distributed")
    strategies = [s.strip() for s in (args.strategies or ("micrograph" if q else ",".join(STRATEGIES))).split(",")]
    return [Case(f"{k} ranks, {net}, {s}", {**base, "ranks": k, "network": net, "strategy": s}, group="grid",
                 env=env, timeout=args.timeout + 600) for k in ranks for net in nets for s in strategies if s]


def measure(params: dict[str, Any]) -> dict[str, Any]:
    """One run's epoch times (after the first) and network bytes."""
    cmd = [sys.executable, "-m", "gnnscale", "train", "--engine", "distributed", "--ranks", str(params["ranks"]),
           "--strategy", params["strategy"], "--merge", "off", "--epochs", str(params["epochs"]), "--batch-size",
           str(params["batch_size"]), "--model", params["model"], "--dataset", params["dataset"], "--seed", "0",
           "--device", "cpu", "--quiet"]
    env = {**os.environ, "GNNSCALE_EMULATE_NETWORK": params["network"]}
    with tempfile.TemporaryDirectory(prefix="whatif-") as work:
        metrics = Path(work) / "metrics.jsonl"
        res = train_run([*cmd, "--metrics", str(metrics)], env, metrics, params["timeout"])
    if not res["ok"]:
        raise RuntimeError(f"{res['error']}: {res['command']}\n{res.get('stderr_tail', '')[-1500:]}")
    ep = res["epochs"][1:]
    return {"epoch_s": [r["epoch_time_s"] for r in ep], "network_bytes": [r["network_bytes"] for r in ep]}


def predict(params: dict[str, Any]) -> dict[str, Any]:
    import torch

    from gnnscale.config import TrainConfig
    from gnnscale.engines.sampled.distributed import DistributedEngine
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.plan.epoch_time import Cluster
    from gnnscale.plan.rates import rates
    from gnnscale.units import parse_network

    g = load_dataset(params["dataset"], None, seed=0)
    rate, latency = parse_network(params["network"])
    config = TrainConfig(model=params["model"], engine="distributed", strategy=params["strategy"], merge="off",
                         batch_size=params["batch_size"], seed=0)
    cluster = Cluster(machines=1, devices_per_machine=params["ranks"], network=rate, latency=latency or 0.0)
    r = rates(torch.device("cpu"))
    t0 = time.perf_counter()
    e = DistributedEngine.predict_epoch(g, config, torch.device("cpu"), r, cluster=cluster)
    assert e is not None
    wall = time.perf_counter() - t0
    loop = rates(torch.device("cpu"))  # with the loopback rate and latency the prediction measured and cached
    return {"predicted_s": e.seconds, "terms": e.terms, "predicted_network_bytes": e.bytes.get("network", 0),
            "predict_wall_s": wall, "loopback_bytes_per_s": loop.network, "loopback_latency_s": loop.latency,
            "model": e.model}


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One cell: a measured run and the prediction for it."""
    from benchmarks.harness.graphs import device_name

    load = os.getloadavg()
    m = measure(params)
    row: dict[str, Any] = {k: params[k] for k in ("ranks", "network", "strategy", "dataset", "batch_size", "model")}
    row.update(load_before=load, load_after=os.getloadavg(), measured_s=statistics.median(m["epoch_s"]),
               epoch_s=m["epoch_s"], measured_network_bytes=statistics.median(m["network_bytes"]), **predict(params))
    row["error_frac"] = row["predicted_s"] / row["measured_s"] - 1
    row["within_bound"] = abs(row["error_frac"]) <= BOUND
    return {"device": "cpu", "device_name": device_name(), **row}


def describe(r: dict[str, Any]) -> str:
    return (f"measured {r['measured_s']:.3f} s, predicted {r['predicted_s']:.3f} s "
            f"({100 * r['error_frac']:+.0f}%)")


def cells(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (ranks, network, strategy) of the latest run: the median of every round's measured epochs, the median
    prediction and their error, in the grid's order."""
    recs = latest_session(records, lambda r: r.get("ok", True) and r.get("measured_s") is not None)
    nets = list(dict.fromkeys(r["network"] for r in recs))
    keys = sorted(dict.fromkeys((r["ranks"], r["network"], r["strategy"]) for r in recs),
                  key=lambda k: (k[0], nets.index(k[1]), k[2]))
    out = []
    for key in keys:
        rs = [r for r in recs if (r["ranks"], r["network"], r["strategy"]) == key]
        m = statistics.median(t for r in rs for t in r["epoch_s"])
        p = statistics.median(r["predicted_s"] for r in rs)
        bm = statistics.median(r["measured_network_bytes"] for r in rs)
        bp = statistics.median(r["predicted_network_bytes"] for r in rs)
        out.append({"ranks": key[0], "network": key[1], "strategy": key[2], "measured_s": m, "predicted_s": p,
                    "error": p / m - 1, "bytes_error": bp / bm - 1 if bm else None, "records": rs})
    return out


def network_label(spec: str) -> str:
    """``1Gbit,latency=100us`` -> ``1 Gbit``."""
    return re.sub(r"^([0-9.]+)\s*", r"\1 ", spec.split(",")[0].strip())


def render(records: list[dict[str, Any]]) -> str:
    cs = cells(records)
    if not cs:
        return "No measured cell.\n"
    rows = [[c["ranks"], network_label(c["network"]), c["strategy"], f"{c['measured_s']:.3f}",
             f"{c['predicted_s']:.3f}", f"{100 * c['error']:+.0f}%"] for c in cs]
    e = error_summary([c["error"] for c in cs], BOUND)
    nbytes = [abs(c["bytes_error"]) for c in cs if c["bytes_error"] is not None]
    r0 = cs[0]["records"][0]
    return (f"{provenance(latest_session(records, lambda r: r.get('measured_s') is not None)).rstrip()}\n\n"
            f"The distributed engine's predicted epoch against `gnnscale train --engine distributed --ranks K` on "
            f"this machine under an emulated network (`{r0['dataset']}`, batch {r0['batch_size']} per rank, "
            f"`--merge off`; measured: the median of the timed epochs of every round).\n\n"
            f"{table(['ranks', 'network', 'strategy', 'measured s', 'predicted s', 'error'], rows)}\n\n"
            f"**{e['within']} of {e['n']} within {e['bound']}** (worst {100 * e['worst']:+.0f}%); the network bytes "
            f"the model counts are within {100 * max(nbytes, default=0):.0f}% of the engine's `network_bytes` in "
            f"every cell.\n")


def headline(records: list[dict[str, Any]]) -> list[Row]:
    cs = cells(records)
    if not cs:
        return []
    e = error_summary([c["error"] for c in cs], BOUND)
    ranks = sorted({c["ranks"] for c in cs})
    return [Row("what-if past one box (distributed prediction against measured ranks)",
                f"{e['within']} of {e['n']} cells within {e['bound']} ({ranks[0]}-{ranks[-1]} ranks, "
                f"{len({c['network'] for c in cs})} emulated networks), worst {100 * e['worst']:+.0f}%",
                tuple(r for c in cs for r in c["records"]))]
