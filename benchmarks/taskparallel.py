"""The task-parallel engine (NeutronTask) against the offload engine (HongTu, data parallel over partitions) and
the in-memory engine: per-device peak memory and epoch time on one graph, and neighbour replication factors.

    python -m benchmarks taskparallel --device cpu --devices 4 --repeats 5
    python -m benchmarks taskparallel --device cpu --devices 4 --repeats 5 --dataset csbm
    python -m benchmarks taskparallel --device cuda --devices 4 --repeats 5 --dataset kronecker:scale=20,edgefactor=16

(the first is issue #13's acceptance case: Kronecker scale 16, 4 devices.) ``--devices N`` runs on N copies of
``--device`` (``cpu`` N times, or ``cuda:0 .. cuda:N-1``); a comma list names them.

**Engines**, on one graph (``--dataset``, any :func:`gnnscale.load_dataset` spec), every setting not named here at
its default (as a user would run them):

* ``taskparallel``: ``--model`` (decoupled, ``dgcn`` by default), ``--dependency`` (``exact``), the N devices;
  the planner assigns the tasks and picks the subgraphs (``--subgraphs`` forces them);
* ``offload``: ``--dedup none --partitions N`` (``--partitions`` overrides N) on the same N devices: data
  parallelism. It declines decoupled models, so it trains the closest coupled model, ``--coupled-model``
  (``gcn``), with the same layers and hidden width; every record says so (``model``, ``note``): not the same
  computation (dgcn propagates class-wide rows, gcn aggregates hidden-wide rows);
* ``inmemory``: ``--model`` on one device (the first), the reference.

Each engine is built, then runs ``--warmup`` untimed epochs (default 1) and ``--repeats`` timed ones (mean and
min). Peak memory on CPU is each device's own count of the bytes live in its "device-side" tensors
(:class:`~gnnscale.plan.memory.LiveBytesCounter`, one per device thread, the engines' ``device_peak_bytes``), in
the warm-up epochs only (the counter runs Python on every tensor op; ``--count-timed``: always; ``--warmup 0``:
every epoch). The in-memory engine runs under a counter of the same kind whose baseline is what it keeps on its
device before an epoch (topology, features, labels, masks, parameters, Adam's state); ``host_peak_rss_bytes`` is
recorded for every engine. On CUDA the peak is ``torch.cuda.max_memory_allocated`` of the first device only.
``--explain-peaks`` records, per device, the live tensors (shape, dtype) at its peak, largest first.

Ratios are taskparallel over the other engine (< 1: taskparallel is faster / holds less): mean epoch time and the
largest per-device peak. ``p_rows_replication`` is the engine's own count of P-task input rows sent from T to P
devices in the first epoch over ``|V|`` (``_per_epoch``: every epoch), ``p_group_replication_per_epoch`` what the
planner's assignment predicts (:func:`gnnscale.plan.taskparallel.p_group_parts`).

**Replication factors** (``--parts``, default 2,4,8,16; '' skips): NeutronTask's alpha (Table 2: average copies of a
vertex's row when each of ``n`` data-parallel parts holds its own and its in-neighbours' rows;
:func:`gnnscale.plan.taskparallel.replication_factor`) for ``--method`` parts (METIS by default), next to Table 2's
values on ogbn-papers100M, and, for ``n`` devices, the taskparallel planner's assignment and the factor of its P
group in the first epoch, as ``gnnscale partition --engine taskparallel --json`` prints them, with
``metis_parts_of_group_replication`` (``--method`` parts of the group size) for reference.

Cases: per dataset (``--dataset``, repeatable) one per engine (one group: the harness rotates the engines' order
each round) and one ``replication`` case. Records: one per engine run (``"kind": "engine"``) and one per part count
(``"kind": "replication"``); the ratios (``tp / this``) are taken in :func:`render` between the engines of one
round (records before the harness carry them too, with a ``"kind": "comparison"`` line per run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks._taskparallel_peaks import PeakTensors, counted_units, inmemory_resident
from benchmarks.harness import Case, Row, fmt, split_list
from benchmarks.harness.graphs import device_name, load_graph
from benchmarks.harness.records import provenance, session_of, table
from benchmarks.offload import bench as time_epochs
from gnnscale.engines import InMemoryEngine, OffloadEngine, TaskParallelEngine, select_engine
from gnnscale.engines.core.devices import resolve_device
from gnnscale.errors import GnnscaleError
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.decoupled import DECOUPLED_MODELS
from gnnscale.partition import partition_graph
from gnnscale.plan.memory import LiveBytesCounter, estimate_inmemory_bytes
from gnnscale.plan.taskparallel import p_group_parts, plan_taskparallel, replication_factor
from gnnscale.train import TrainConfig

TITLE = "Task-parallel (issue #13, CPU)"
ROUNDS = 3
Step = Callable[[int], dict[str, Any]]
DEFAULT_DATASET = "kronecker:scale=16,edgefactor=16"
QUICK_DATASET = "csbm:nodes=300,avg_degree=30,features=8"
ENGINES = ("taskparallel", "offload", "inmemory")
NEUTRONTASK_TABLE2 = {2: 1.25, 4: 1.52, 8: 2.13, 16: 3.02}
"""NeutronTask Table 2: replication factor of data-parallel METIS partitioning on ogbn-papers100M."""
MIB = 2**20


# ------------------------------------------------------------------------------------------------ engines
def make_engine(g: Graph, cfg: TrainConfig, dev: torch.device, count_epochs: int | None, explain: bool,
                holder: list[Any]) -> tuple[Step, dict[str, Any]]:
    """An engine for ``cfg`` (after the selector's checks: a refusal raises EngineError) and its epoch step.

    ``count_epochs``: on CPU, count device bytes in epochs ``<= count_epochs`` only (``None``: always). The engine
    is appended to ``holder`` so the caller can close it.
    """
    engine_cls, _ = select_engine(g, cfg, dev)
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    t0 = time.perf_counter()
    engine = engine_cls(g, model, cfg, dev)
    holder.append(engine)
    info: dict[str, Any] = {"engine_detail": engine.describe(), "setup_s": time.perf_counter() - t0,
                            "devices": list(cfg.devices or [str(dev)])}
    if isinstance(engine, TaskParallelEngine):
        plan = engine.plan
        info.update({"plan_estimate_bytes": list(plan.estimate), "regime": plan.regime, "n_t": plan.n_t,
                     "n_p": plan.n_p, "subgraphs": plan.subgraphs, "chunks_per_subgraph": plan.chunks_per_subgraph,
                     "p_group_size": max(len(s.devices) for s in plan.p_stages), "dependency": cfg.dependency,
                     "p_width": engine._width})
    elif isinstance(engine, OffloadEngine):
        st = engine.plan.partition.stats(g)
        info.update({"plan_estimate_bytes": engine.plan.estimate, "partitions": engine.partitions,
                     "chunks": engine.num_chunks // engine.partitions, "dedup": engine.plan.dedup,
                     "partition_method": cfg.partition_method, "alpha": st["alpha"], "edge_cut": st["edge_cut"],
                     "chunk_edges_max": st["chunk_edges_max"], "chunk_edge_imbalance": st["chunk_edge_imbalance"],
                     "workers": len(engine.workers)})
    else:
        info["plan_estimate_bytes"] = estimate_inmemory_bytes(g, cfg)["total"]
    cpu = dev.type == "cpu"
    units = counted_units(engine)
    if explain and cpu:
        for u in units:
            u.counter = PeakTensors()
    counters = [u.counter for u in units]

    def step(epoch: int) -> dict[str, Any]:
        count = cpu and (count_epochs is None or epoch <= count_epochs)
        for u, c in zip(units, counters, strict=True):
            u.counter = c if count else None
        used = counters
        if not isinstance(engine, InMemoryEngine) or not count:
            stats = engine.train_epoch(epoch)
        else:  # a fresh counter each epoch, its baseline what the engine keeps on the device now
            counter = (PeakTensors if explain else LiveBytesCounter)(inmemory_resident(engine))
            with counter:
                stats = engine.train_epoch(epoch)
            stats.update(peak_device_bytes=counter.peak, device_peak_bytes=[counter.peak])
            used = [counter]
        if count and explain:
            stats["peak_tensors"] = [c.summary() if isinstance(c, PeakTensors) else [] for c in used]
            stats["counter_baseline_bytes"] = [int(c.baseline) for c in used]
        return stats

    return step, info


def run_engine(impl: str, g: Graph, cfg: TrainConfig, dev: torch.device, warmup: int, repeats: int,
               count_epochs: int | None, explain: bool) -> dict[str, Any]:
    """Build and time one engine (``offload.bench``'s loop); add mean/min and the per-device peaks."""
    holder: list[Any] = []
    try:
        r = time_epochs(impl, lambda: make_engine(g, cfg, dev, count_epochs, explain, holder), dev, warmup,
                        repeats, keep_stats=True)
    finally:
        for e in holder:
            if hasattr(e, "close"):
                e.close()
    r["engine"] = impl
    if r["status"] != "ok":
        return r
    stats = r.pop("epoch_stats")
    counted = [s for s in stats if "device_peak_bytes" in s]
    if counted:  # per device, the largest over the counted epochs
        r["device_peak_bytes"] = [max(int(s["device_peak_bytes"][d]) for s in counted)
                                  for d in range(len(counted[0]["device_peak_bytes"]))]
        r["device_peak_bytes_per_epoch"] = [[int(p) for p in s["device_peak_bytes"]] for s in counted]
        r["peak_device_bytes"] = max(r["device_peak_bytes"])
        r["peak_kind"] = "live device-side bytes per device thread (LiveBytesCounter)"
    else:
        r["device_peak_bytes"] = None
        r["peak_device_bytes"] = r["peak_bytes"]
    if explain and counted and "peak_tensors" in counted[-1]:
        r["peak_tensors"] = counted[-1]["peak_tensors"]
        r["counter_baseline_bytes"] = counted[-1]["counter_baseline_bytes"]
    timed = r["epoch_times_s"]
    r.update(mean_epoch_s=statistics.fmean(timed), min_epoch_s=min(timed), repeats=len(timed))
    last = stats[-1]
    if impl == "taskparallel" and "p_width" in r:  # epochs 1 .. warmup + repeats; the first one reported
        rows = [s.get("t2p_bytes", 0) / (g.num_nodes * r["p_width"] * 4) for s in stats]
        plan = holder[0].plan
        r.update(p_rows_replication=rows[0], p_rows_replication_per_epoch=rows,
                 p_group_replication_per_epoch=[replication_factor(g, p_group_parts(plan, cfg.seed, e))
                                                for e in range(1, len(stats) + 1)])
    r["moved_bytes"] = {k: int(v) for k, v in last.items() if k.endswith("_bytes") and isinstance(v, int | float)
                        and k not in ("peak_device_bytes",)}
    return r


# ------------------------------------------------------------------------------------------------ replication
def replication_factors(g: Graph, parts_list: list[int], cfg: TrainConfig, dev: torch.device, method: str,
                        seed: int) -> list[dict[str, Any]]:
    """Per part count ``n``: data parallelism's replication factor over ``n`` ``method`` parts, and the taskparallel
    planner's assignment on ``n`` devices with its P group's factor (what ``gnnscale partition --engine
    taskparallel --json`` prints as ``data_parallel_replication`` and ``p_group_replication``).

    The P group's factor is the engine's own assignment in epoch 1 (:func:`~gnnscale.plan.taskparallel.
    p_group_parts`: the chunks of each subgraph to the group's members by slot; 1.0 for one P task per device),
    the rows the engine sends from T to P devices that epoch over ``|V|``. ``metis_parts_of_group_replication`` is
    ``method`` parts of the group size, for reference (what an edge-cut partition of the group would replicate)."""
    cache: dict[int, tuple[float, float]] = {}

    def factor(parts: int) -> tuple[float, float]:
        if parts not in cache:
            if parts <= 1:
                cache[parts] = (1.0, 0.0)
            else:
                t0 = time.perf_counter()
                p = partition_graph(g, parts, 1, method, seed)
                owner = torch.empty(g.num_nodes, dtype=torch.int64)
                owner[p.perm] = torch.repeat_interleave(torch.arange(parts), p.part_ptr[1:] - p.part_ptr[:-1])
                cache[parts] = (replication_factor(g, owner), time.perf_counter() - t0)
        return cache[parts]

    out = []
    kind = dev.type
    for n in parts_list:
        alpha, secs = factor(n)
        rec: dict[str, Any] = {"kind": "replication", "parts": n, "method": method,
                               "data_parallel_replication": alpha, "partition_s": secs,
                               "neutrontask_table2_papers100m": NEUTRONTASK_TABLE2.get(n)}
        devices = tuple("cpu" for _ in range(n)) if kind == "cpu" else tuple(f"cuda:{i}" for i in range(n))
        try:
            tp = TrainConfig(model=cfg.model, layers=cfg.layers, hidden=cfg.hidden, engine="taskparallel",
                             devices=devices, seed=seed, dependency=cfg.dependency)
            plan = plan_taskparallel(g, tp, torch.device(devices[0]))
        except GnnscaleError as exc:
            rec.update(taskparallel_error=f"{type(exc).__name__}: {exc}")
        else:
            group = max(len(s.devices) for s in plan.p_stages)
            rec.update(regime=plan.regime, n_t=plan.n_t, n_p=plan.n_p, p_group_size=group,
                       p_group_replication=replication_factor(g, p_group_parts(plan, seed)) if group > 1 else 1.0,
                       metis_parts_of_group_replication=factor(group)[0])
        out.append(rec)
    return out


# ------------------------------------------------------------------------------------------------ cases
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    ap.add_argument("--devices", default="4", metavar="N|LIST",
                    help="devices of taskparallel and offload: a count of --device copies or a comma list")
    ap.add_argument("--dataset", action="append", metavar="SPEC",
                    help=f"dataset spec, repeatable (default {DEFAULT_DATASET}; --quick {QUICK_DATASET})")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="subset to run, comma list")
    ap.add_argument("--model", default="dgcn", choices=DECOUPLED_MODELS, help="taskparallel's and inmemory's model")
    ap.add_argument("--coupled-model", default="gcn", help="offload's model (it declines decoupled ones)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=None, help="default 64 (--quick 16)")
    ap.add_argument("--dependency", default="exact", choices=["exact", "skip"])
    ap.add_argument("--subgraphs", type=int, default=None, help="taskparallel subgraphs (default: the planner's)")
    ap.add_argument("--partitions", type=int, default=None, help="offload partitions (default: the device count)")
    ap.add_argument("--dedup", default="none", help="offload --dedup (default none: plain data parallelism)")
    ap.add_argument("--parts", default=None,
                    help="part counts of the replication table (default 2,4,8,16; --quick 2,4; '' for none)")
    ap.add_argument("--method", default="metis", help="partitioner of the replication table: metis, random, range")
    ap.add_argument("--warmup", type=int, default=1, help="untimed epochs first (device bytes counted there)")
    ap.add_argument("--repeats", type=int, default=None, help="timed epochs (default 5, --quick 2; mean and min)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count-timed", action="store_true", help="CPU: count device bytes in the timed epochs too")
    ap.add_argument("--explain-peaks", action="store_true", help="CPU: record the live tensors at each peak")


def _devices(spec: str, dev: torch.device) -> tuple[str, ...]:
    if spec.strip().isdigit():
        n = int(spec)
        if n < 1:
            raise SystemExit("error: --devices must be >= 1")
        return tuple("cpu" for _ in range(n)) if dev.type == "cpu" else tuple(f"cuda:{i}" for i in range(n))
    return tuple(split_list(spec))


def cases(args: argparse.Namespace) -> list[Case]:
    """Per dataset, one case per engine (one group: the engines of one workload) and one replication case."""
    dev = resolve_device(args.device)
    devices = _devices(args.devices, dev)
    engines = split_list(args.engines)
    if not engines or any(e not in ENGINES for e in engines):
        raise SystemExit(f"error: --engines: choose from {', '.join(ENGINES)}, got {args.engines!r}")
    parts = [int(p) for p in split_list(args.parts if args.parts is not None else "2,4" if args.quick
                                        else "2,4,8,16")]
    repeats = args.repeats if args.repeats is not None else 2 if args.quick else 5
    if any(p < 1 for p in parts) or args.warmup < 0 or repeats < 1:
        raise SystemExit("error: --parts and --repeats must be >= 1, --warmup >= 0")
    hidden = args.hidden if args.hidden is not None else 16 if args.quick else 64
    common = {"root": args.root, "device": str(dev), "devices": list(devices), "model": args.model,
              "coupled_model": args.coupled_model, "layers": args.layers, "hidden": hidden,
              "dependency": args.dependency, "subgraphs": args.subgraphs, "partitions": args.partitions,
              "dedup": args.dedup, "method": args.method, "warmup": args.warmup, "repeats": repeats,
              "seed": args.seed, "count_timed": args.count_timed, "explain_peaks": args.explain_peaks}
    out = []
    for spec in args.dataset or [QUICK_DATASET if args.quick else DEFAULT_DATASET]:
        where = f"{spec}, {len(devices)} devices"
        out += [Case(f"{e} ({where})", {**common, "dataset": spec, "engine": e}, group=where) for e in engines]
        if parts:
            out.append(Case(f"replication ({spec})", {**common, "dataset": spec, "parts": parts}))
    return out


def _configs(p: dict[str, Any]) -> dict[str, TrainConfig]:
    devices = tuple(p["devices"])
    common = {"layers": p["layers"], "hidden": p["hidden"], "seed": p["seed"]}
    return {"taskparallel": TrainConfig(engine="taskparallel", model=p["model"], devices=devices,
                                        dependency=p["dependency"], subgraphs=p["subgraphs"], **common),
            "offload": TrainConfig(engine="offload", model=p["coupled_model"], devices=devices, dedup=p["dedup"],
                                   partitions=p["partitions"] or len(devices), **common),
            "inmemory": TrainConfig(engine="inmemory", model=p["model"], **common)}


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """One engine's run (a record of ``"kind": "engine"``), or the replication table (one record per part count)."""
    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))  # partition plans
    dev = torch.device(params["device"])
    g, load_s = load_graph(params["dataset"], params["root"], params["seed"])
    configs = _configs(params)
    case = {"dataset": g.meta.get("spec", params["dataset"]), "graph": g.name, "nodes": g.num_nodes,
            "edges": g.num_edges, "features": g.num_features, "classes": g.num_classes, "load_s": load_s,
            "device": dev.type, "device_name": device_name(str(dev)), "warmup": params["warmup"],
            "repeats_requested": params["repeats"], "seed": params["seed"]}
    if "parts" in params:
        reps = replication_factors(g, params["parts"], configs["taskparallel"], dev, params["method"], params["seed"])
        return [{**case, **r} for r in reps]
    impl, cfg = params["engine"], configs[params["engine"]]
    count_epochs = None if params["count_timed"] or params["warmup"] == 0 else params["warmup"]
    r = run_engine(impl, g, cfg, dev, params["warmup"], params["repeats"], count_epochs, params["explain_peaks"])
    r.update(model=cfg.model, layers=cfg.layers, hidden=cfg.hidden, dropout=cfg.dropout)
    if impl == "offload":
        r["note"] = (f"offload declines decoupled models ({params['model']}); it trains {cfg.model} with the same "
                     f"layers ({cfg.layers}) and hidden width ({cfg.hidden}), --dedup {cfg.dedup}, "
                     f"--partitions {cfg.partitions}")
    return [{**case, **r, "kind": "engine"}]


