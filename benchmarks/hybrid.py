"""The hybrid engine (HyScale-GNN): the performance model against measured epochs, and DRM against a sweep of
static splits, with one trainer made slower.

    .venv/bin/python benchmarks/hybrid.py --threads 1
    .venv/bin/python benchmarks/hybrid.py --threads 1 --parts model --datasets csbm:nodes=50000,features=128
    PYTHONPATH=. python3 benchmarks/hybrid.py --model-devices 'cpu;cpu,cuda:0' --drm-devices cpu,cuda:0 \
        --slowdown 1 --datasets csbm:nodes=500000,avg_degree=20,features=100,classes=47 --hidden 256

**Model** (``--parts model``): per dataset (``--datasets``, default ego-twitter symmetrised and a csbm graph) and per
device list (``--model-devices``, default ``cpu`` and ``cpu,cpu:1``: the CPU trainer alone, and beside a CPU
stand-in for an accelerator), the engine is built with ``--drm off`` and the split its performance model picks; it
trains ``--warmup`` untimed epochs, then ``--epochs`` timed ones (``HybridEngine.train_epoch``, no evaluation). The
table gives, per stage (SC, Load, Tran, TC, TA, sync) and per iteration, the predicted seconds (Eqs. 6-13, the
sampling table, Eq. 10 calibrated by one measured forward/backward) against the mean measured ones, and the
predicted epoch time against the median measured one, with the error. In the same run the mini-batch engine
(one trainer, same batch and fanouts) trains the same epochs: the ratio of epoch times is reported.

**DRM** (``--parts drm``): devices ``cpu,cpu:1`` on the csbm graph, the CPU trainer made ``--slowdown`` times
slower (``HybridEngine.slowdown``: it sleeps the difference, so the 2-core machine keeps its cores for the
others). A sweep of static splits (``--sweep``, the CPU trainer's share; ``--drm off``) gives each split's median
epoch time; then DRM starts from an equal split and trains ``--drm-epochs`` epochs. Reported: the split after
each applied decision, the iteration from which the CPU share stays within 0.03 of its final value ("settled"),
the DRM run's epoch times (the last one, fully settled, against the best static split), and the pace of the
first epoch's iterations after the tenth (their mean seconds times the iterations of an epoch) against the best
static split's epoch.

Results are appended to ``--out`` (default benchmarks/results/hybrid.jsonl) with the environment.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

try:
    from offload import _list, append_records, environment
except ImportError:  # run as a module
    from benchmarks.offload import _list, append_records, environment

from gnnscale.config import TrainConfig
from gnnscale.engines.sampled.hybrid import HybridEngine
from gnnscale.engines.sampled.minibatch import MiniBatchEngine
from gnnscale.errors import GnnscaleError
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.train import check_trainable

EGO_TWITTER = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "snap" / "ego-twitter.txt.gz"
CSBM = "csbm:nodes=50000,features=128,avg_degree=15,train=0.5"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "hybrid.jsonl"
STAGES = ("SC", "Load", "Tran", "TC", "TA", "sync", "iteration")
SETTLE_AFTER = 10
"""DRM should have settled after this many iterations (the issue's bound)."""


def _engine(cls: type, g: Graph, cfg: TrainConfig) -> Any:
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return cls(g, model, cfg, torch.device("cpu"))


def _epochs(engine: Any, warmup: int, epochs: int) -> tuple[list[float], list[dict[str, Any]]]:
    times, recs = [], []
    for e in range(1, warmup + epochs + 1):
        t0 = time.perf_counter()
        rec = engine.train_epoch(e)
        if e > warmup:
            times.append(time.perf_counter() - t0)
            recs.append(rec)
    return times, recs


def model_part(g: Graph, spec: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    base = {"model": args.model, "hidden": args.hidden, "batch_size": args.batch_size,
            "fanouts": tuple(int(f) for f in _list(args.fanouts)), "seed": args.seed}
    mb = _engine(MiniBatchEngine, g, TrainConfig(engine="minibatch", **base))
    mb_times, _ = _epochs(mb, args.warmup, args.epochs)
    for devs in args.model_devices.split(";"):
        cfg = TrainConfig(engine="hybrid", devices=tuple(_list(devs)), drm="off", **base)
        eng = _engine(HybridEngine, g, cfg)
        times, recs = _epochs(eng, args.warmup, args.epochs)
        n = int(eng.train_ids.numel())
        pred = eng.perf.stage_times(cfg.batch_size, eng.split, eng.threads)
        pred_epoch = eng.perf.epoch_time(n, cfg.batch_size, eng.split, eng.threads)
        meas = eng.measured
        measured_epoch = statistics.median(times)
        row = {"kind": "model", "dataset": spec, "graph": g.name, "nodes": g.num_nodes, "edges": g.num_edges,
               "devices": devs, "split": eng.split, "threads": list(eng.threads.as_tuple()),
               "calibration": eng.perf.calibration, "predicted": pred, "measured": dict(meas),
               "predicted_epoch_s": pred_epoch, "measured_epoch_s": measured_epoch, "epoch_times": times,
               "error": pred_epoch / measured_epoch - 1, "minibatch_epoch_s": statistics.median(mb_times),
               "hybrid_over_minibatch": measured_epoch / statistics.median(mb_times),
               "mteps": statistics.median(r["mteps"] for r in recs), "accel_bytes": recs[-1]["accel_bytes"],
               "trainer_seeds": recs[-1]["trainer_seeds"]}
        rows.append(row)
        print(f"\n{spec} on {devs}: split {', '.join(f'{s:.3f}' for s in eng.split)}, threads "
              f"{','.join(map(str, eng.threads.as_tuple()))}, Eq. 10 calibration "
              f"{', '.join(f'{c:.1f}' for c in eng.perf.calibration)}")
        print("| stage | predicted s | measured s |\n|---|---|---|")
        for k in STAGES:
            print(f"| {k} | {pred.get(k, 0.0):.4f} | {meas.get(k, 0.0):.4f} |")
        print(f"| epoch | {pred_epoch:.3f} | {measured_epoch:.3f} (error {100 * row['error']:+.1f}%) |")
        print(f"{row['mteps']:.2f} MTEPS; mini-batch engine, same batches: {row['minibatch_epoch_s']:.3f} s per epoch "
              f"(hybrid/minibatch {row['hybrid_over_minibatch']:.2f}x)")
    return rows


def _drm_run(g: Graph, base: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One DRM run from an equal split: its epoch times, decisions, where and when it settled."""
    eng = _engine(HybridEngine, g, TrainConfig(engine="hybrid", drm="on", shares=(0.5, 0.5), **base))
    eng.slowdown = [args.slowdown, 1.0]
    times, recs, first = [], [], []
    for e in range(1, args.drm_epochs + 1):
        t0 = time.perf_counter()
        recs.append(eng.train_epoch(e))
        times.append(time.perf_counter() - t0)
        if e == 1:
            first = list(eng.iteration_s)
    applied = [d for d in eng.drm_log if d["applied"]]
    final = eng.split[0]
    settled = 0  # the first iteration from which the CPU share stays within 0.03 of where it ends
    for d in applied:
        if abs(d["split"][0] - final) >= 0.03:
            settled = d["step"] + 1
    after = first[SETTLE_AFTER:]  # epoch 1 from iteration SETTLE_AFTER + 1 on, at an epoch's pace
    return {"epoch_times": times, "settled_epochs_s": statistics.median(times[1:] or times),
            "final_share": final, "settled_iteration": settled, "iterations_per_epoch": recs[0]["batches"],
            "decisions": [(d["step"], d["applied"], round(d["split"][0], 4)) for d in applied],
            "first_epoch_iteration_s": first,
            "paced_epoch_after_settle_s": statistics.mean(after) * len(first) if after else None}


def drm_part(g: Graph, spec: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--repeats`` rounds of the static sweep and a DRM run, interleaved (the 2-core box drifts by 10-20%
    between minutes); per split the median over rounds, DRM's settled epochs (its epochs after the first) too."""
    base = {"model": args.model, "hidden": args.hidden, "batch_size": args.batch_size,
            "fanouts": tuple(int(f) for f in _list(args.fanouts)), "seed": args.seed,
            "devices": tuple(_list(args.drm_devices))}
    shares = [float(x) for x in _list(args.sweep)]
    sweeps: dict[float, list[float]] = {x: [] for x in shares}
    runs = []
    for r in range(args.repeats):
        for share in shares:
            eng = _engine(HybridEngine, g, TrainConfig(engine="hybrid", drm="off", shares=(share, 1 - share),
                                                       **base))
            eng.slowdown = [args.slowdown, 1.0]
            times, _ = _epochs(eng, args.warmup, args.epochs)
            sweeps[share].append(statistics.median(times))
            print(f"round {r + 1}: static split {share:.2f}/{1 - share:.2f}: {sweeps[share][-1]:.3f} s per epoch",
                  flush=True)
        runs.append(_drm_run(g, base, args))
        d = runs[-1]
        print(f"round {r + 1}: DRM from 0.50: decisions {[(i, s) for i, _, s in d['decisions']]}; settled by "
              f"iteration {d['settled_iteration']} at CPU share {d['final_share']:.3f}; epochs "
              f"{', '.join(f'{t:.3f}' for t in d['epoch_times'])} s", flush=True)
    sweep = {x: statistics.median(v) for x, v in sweeps.items()}
    best = min(sweep, key=lambda x: sweep[x])
    drm_s = statistics.median(d["settled_epochs_s"] for d in runs)
    paced_runs = [d["paced_epoch_after_settle_s"] for d in runs if d["paced_epoch_after_settle_s"] is not None]
    paced = statistics.median(paced_runs) if paced_runs else float("nan")
    row = {"kind": "drm", "dataset": spec, "graph": g.name, "devices": args.drm_devices, "slowdown": args.slowdown,
           "repeats": args.repeats, "sweep": sweep, "sweep_rounds": sweeps, "best_static_share": best,
           "best_static_epoch_s": sweep[best], "drm_runs": runs, "drm_settled_epoch_s": drm_s,
           "drm_over_best": drm_s / sweep[best], "paced_over_best": paced / sweep[best],
           "settled_iterations": [d["settled_iteration"] for d in runs],
           "final_shares": [d["final_share"] for d in runs],
           # for the gpu-check summary
           "drm_final_share": statistics.median(d["final_share"] for d in runs),
           "settled_iteration": statistics.median(d["settled_iteration"] for d in runs),
           "drm_epoch_times": runs[-1]["epoch_times"], "drm_last_over_best": drm_s / sweep[best]}
    print(f"\nDRM on {args.drm_devices}, CPU trainer {args.slowdown}x slower, median of {args.repeats} round(s):")
    print("| CPU share | " + " | ".join(f"{x:.2f}" for x in shares) + " | DRM |")
    print("|---" * (len(shares) + 2) + "|")
    print("| s per epoch | " + " | ".join(f"{sweep[x]:.3f}" for x in shares) + f" | {drm_s:.3f} |")
    print(f"best static {best:.2f} at {sweep[best]:.3f} s; DRM settled (epochs 2..) {drm_s:.3f} s = "
          f"{row['drm_over_best']:.3f}x; settled by iterations {row['settled_iterations']} at CPU shares "
          f"{', '.join(f'{x:.3f}' for x in row['final_shares'])}; epoch 1 after iteration {SETTLE_AFTER} at an "
          f"epoch's pace: {row['paced_over_best']:.3f}x the best static")
    return [row]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_sets = ([f"edgelist:{EGO_TWITTER}:symmetrize=1"] if EGO_TWITTER.exists() else []) + [CSBM]
    ap.add_argument("--datasets", default=";".join(default_sets), help="';'-separated dataset specs of the model part")
    ap.add_argument("--drm-dataset", default=CSBM, help="the DRM part's dataset")
    ap.add_argument("--parts", default="model,drm", help="model, drm or both")
    ap.add_argument("--model-devices", default="cpu;cpu,cpu:1", help="';'-separated device lists (model part)")
    ap.add_argument("--model", default="sage")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="15,10")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per configuration (median)")
    ap.add_argument("--sweep", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="static CPU shares")
    ap.add_argument("--drm-devices", default="cpu,cpu:1", help="the DRM part's two devices, the CPU trainer first")
    ap.add_argument("--slowdown", type=float, default=3.0,
                    help="how much slower the CPU trainer is made (1: as it is, e.g. beside a real GPU)")
    ap.add_argument("--drm-epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the DRM part (sweep and DRM interleaved)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads before anything runs (default: torch's; 1 on a shared CPU box)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    parts = _list(args.parts)
    common = environment(torch.device("cpu"))
    print(f"device {common['device_name']}; torch {torch.__version__}, gnnscale {common['gnnscale_rev']}; "
          f"{args.model}, hidden {args.hidden}, batch {args.batch_size}, fanouts {args.fanouts}")
    records: list[dict[str, Any]] = []
    try:
        if "model" in parts:
            for spec in args.datasets.split(";"):
                g = load_dataset(spec, None, seed=args.seed)
                check_trainable(g)
                records += model_part(g, spec, args)
        if "drm" in parts:
            g = load_dataset(args.drm_dataset, None, seed=args.seed)
            check_trainable(g)
            records += drm_part(g, args.drm_dataset, args)
    except GnnscaleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.no_save:
        append_records(args.out, [{**common, **r} for r in records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
