"""Predicted against measured epoch time, for every engine with a prediction (``Engine.predict_epoch``).

    python -m benchmarks predict_epoch --rounds 2
    python -m benchmarks predict_epoch --quick --no-save      # a smoke run on one small graph

Graphs: a csbm synthetic (200K vertices, degree 10, 64 features), another (100K vertices, degree 30, 256
features) and a SNAP graph (web-cnr-2000 from ../shared/datasets/snap: 325K vertices, 3.2M arcs; 64 features and
labels synthesised by the loader; skipped when absent). Epochs of 0.1-1 s: a graph of a few thousand vertices
trains in milliseconds, where the fixed cost of each op (not a term of the models) is most of the epoch.
Every engine of the registry but distributed (its ranks: ``python -m benchmarks whatif_distributed``) is tried
with the model it trains (``gcn``, or ``dgcn`` for an engine of decoupled models only; the sampled engines at
their default batch size and fanouts, hybrid on the CPU alone); the offload engine under a device budget of a
quarter of the in-memory estimate, so its chunks move (Eq. 4). An engine that cannot run the case, or predicts
nothing, is skipped (no record).

One case per (graph, engine), the engines of a graph one group (their order rotates per round): the rates
(``gnnscale.plan.rates``, cached), the prediction, the engine's set-up, ``--warmup`` untimed epochs, then
``--epochs`` timed ``train_epoch`` calls (median). The table shows per case the median measured and predicted
seconds over the rounds and the signed error (predicted / measured - 1).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, Row
from benchmarks.harness.records import provenance, table

TITLE = "Models that predict: epoch time per engine, predicted against measured (issue #47), CPU"
ROUNDS = 2
SNAP = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "snap" / "web-cnr-2000.txt.gz"
GRAPHS = ["csbm:nodes=200000,avg_degree=10,features=64", "csbm:nodes=100000,avg_degree=30,features=256",
          f"edgelist:{SNAP}"]
QUICK = ["csbm:nodes=4000,avg_degree=10,features=64"]
BOUND = 0.25
"""A prediction within this fraction of the measured epoch counts as met."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--graphs", default=None, help="';'-separated dataset specs (default: the three above; "
                                                   "--quick: " + QUICK[0] + ")")
    ap.add_argument("--engines", default=None, help="comma list (default: every engine but distributed)")
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs per case (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed epochs first")


def engines() -> list[str]:
    """Every registered engine that trains in one process (distributed's ranks: whatif_distributed)."""
    from gnnscale.engines import ENGINES

    return [name for name, cls in ENGINES.items() if cls.mode != "distributed"]


def cases(args: argparse.Namespace) -> list[Case]:
    if args.graphs:
        graphs = [s.strip() for s in args.graphs.split(";") if s.strip()]
    else:
        graphs = QUICK if args.quick else [g for g in GRAPHS if not g.startswith("edgelist") or SNAP.exists()]
    names = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else engines()
    return [Case(f"{spec} {engine}", {"graph": spec, "engine": engine, "epochs": args.epochs,
                                      "warmup": args.warmup}, group=spec) for spec in graphs for engine in names]


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """One case: predicted and measured seconds per epoch ([] when the engine cannot run it or predicts nothing)."""
    import torch

    from benchmarks.harness.graphs import device_name
    from gnnscale import runtime as rt
    from gnnscale.config import TrainConfig
    from gnnscale.engines import ENGINES
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.nn import build_model
    from gnnscale.plan.memory import estimate_inmemory_bytes
    from gnnscale.plan.rates import rates

    spec, engine = params["graph"], params["engine"]
    cls = ENGINES[engine]
    g = load_dataset(spec, seed=0)
    config = TrainConfig(model="gcn" if cls.trains_layered else "dgcn", hidden=64, engine=engine, epochs=1)
    if engine == "offload":
        config = replace(config, memory_budget=estimate_inmemory_bytes(g, config, None)["total"] // 4)
    device = torch.device("cpu")
    if cls.mode == "distributed" or cls.not_supported_reasons(g, config, device):
        return []
    r = rates(rt.torch_device(device))
    p = cls.predict_epoch(g, config, device, r)
    if p is None:
        return []
    assert g.num_classes is not None
    model = build_model(config.model, g.num_features, config.hidden, g.num_classes, **config.model_kwargs())
    eng = cls(g, model, config, device)
    times = []
    for epoch in range(1, params["warmup"] + params["epochs"] + 1):
        t0 = time.perf_counter()
        eng.train_epoch(epoch)
        if epoch > params["warmup"]:
            times.append(time.perf_counter() - t0)
    close = getattr(eng, "close", None)
    if close is not None:
        close()
    return [{"kind": "predict_epoch", "graph": spec, "engine": engine, "predicted_s": p.seconds,
             "measured_s": statistics.median(times), "terms": p.terms, "bytes": p.bytes, "model": config.model,
             "budget": config.memory_budget, "machine": r.machine, "versions": r.versions,
             "rates_measured": r.measured, "device": "cpu", "device_name": device_name()}]


def describe(r: dict[str, Any]) -> str:
    return (f"measured {r['measured_s']:.3f} s, predicted {r['predicted_s']:.3f} s "
            f"({100 * (r['predicted_s'] / r['measured_s'] - 1):+.0f}%)")


def _run_of(r: dict[str, Any]) -> str:
    """The run a record belongs to: its session; records written before the harness, by their ``commit``."""
    return str(r.get("session") or r.get("commit") or "")


def latest(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured records of the latest run, each with the provenance fields the harness names (the records
    written before it had ``commit``, ``machine`` and ``versions`` instead)."""
    mine = [r for r in records if r.get("measured_s") is not None]
    if not mine:
        return []
    last = _run_of(mine[-1])
    out = []
    for r in mine:
        if _run_of(r) != last:
            continue
        torch_v = next((v.split()[1] for v in str(r.get("versions", "")).split(", ") if v.startswith("torch ")), None)
        out.append({**r, "gnnscale_rev": r.get("gnnscale_rev") or r.get("commit"),
                    "host_cpu": r.get("host_cpu") or r.get("machine"), "torch": r.get("torch") or torch_v,
                    "date": r.get("date") or r.get("rates_measured")})
    return out


def cells(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (graph, engine) of the latest run, in first-seen order: the median measured and predicted seconds over
    its rounds and the signed error."""
    recs = latest(records)
    keys = list(dict.fromkeys((r["graph"], r["engine"]) for r in recs))
    out = []
    for graph, engine in keys:
        rs = [r for r in recs if (r["graph"], r["engine"]) == (graph, engine)]
        m = statistics.median(float(r["measured_s"]) for r in rs)
        p = statistics.median(float(r["predicted_s"]) for r in rs)
        out.append({"graph": graph, "engine": engine, "model": rs[0]["model"], "measured_s": m, "predicted_s": p,
                    "error": p / m - 1, "records": rs})
    return out


def graph_label(spec: str) -> str:
    """``csbm:nodes=200000,avg_degree=10,features=64`` -> ``csbm 200K, degree 10, 64 features``; a file's stem."""
    kind, _, rest = spec.partition(":")
    if kind == "csbm":
        kv = dict(p.split("=", 1) for p in rest.split(",") if "=" in p)
        nodes = int(kv.get("nodes", 0))
        size = f"{nodes // 1000}K" if nodes >= 1000 and nodes % 1000 == 0 else f"{nodes:,}"
        parts = [f"csbm {size}"] + [f"degree {kv['avg_degree']}"] * ("avg_degree" in kv)
        return ", ".join(parts + [f"{kv['features']} features"] * ("features" in kv))
    name = Path(rest.split(":")[0]).name if rest else spec
    return name.removesuffix(".gz").removesuffix(".txt")


def render(records: list[dict[str, Any]]) -> str:
    cs = cells(records)
    if not cs:
        return "No measured case.\n"
    rows = [[graph_label(c["graph"]), c["engine"], c["model"], f"{c['measured_s']:.3f}", f"{c['predicted_s']:.3f}",
             f"{100 * c['error']:+.0f}%"] for c in cs]
    e = error_summary([c["error"] for c in cs])
    return (f"{provenance(latest(records)).rstrip()}\n\nEach engine's predicted epoch (its seed system's model fed "
            f"with this machine's calibrated rates) against the median measured epoch of the latest run, per graph; "
            f"error = predicted / measured - 1.\n\n"
            f"{table(['graph', 'engine', 'model', 'measured s', 'predicted s', 'error'], rows)}\n\n"
            f"**{e['within']} of {e['n']} within {e['bound']}.**\n")


def error_summary(errors: list[float], bound: float = BOUND) -> dict[str, Any]:
    """Signed errors (predicted / measured - 1) summed up: ``n``, ``within`` the bound, the ``worst`` (signed),
    the ``median`` and ``p90`` (nearest rank) of their sizes."""
    sizes = sorted(abs(e) for e in errors)
    return {"n": len(errors), "within": sum(e <= bound for e in sizes), "worst": max(errors, key=abs),
            "median": statistics.median(sizes), "p90": sizes[max(0, math.ceil(0.9 * len(sizes)) - 1)],
            "bound": f"{100 * bound:.0f}%"}


def headline(records: list[dict[str, Any]]) -> list[Row]:
    cs = cells(records)
    if not cs:
        return []
    e = error_summary([c["error"] for c in cs])
    return [Row("predicted against measured epoch time",
                f"{e['n']} engine x graph cases: median error {100 * e['median']:.0f}%, p90 {100 * e['p90']:.0f}% "
                f"({e['within']} within {e['bound']})", tuple(r for c in cs for r in c["records"]))]
