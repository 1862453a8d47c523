"""The hybrid engine (HyScale-GNN): the performance model against measured epochs, and DRM against a sweep of
static splits, with one trainer made slower.

    python -m benchmarks hybrid
    python -m benchmarks hybrid --parts model --datasets csbm:nodes=50000,features=128
    python -m benchmarks hybrid --model-devices 'cpu;cpu,cuda:0' --drm-devices cpu,cuda:0 --slowdown 1 \\
        --datasets csbm:nodes=500000,avg_degree=20,features=100,classes=47 --hidden 256

**Model** (``--parts model``): per dataset (``--datasets``, default ego-twitter symmetrised and a csbm graph) and per
device list (``--model-devices``, default ``cpu`` and ``cpu,cpu:1``: the CPU trainer alone, and beside a CPU
stand-in for an accelerator), the engine is built with ``--drm off`` and the split its performance model picks; it
trains ``--warmup`` untimed epochs, then ``--epochs`` timed ones (``HybridEngine.train_epoch``, no evaluation). The
table gives, per stage (SC, Load, Tran, TC, TA, sync) and per iteration, the predicted seconds (Eqs. 6-13, the
sampling table, Eq. 10 calibrated by one measured forward/backward) against the mean measured ones, and the
predicted epoch time against the median measured one, with the error. In the same case the mini-batch engine
(one trainer, same batch and fanouts) trains the same epochs: the ratio of epoch times is reported.

**DRM** (``--parts drm``): devices ``cpu,cpu:1`` on the csbm graph, the CPU trainer made ``--slowdown`` times
slower (``HybridEngine.slowdown``: it sleeps the difference, so the 2-core machine keeps its cores for the
others). A sweep of static splits (``--sweep``, the CPU trainer's share; ``--drm off``) gives each split's median
epoch time; then DRM starts from an equal split and trains ``--drm-epochs`` epochs. Reported: the split after
each applied decision, the iteration from which the CPU share stays within 0.03 of its final value ("settled"),
the DRM run's epoch times (the last one, fully settled, against the best static split), and the pace of the
first epoch's iterations after the tenth (their mean seconds times the iterations of an epoch) against the best
static split's epoch.

Cases: one per dataset of the model part (a ``"kind": "model"`` record per device list) and one DRM case (one
``"kind": "drm"`` record). One harness round by default: the DRM case interleaves its own ``--repeats`` rounds of
the sweep and DRM in one process (its summary needs them all), and the model part compares prediction and
measurement within a process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.harness import Case, fmt, latest_session, split_list
from benchmarks.harness.graphs import device_name, load_graph
from benchmarks.harness.records import provenance, table
from gnnscale.config import TrainConfig
from gnnscale.engines.sampled.hybrid import HybridEngine
from gnnscale.engines.sampled.minibatch import MiniBatchEngine
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model

TITLE = "Hybrid CPU + accelerator training (issue #16, HyScale-GNN), CPU"
ROUNDS = 1
EGO_TWITTER = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "snap" / "ego-twitter.txt.gz"
CSBM = "csbm:nodes=50000,features=128,avg_degree=15,train=0.5"
QUICK_CSBM = "csbm:nodes=2000,features=16,train=0.5"
STAGES = ("SC", "Load", "Tran", "TC", "TA", "sync", "iteration")
SETTLE_AFTER = 10
"""DRM should have settled after this many iterations (the issue's bound)."""
DEFAULTS = {"hidden": 128, "batch_size": 1024, "fanouts": "15,10", "warmup": 1, "epochs": 3,
            "sweep": "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", "drm_epochs": 3, "repeats": 2}
QUICK = {"hidden": 16, "batch_size": 64, "fanouts": "5,5", "warmup": 0, "epochs": 1, "sweep": "0.2,0.5",
         "drm_epochs": 2, "repeats": 1}
"""The flags' values unless given: by default, and under ``--quick``."""


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


def model_part(g: Graph, spec: str, args: Any) -> list[dict[str, Any]]:
    rows = []
    base = {"model": args.model, "hidden": args.hidden, "batch_size": args.batch_size,
            "fanouts": tuple(int(f) for f in split_list(args.fanouts)), "seed": args.seed}
    mb = _engine(MiniBatchEngine, g, TrainConfig(engine="minibatch", **base))
    mb_times, _ = _epochs(mb, args.warmup, args.epochs)
    for devs in args.model_devices.split(";"):
        cfg = TrainConfig(engine="hybrid", devices=tuple(split_list(devs)), drm="off", **base)
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
    return rows


def _drm_run(g: Graph, base: dict[str, Any], args: Any) -> dict[str, Any]:
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


def drm_part(g: Graph, spec: str, args: Any) -> list[dict[str, Any]]:
    """``--repeats`` rounds of the static sweep and a DRM run, interleaved (the 2-core box drifts by 10-20%
    between minutes); per split the median over rounds, DRM's settled epochs (its epochs after the first) too."""
    base = {"model": args.model, "hidden": args.hidden, "batch_size": args.batch_size,
            "fanouts": tuple(int(f) for f in split_list(args.fanouts)), "seed": args.seed,
            "devices": tuple(split_list(args.drm_devices))}
    shares = [float(x) for x in split_list(args.sweep)]
    sweeps: dict[float, list[float]] = {x: [] for x in shares}
    runs = []
    for _ in range(args.repeats):
        for share in shares:
            eng = _engine(HybridEngine, g, TrainConfig(engine="hybrid", drm="off", shares=(share, 1 - share),
                                                       **base))
            eng.slowdown = [args.slowdown, 1.0]
            times, _ = _epochs(eng, args.warmup, args.epochs)
            sweeps[share].append(statistics.median(times))
        runs.append(_drm_run(g, base, args))
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
    return [row]


# ------------------------------------------------------------------------------------------------ cases
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--datasets", default=None,
                    help=f"';'-separated dataset specs of the model part (default: ego-twitter symmetrised if "
                         f"present, and {CSBM}; --quick {QUICK_CSBM})")
    ap.add_argument("--drm-dataset", default=None, help=f"the DRM part's dataset (default {CSBM})")
    ap.add_argument("--parts", default="model,drm", help="model, drm or both")
    ap.add_argument("--model-devices", default="cpu;cpu,cpu:1", help="';'-separated device lists (model part)")
    ap.add_argument("--model", default="sage")
    ap.add_argument("--hidden", type=int, default=None, help=f"default {DEFAULTS['hidden']}")
    ap.add_argument("--batch-size", type=int, default=None, help=f"default {DEFAULTS['batch_size']}")
    ap.add_argument("--fanouts", default=None, help=f"default {DEFAULTS['fanouts']}")
    ap.add_argument("--warmup", type=int, default=None, help=f"default {DEFAULTS['warmup']}")
    ap.add_argument("--epochs", type=int, default=None,
                    help=f"timed epochs per configuration (median; default {DEFAULTS['epochs']})")
    ap.add_argument("--sweep", default=None, help=f"static CPU shares (default {DEFAULTS['sweep']})")
    ap.add_argument("--drm-devices", default="cpu,cpu:1", help="the DRM part's two devices, the CPU trainer first")
    ap.add_argument("--slowdown", type=float, default=3.0,
                    help="how much slower the CPU trainer is made (1: as it is, e.g. beside a real GPU)")
    ap.add_argument("--drm-epochs", type=int, default=None, help=f"default {DEFAULTS['drm_epochs']}")
    ap.add_argument("--repeats", type=int, default=None,
                    help=f"rounds of the DRM part (sweep and DRM interleaved; default {DEFAULTS['repeats']})")
    ap.add_argument("--seed", type=int, default=0)