def describe(r: dict[str, Any]) -> str:
    if r.get("kind") == "replication":
        return f"{r['parts']} parts: alpha {r['data_parallel_replication']:.2f}"
    if r.get("status") != "ok":
        return f"{r['engine']}: {r['status']}: {r.get('reason', '')[:100]}"
    return (f"{r['engine']} ({r['model']}): mean {r['mean_epoch_s']:.3f} s, largest peak "
            f"{fmt(None if r['peak_device_bytes'] is None else r['peak_device_bytes'] / MIB, '.2f')} MiB")


# ------------------------------------------------------------------------------------------------ rendering
def compare(engines: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Taskparallel over each engine of one run (< 1: taskparallel faster / smaller): ``{engine: {"time", "peak"}}``
    from the mean epoch times and the largest per-device peaks; ``{}`` without a taskparallel run."""
    ok = {r["engine"]: r for r in engines if r.get("status") == "ok"}
    tp = ok.get("taskparallel")
    if tp is None:
        return {}
    return {name: {"time": tp["mean_epoch_s"] / r["mean_epoch_s"],
                   "peak": tp["peak_device_bytes"] / r["peak_device_bytes"] if r["peak_device_bytes"] else None}
            for name, r in ok.items()}


def _shown(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records shown: the CPU's (any other device's when there are none) at the last such record's commit."""
    mine = [r for r in records if r.get("kind") in ("engine", "replication")]
    cpu = [r for r in mine if r.get("device") == "cpu"]
    mine = cpu or mine
    return [r for r in mine if r.get("gnnscale_rev") == mine[-1].get("gnnscale_rev")] if mine else []


def runs_by_config(records: list[dict[str, Any]]) -> dict[tuple[str, int], list[list[dict[str, Any]]]]:
    """The engine records of :func:`_shown`, per (dataset, device count): its runs (a session's round, or one
    command before the harness: a repeated engine starts the next run of the same command), in order."""
    runs: list[list[dict[str, Any]]] = []
    current: dict[tuple[str, Any, str], list[dict[str, Any]]] = {}
    for r in _shown(records):
        key = (session_of(r), r.get("round"), r["dataset"])
        if r["kind"] == "engine":
            if key not in current or any(x["engine"] == r["engine"] for x in current[key]):
                current[key] = []
                runs.append(current[key])
            current[key].append(r)
    out: dict[tuple[str, int], list[list[dict[str, Any]]]] = {}
    for rs in runs:
        out.setdefault((rs[0]["dataset"], max(len(r.get("devices") or [1]) for r in rs)), []).append(rs)
    return out


def _mib(b: float | None) -> str:
    return fmt(None if b is None else b / MIB, ".2f")


def _engine_rows(key: tuple[str, int], runs: list[list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    ratios = [compare(rs) for rs in runs]
    for name in dict.fromkeys(r["engine"] for rs in runs for r in rs):
        mine = [next((r for r in rs if r["engine"] == name), None) for rs in runs]
        ok = [r for r in mine if r is not None and r.get("status") == "ok"]
        if not ok:
            rows.append([f"`{key[0]}`", key[1], name, "-", mine[-1].get("status", "?") if mine[-1] else "-",
                         *["-"] * 6])
            continue
        last = ok[-1]
        est = last.get("plan_estimate_bytes")
        rows.append([f"`{key[0]}`", key[1], name, last["model"],
                     ", ".join(_mib(b) for b in last.get("device_peak_bytes") or []) or "-",
                     _mib(last["peak_device_bytes"]), _mib(max(est) if isinstance(est, list) else est),
                     " / ".join(f"{r['mean_epoch_s']:.3f}" for r in ok),
                     " / ".join(f"{r['min_epoch_s']:.3f}" for r in ok),
                     " / ".join(fmt(c.get(name, {}).get("time"), ".2f") for c in ratios),
                     fmt(ratios[-1].get(name, {}).get("peak"), ".2f")])
    return rows


def _replication_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    shown = _shown(records)
    latest = {(r["dataset"], r["parts"]): r for r in shown if r["kind"] == "replication"}
    tp = {(r["dataset"], len(r.get("devices") or [])): r for r in shown
          if r["kind"] == "engine" and r.get("engine") == "taskparallel" and r.get("status") == "ok"}
    rows = []
    for (spec, n), r in sorted(latest.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        plan = r.get("taskparallel_error") or f"{r['regime'].split(' (')[0]}, N_t={r['n_t']}, N_p={r['n_p']}"
        rows.append([n, f"`{spec}`", f"{r['data_parallel_replication']:.2f}",
                     fmt(r.get("neutrontask_table2_papers100m"), ".2f"), plan, fmt(r.get("p_group_size"), "d"),
                     fmt(r.get("p_group_replication"), ".2f"), fmt(r.get("metis_parts_of_group_replication"), ".2f"),
                     fmt(tp[(spec, n)].get("p_rows_replication") if (spec, n) in tp else None, ".2f")])
    return rows


def render(records: list[dict[str, Any]]) -> str:
    """The engines of the latest commit's runs (per dataset and device count, one value per run) and the
    replication factors (the latest per dataset and part count)."""
    shown = _shown(records)
    configs = runs_by_config(records)
    rows = [row for key, runs in configs.items() for row in _engine_rows(key, runs)]
    head = ["dataset", "devices", "engine", "model", "per-device peak (MiB), last run", "largest", "est.",
            "mean epoch (s), per run", "min (s)", "tp / this: time", "tp / this: peak"]
    rep_head = ["parts n", "dataset", "data-parallel alpha", "NeutronTask Table 2 (ogbn-papers100M)",
                "taskparallel planner on n devices", "P group", "P-group alpha (engine's assignment, epoch 1)",
                "METIS parts of the group size", "engine's P rows per \\|V\\| (epoch 1, n devices)"]
    rep = _replication_rows(records)
    return (f"{provenance(shown)}\n\nTaskparallel (dgcn) against offload (gcn: it declines decoupled models, so "
            "the peak ratio compares two models) and the in-memory engine (dgcn, one device): per-device peak "
            "bytes counted in the warm-up epoch, mean and min of the timed epochs; the runs of the latest commit "
            f"on the CPU.\n\n{table(head, rows)}\n\nReplication factors (the latest per dataset and part count; "
            f"alpha: average copies of a vertex's row over the parts).\n\n{table(rep_head, rep) if rep else '-'}\n")


def _is_default(spec: str) -> bool:
    """Whether a recorded (normalised) dataset spec is :data:`DEFAULT_DATASET`'s."""
    def key(text: str) -> tuple[str, set[str]]:
        kind, _, opts = text.partition(":")
        return kind, {o for o in opts.split(",") if o and o != "seed=0"}
    return key(spec) == key(DEFAULT_DATASET)


def headline(records: list[dict[str, Any]]) -> list[Row]:
    """Taskparallel against the in-memory engine (one model, dgcn), from the latest run that has both, on
    :data:`DEFAULT_DATASET` (issue #13's acceptance case) when there is one."""
    configs = sorted(runs_by_config(records).items(), key=lambda kv: _is_default(kv[0][0]))
    for (spec, n), runs in reversed(configs):
        for rs in reversed(runs):
            c = compare(rs).get("inmemory")
            if c and c["peak"] is not None:
                return [Row(f"task-parallel against in-memory (dgcn, `{spec}`, {n} CPU devices): largest "
                            "per-device peak, epoch time", f"peak {c['peak']:.2f}x, time {c['time']:.2f}x",
                            tuple(rs))]
    return []
