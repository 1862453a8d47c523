"""gpu-check step ``engines``: every engine trains 2 epochs on the device and on the CPU, on one small graph and
one config per engine; the step passes when each engine's losses on the device equal its CPU losses within
``--tol`` (``|device - cpu| <= tol * max(1, |cpu|)``, default 1e-4).

    PYTHONPATH=. python3 -m benchmarks._gpu_check_engines --device cuda --out engines.jsonl
    PYTHONPATH=. python3 -m benchmarks._gpu_check_engines --device cpu --out engines.jsonl   # the dry run

A step of the GPU check (``benchmarks/_gpu_check.py``), not a benchmark of its own: its records go into the
check's ``steps.jsonl``.

On ``--device cpu`` (the dry run) an engine whose two configs are equal runs once (``same_run``).

One JSON line per engine: its model and devices, both loss lists, the largest difference, seconds on each side
and, when it raised, the traceback (the other engines still run). Exit status 1 when an engine failed or differs.

The engines and their device runs: ``inmemory`` (gcn), ``offload`` (gcn, 2 partitions of 4 chunks: pinned
buffers, the copy stream, the accumulation thread), ``taskparallel`` (the decoupled ``dgcn``, T and P tasks on
two device threads of the one GPU), ``minibatch`` (sage, fanouts 5,5: the device sampler and host feature rows),
``hybrid`` (sage; the CPU trainer beside ``cuda:0``, against ``cpu,cpu:1`` on the CPU: an iteration is one
optimiser step on the whole batch whatever the split) and ``distributed`` (``gnnscale.launch``: one rank per GPU,
at most 2, NCCL, against as many gloo ranks on the CPU).
"""

from __future__ import annotations

import argparse
import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.records import append_records
from gnnscale import TrainConfig, launch, train
from gnnscale.graph.generators import csbm

GRAPH = {"nodes": 2000, "features": 16, "avg_degree": 8, "classes": 4, "seed": 0}
COMMON: dict[str, Any] = {"epochs": 2, "hidden": 16, "seed": 1, "dropout": 0.5}
SAMPLED: dict[str, Any] = {"model": "sage", "batch_size": 256, "fanouts": (5, 5)}
ENGINES = ("inmemory", "offload", "taskparallel", "minibatch", "hybrid", "distributed")


def configs(device: str, ranks: int) -> dict[str, tuple[TrainConfig, TrainConfig]]:
    """Per engine: (the device run's config, the CPU run's config)."""
    cuda = device.startswith("cuda")
    both = {
        "inmemory": TrainConfig(model="gcn", engine="inmemory", **COMMON),
        "offload": TrainConfig(model="gcn", engine="offload", partitions=2, chunks=4, **COMMON),
        "minibatch": TrainConfig(engine="minibatch", **SAMPLED, **COMMON),
        "distributed": TrainConfig(model="sage", engine="distributed", ranks=ranks, batch_size=256, **COMMON),
    }
    pairs = {k: (v, v) for k, v in both.items()}
    tp = {"model": "dgcn", "engine": "taskparallel", **COMMON}
    pairs["taskparallel"] = (TrainConfig(devices=("cuda:0", "cuda:0") if cuda else ("cpu", "cpu"), **tp),
                             TrainConfig(devices=("cpu", "cpu"), **tp))
    hy = {"engine": "hybrid", **SAMPLED, **COMMON}
    pairs["hybrid"] = (TrainConfig(devices=("cpu", "cuda:0") if cuda else ("cpu", "cpu:1"), **hy),
                       TrainConfig(devices=("cpu", "cpu:1"), **hy))
    return {k: pairs[k] for k in ENGINES}


def losses(graph: Any, cfg: TrainConfig, device: str, ranks: int) -> list[float]:
    if cfg.engine == "distributed":
        result = launch(graph, cfg, ranks=ranks, device=device)
    else:
        result = train(graph, cfg, device)
    return [float(h["loss"]) for h in result.history]


def close(a: list[float], b: list[float], tol: float) -> bool:
    return len(a) == len(b) > 0 and all(math.isfinite(x) and abs(x - y) <= tol * max(1.0, abs(y))
                                        for x, y in zip(a, b, strict=True))


def check(name: str, pair: tuple[TrainConfig, TrainConfig], graph: Any, device: str, ranks: int,
          tol: float, run: Callable[[Any, TrainConfig, str, int], list[float]] = losses) -> dict[str, Any]:
    """One engine: its device run, then its CPU run; a failure of either is recorded with its traceback."""
    dev_cfg, cpu_cfg = pair
    rec: dict[str, Any] = {"kind": "engine", "engine": name, "model": dev_cfg.model, "device": device,
                           "devices": list(dev_cfg.devices or ()), "cpu_devices": list(cpu_cfg.devices or ()),
                           "ranks": ranks if name == "distributed" else None, "tol": tol}
    try:
        t0 = time.perf_counter()
        rec["device_losses"] = run(graph, dev_cfg, device, ranks)
        rec["device_s"] = round(time.perf_counter() - t0, 3)
        if device == "cpu" and dev_cfg == cpu_cfg:  # the dry run: the device run was this very run
            rec["cpu_losses"], rec["cpu_s"], rec["same_run"] = rec["device_losses"], 0.0, True
        else:
            t0 = time.perf_counter()
            rec["cpu_losses"] = run(graph, cpu_cfg, "cpu", ranks)
            rec["cpu_s"] = round(time.perf_counter() - t0, 3)
    except Exception:  # noqa: BLE001  (recorded; the next engine runs)
        rec["status"] = "failed"
        rec["traceback"] = traceback.format_exc()
        return rec
    rec["max_diff"] = max((abs(a - b) for a, b in zip(rec["device_losses"], rec["cpu_losses"], strict=False)),
                          default=None)
    rec["status"] = "ok" if close(rec["device_losses"], rec["cpu_losses"], tol) else "mismatch"
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="the device run's device: cuda (or cpu: the dry run)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma list, default all")
    ap.add_argument("--ranks", type=int, default=None,
                    help="distributed ranks (default: one per GPU, at most 2; 1 on the CPU)")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True, help="JSON Lines file to append to")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ranks = args.ranks or (min(2, torch.cuda.device_count()) if args.device.startswith("cuda") else 1)
    graph = csbm(**GRAPH)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = set(names) - set(ENGINES)
    if unknown:
        ap.error(f"unknown engines {sorted(unknown)}")
    pairs = configs(args.device, ranks)
    bad = 0
    for name in names:
        rec = check(name, pairs[name], graph, args.device, ranks, args.tol)
        rec["graph"] = GRAPH
        append_records(args.out, [rec])
        diff = "-" if rec.get("max_diff") is None else f"{rec['max_diff']:.2e}"
        print(f"{name:<13} {rec['status']:<9} max |device - cpu| {diff}  device {rec.get('device_losses')}  "
              f"cpu {rec.get('cpu_losses')}", flush=True)
        if rec["status"] != "ok":
            bad += 1
            print(rec.get("traceback", ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