def resolved(args: argparse.Namespace, defaults: dict[str, Any], quick: dict[str, Any]) -> dict[str, Any]:
    """The flags named in ``defaults`` as given, else their ``quick`` value under ``--quick`` (when it has one),
    else their default (such flags default to None)."""
    return {k: getattr(args, k) if getattr(args, k) is not None else quick.get(k, v) if args.quick else v
            for k, v in defaults.items()}


def cases(args: argparse.Namespace) -> list[Case]:
    """A model case per ``--datasets`` spec and a DRM case (``--parts``)."""
    params = resolved(args, DEFAULTS, QUICK)
    params.update(model=args.model, seed=args.seed, model_devices=args.model_devices, drm_devices=args.drm_devices,
                  slowdown=args.slowdown)
    if args.datasets is not None:
        specs = args.datasets.split(";")
    elif args.quick:
        specs = [QUICK_CSBM]
    else:
        specs = ([f"edgelist:{EGO_TWITTER}:symmetrize=1"] if EGO_TWITTER.exists() else []) + [CSBM]
    parts = split_list(args.parts)
    out = [Case(f"model {spec}", {**params, "part": "model", "dataset": spec}) for spec in specs
           if "model" in parts]
    if "drm" in parts:
        drm = args.drm_dataset or (QUICK_CSBM if args.quick else CSBM)
        out.append(Case(f"drm {drm}", {**params, "part": "drm", "dataset": drm}))
    return out


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The model part on one dataset, or the DRM part."""
    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))
    g, _ = load_graph(params["dataset"], None, params["seed"])
    part = model_part if params["part"] == "model" else drm_part
    rows = part(g, params["dataset"], SimpleNamespace(**params))
    return [{"device": "cpu", "device_name": device_name(), **r} for r in rows]


def describe(r: dict[str, Any]) -> str:
    if r["kind"] == "model":
        return (f"{r['devices']}: epoch predicted {r['predicted_epoch_s']:.3f} s, measured "
                f"{r['measured_epoch_s']:.3f} s ({100 * r['error']:+.1f}%)")
    return (f"best static {r['best_static_share']} at {r['best_static_epoch_s']:.3f} s; DRM "
            f"{r['drm_settled_epoch_s']:.3f} s ({r['drm_over_best']:.2f}x)")


# ------------------------------------------------------------------------------------------------ rendering
def _stage(r: dict[str, Any], k: str) -> str:
    p, m = r["predicted"].get(k, 0.0), r["measured"].get(k, 0.0)
    return "-" if not p and not m else f"{p:.4f} / {m:.4f}"


def _model_table(recs: list[dict[str, Any]]) -> str:
    rows = [[f"{r['graph']} ({r['nodes']:,} vertices)", r["devices"], " / ".join(f"{s:.3f}" for s in r["split"]),
             *[_stage(r, k) for k in ("SC", "Load", "Tran", "TC", "TA", "iteration")],
             f"{r['predicted_epoch_s']:.3f} / {r['measured_epoch_s']:.3f}", f"{100 * r['error']:+.1f}%",
             fmt(r.get("mteps"), ".2f"), f"{r['hybrid_over_minibatch']:.2f}x"] for r in recs]
    return table(["graph", "trainers", "split", "SC pred / meas", "Load", "Tran", "TC", "TA", "iteration",
                  "epoch pred / meas", "error", "MTEPS", "hybrid / minibatch"], rows)


def _drm_text(r: dict[str, Any]) -> str:
    shares = sorted(r["sweep"], key=float)
    sweep = table(["CPU share", *[f"{float(x):.2f}" for x in shares], "DRM (epochs 2..)"],
                  [["s per epoch", *[f"{r['sweep'][x]:.3f}" for x in shares], f"{r['drm_settled_epoch_s']:.3f}"]])
    first = ", ".join(f"{step}: {share:.3f}" for step, _, share in r["drm_runs"][0]["decisions"])
    return (f"DRM on `{r['devices']}` (`{r['dataset']}`), the CPU trainer {r['slowdown']:g}x slower: static splits "
            f"(`--drm off`) against DRM from 0.5/0.5, medians over {r['repeats']} interleaved round(s).\n\n{sweep}\n\n"
            f"Best static split {float(r['best_static_share']):.2f} at {r['best_static_epoch_s']:.3f} s; DRM "
            f"{r['drm_settled_epoch_s']:.3f} s = {r['drm_over_best']:.2f}x; settled by iterations "
            f"{r['settled_iterations']} at CPU shares {', '.join(f'{x:.3f}' for x in r['final_shares'])}; epoch 1 "
            f"after iteration {SETTLE_AFTER} at an epoch's pace {r['paced_over_best']:.2f}x the best static split. "
            f"Round 1's applied decisions (iteration: CPU share): {first or '-'}.\n")


def render(records: list[dict[str, Any]]) -> str:
    """The latest run: the model table (predicted against measured, per stage and per epoch) and DRM's sweep."""
    recs = latest_session(records, lambda r: r.get("kind") in ("model", "drm"))
    model = [r for r in recs if r["kind"] == "model"]
    text = f"{provenance(recs)}\n\n"
    if model:
        text += ("Performance model (`--drm off`, the model's own split): predicted per stage (seconds per "
                 "iteration) against the mean measured, and the predicted epoch against the median measured one; "
                 f"the mini-batch engine trains the same batches.\n\n{_model_table(model)}\n\n")
    return text + "".join(_drm_text(r) for r in recs if r["kind"] == "drm")
