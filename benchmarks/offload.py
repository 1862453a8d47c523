"""The offload engine (HongTu) against the in-memory engine and PyG, by chunk count, budget, dedup mode and chunker.

    python -m benchmarks offload --device cpu
    python -m benchmarks offload --device cpu --dataset csbm:nodes=100000,avg_degree=10,features=100 \\
        --models gcn,gat --hidden 64 --chunks 1,4,16,64 --gpu-memory 64MB,256MB --epochs 4 --warmup 1
    python -m benchmarks offload --device cuda \\
        --dataset csbm:nodes=2450000,avg_degree=50,features=100,classes=47 --models gcn --hidden 256 \\
        --chunks '' --gpu-memory 6
    python -m benchmarks offload --quick

One graph (``--dataset``, any :func:`gnnscale.load_dataset` spec) and, per model, these implementations, each a
case of its own (its own process; the cases of one model form one group, so they rotate within a round):

* ``offload`` once per ``--chunks`` value (chunks per partition forced; the budget is the device's free memory),
  then once per ``--gpu-memory`` budget (GiB when a plain number, else a size such as ``64MB``; the planner picks
  the fewest chunks whose estimated footprint fits); each of these once per ``--dedup`` mode (comma list of
  ``none``, ``reuse``, ``full``; default ``full``) and per ``--chunker`` (comma list of ``range``, ``metis``,
  ``auto``; default ``range``), with one ``--reorganize`` setting (``auto``, ``on`` or ``off``) for all
  (``TrainConfig.dedup``/``chunker``/``reorganize``, HongTu §5-6);
* ``inmemory``, the reference engine, unless ``--skip-inmemory``;
* ``pyg`` / ``pyg-sparse`` (``--pyg edge_index,sparse``): the plain PyG model of ``benchmarks.inmemory_vs_pyg``
  (``GCNConv(cached=True)``, ``SAGEConv(aggr="mean")`` or ``GATConv``) on ``edge_index`` / on the ``adj_t`` of
  ``ToSparseTensor``, unless ``--skip-pyg``; ratios are taken against the faster of the two that ran.

Each runs ``--warmup`` untimed, then ``--epochs`` timed training epochs (one forward, backward and optimiser step
over the whole graph, no evaluation); the table gives the median epoch time, the achieved host -> device rate
``h2d_bytes / median epoch time`` (GB/s, 10^9; the engine's own byte count of one epoch), peak memory and the
ratios ``offload / inmemory`` and ``offload / pyg`` (< 1: offload is faster), computed when rendering from the
records of one run. A configuration that cannot run (CUDA out of memory, the planner or engine selector refusing
it) is recorded with its reason instead of aborting.

Communication volume (offload rows): ``dedup`` and ``chunker`` are those the plan used (``auto`` resolved),
``reorganized`` whether Algorithm 4 reordered the chunks; ``rows_h2d / layer_passes / |V|`` is the rows actually
loaded host -> device per layer pass over the vertex count, ``rows_ori`` the same for HongTu's ``V_ori`` (every
chunk loading all its rows, what ``--dedup none`` moves). Every record also keeps the epoch's other row counters
(``rows_p2p``, ``rows_reused``, ``rows_d2d`` and the ``_bytes`` variants) and the plan's ``volume``.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` for every implementation. On CPU the offload engine's
own count of bytes live in its "device-side" buffers (``LiveBytesCounter``), while in-memory and PyG report the
increase of the process's peak RSS; the two are not comparable, so ``host_peak_rss_bytes`` (the RSS measure for
every implementation, host buffers included) is recorded as well. The counter runs Python on every tensor op
(+40% epoch time at 64 chunks), so it is on in the warm-up epochs only (``--count-timed``: always).

CPU timings: glibc's ``MALLOC_*`` settings change them (large tensors are mmap'ed and page-faulted afresh each
time); the harness records ``OMP_*``/``MKL_*``/``MALLOC_*`` in each record's ``env``. One record per (model,
implementation, configuration). The deduplication study of HongTu §5-6 is ``python -m benchmarks offload_dedup``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from benchmarks.harness import Case, Row, latest_session, split_list
from benchmarks.harness.graphs import device_name, load_graph
from benchmarks.harness.records import fmt, provenance, session_of, table
from benchmarks.inmemory_vs_pyg import SPARSE_ADJ, end_peak, free_memory, make_pyg, start_peak, sync
from gnnscale.engines import InMemoryEngine, OffloadEngine, select_engine
from gnnscale.engines.core.devices import resolve_device
from gnnscale.errors import GnnscaleError
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.train import TrainConfig
from gnnscale.units import parse_budget

TITLE = "Offload engine (HongTu) against the in-memory engine and PyG"
ROUNDS = 3  # every configuration of a model is a case; the tables show each one's median round
Step = Callable[[int], dict[str, Any]]  # one training epoch -> {"loss": ..., engine counters}
DEFAULT_DATASET = "csbm:nodes=100000,avg_degree=10,features=100"
QUICK_DATASET = "csbm:nodes=3000,avg_degree=10,features=32"
PYG_VARIANTS = {"edge_index": "pyg", "sparse": "pyg-sparse"}
PRODUCTS_LIKE = "csbm:nodes=2449029,avg_degree=50,features=100,classes=47,communities=256,p_intra=0.9"  # issue #11
GB = 1e9
CONV = {"gcn": "GCNConv", "sage": "SAGEConv", "gat": "GATConv"}
CONFIG_KEYS = ("impl", "chunks_requested", "budget_spec", "dedup_requested", "chunker_requested")
"""What makes two records of one run the same configuration (with the model and hidden width)."""


# ------------------------------------------------------------------------------------------------ implementations
def make_engine(g: Graph, cfg: TrainConfig, dev: torch.device, count_epochs: int | None = None
                ) -> tuple[Step, dict[str, Any]]:
    """An engine of ``cfg.engine`` (after the selector's checks: a refusal raises EngineError with the reasons).

    ``count_epochs``: on CPU, run the offload engine's live-bytes counter (its ``peak_device_bytes``) only in
    epochs ``<= count_epochs``; it puts Python code on every tensor operation, which the timed epochs should not
    pay. ``None``: leave it on.
    """
    engine_cls, _ = select_engine(g, cfg, dev)
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    engine = engine_cls(g, model, cfg, dev)
    info: dict[str, Any] = {"engine_detail": engine.describe()}
    counter = getattr(engine, "counter", None)
    if isinstance(engine, OffloadEngine):
        plan = engine.plan
        st = plan.partition.stats(g)
        info.update({"chunks": engine.num_chunks // engine.partitions, "total_chunks": engine.num_chunks,
                     "budget_bytes": plan.budget, "plan_estimate_bytes": plan.estimate,
                     "planner_searched": {str(k): v for k, v in plan.searched.items()},
                     "alpha": st["alpha"], "chunk_rows_max": st["chunk_rows_max"],
                     "chunk_edges_max": st["chunk_edges_max"],
                     "gather_method": engine.workers[0].io.gather, "workers": len(engine.workers),
                     "counter_in_timed_epochs": counter is not None and count_epochs is None,
                     "dedup": plan.dedup, "chunker": plan.partition.chunker, "reorganized": plan.reorganized,
                     "volume": asdict(plan.volume), "plan_costs": dict(plan.costs)})
    else:
        assert isinstance(engine, InMemoryEngine)

    def step(epoch: int) -> dict[str, Any]:
        if counter is not None:
            engine.counter = counter if count_epochs is None or epoch <= count_epochs else None
        return engine.train_epoch(epoch)

    return step, info


def make_pyg_step(g: Graph, cfg: TrainConfig, dev: torch.device, sparse: bool) -> tuple[Step, dict[str, Any]]:
    loss_step = make_pyg(g, cfg, dev, sparse=sparse)
    what = f"adj_t ({SPARSE_ADJ})" if sparse else "edge_index"
    return (lambda epoch: {"loss": loss_step(epoch)}), {"engine_detail": f"PyG full-graph model on {what}"}


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc) or "can't allocate memory" in str(exc))


def bench(impl: str, make: Callable[[], tuple[Step, dict[str, Any]]], dev: torch.device, warmup: int,
          epochs: int, keep_stats: bool = False) -> dict[str, Any]:
    """Time ``warmup + epochs`` epochs of one implementation; ``status`` is ok, oom or refused (with ``reason``).

    ``keep_stats``: also return every epoch's record as ``epoch_stats`` (for callers adding their own columns).
    """
    free_memory(dev)
    torch.manual_seed(0)
    np.random.seed(0)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rss_kind, rss_base = start_peak(torch.device("cpu"))  # host peak RSS, on every device
    step: Step | None = None
    times: list[float] = []
    stats: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    try:
        step, info = make()
        for e in range(1, warmup + epochs + 1):
            sync(dev)
            t0 = time.perf_counter()
            s = step(e)
            sync(dev)
            times.append(time.perf_counter() - t0)
            stats.append(s)
        cuda_peak = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
        rss_peak = end_peak(torch.device("cpu"), rss_kind, rss_base)
    except GnnscaleError as exc:
        print(f"  note: {impl}: refused: {exc}", file=sys.stderr)
        return {"impl": impl, "status": "refused", "reason": f"{type(exc).__name__}: {exc}", **info}
    except Exception as exc:
        if not _is_oom(exc):
            raise
        print(f"  note: {impl}: out of memory: {exc}", file=sys.stderr)
        return {"impl": impl, "status": "oom", "reason": f"{type(exc).__name__}: {str(exc)[:500]}", **info}
    finally:
        del step
        free_memory(dev)
    timed, last = times[warmup:], stats[-1]
    median = statistics.median(timed)
    if dev.type == "cuda":
        peak, kind = cuda_peak, "cuda max_memory_allocated"
    elif any("peak_device_bytes" in s for s in stats):
        peak = max(int(s["peak_device_bytes"]) for s in stats if "peak_device_bytes" in s)
        kind = "offload engine's live device-side bytes (LiveBytesCounter)"
    else:
        peak, kind = rss_peak, rss_kind
    h2d = last.get("h2d_bytes")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # > cores: timings are contended
    rows = {k: int(v) for k, v in last.items() if k.startswith("rows_") or k == "layer_passes"
            or (k.startswith("h2d_") and k.endswith("_bytes") and k != "h2d_bytes")}  # h2d_row_bytes etc.
    return {"impl": impl, "status": "ok", "median_epoch_s": median, "epoch_times_s": timed,
            "warmup_times_s": times[:warmup], "h2d_bytes": h2d, "d2h_bytes": last.get("d2h_bytes"),
            "h2d_GBps": None if h2d is None else h2d / median / GB, "peak_bytes": peak, "peak_kind": kind,
            "host_peak_rss_bytes": rss_peak, "final_loss": float(last["loss"]),
            "losses": [float(s["loss"]) for s in stats], "loadavg_1m": load, **rows, **info,
            **({"epoch_stats": stats} if keep_stats else {})}


def row_volumes(r: dict[str, Any], num_nodes: int) -> dict[str, float | None]:
    """Rows per layer pass over ``|V|``: loaded host -> device (``rows_h2d``), ``V_ori``, and their ratio."""
    passes = r.get("layer_passes")
    if not passes or "rows_h2d" not in r or "rows_ori" not in r:
        return {"rows_h2d_per_pass_V": None, "rows_ori_per_pass_V": None, "h2d_over_ori": None}
    n = max(num_nodes, 1)
    return {"rows_h2d_per_pass_V": r["rows_h2d"] / passes / n, "rows_ori_per_pass_V": r["rows_ori"] / passes / n,
            "h2d_over_ori": r["rows_h2d"] / r["rows_ori"] if r["rows_ori"] else None}


# ------------------------------------------------------------------------------------------------ cases
DEFAULTS: dict[str, Any] = {
    "device": "auto", "dataset": DEFAULT_DATASET, "models": "gcn", "layers": 2, "hidden": 256, "heads": 4,
    "dropout": 0.5, "chunks": "1,4,16,64", "gpu_memory": "", "dedup": "full", "chunker": "range",
    "reorganize": "auto", "partitions": 1, "partition_method": "metis", "gather": "auto", "warmup": 1, "epochs": 5,
    "seed": 0, "pyg": "edge_index,sparse"}
QUICK: dict[str, Any] = {"dataset": QUICK_DATASET, "hidden": 16, "chunks": "4", "epochs": 2, "pyg": "sparse"}
"""--quick: these values for the flags left at their defaults (3 cases of a few seconds each)."""
MODEL_KEYS = ("model", "layers", "hidden", "heads", "dropout", "partitions", "partition_method", "reorganize",
              "warmup", "epochs", "seed")


def add_flags(ap: argparse.ArgumentParser, d: dict[str, Any]) -> None:
    """The offload benchmark's flags with the defaults ``d`` (offload_dedup has its own)."""
    ap.add_argument("--device", default=d["device"], help="auto (cuda if available), cpu, cuda or cuda:N")
    ap.add_argument("--dataset", default=d["dataset"], metavar="SPEC",
                    help=f"dataset spec (default {d['dataset']}; ogbn-products-sized: {PRODUCTS_LIKE})")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--models", default=d["models"], help="comma-separated subset of gcn,sage,gat")
    ap.add_argument("--layers", type=int, default=d["layers"])
    ap.add_argument("--hidden", type=int, default=d["hidden"])
    ap.add_argument("--heads", type=int, default=d["heads"], help="GAT hidden heads")
    ap.add_argument("--dropout", type=float, default=d["dropout"])
    ap.add_argument("--chunks", default=d["chunks"], help="chunk counts per partition to sweep ('' for none)")
    ap.add_argument("--gpu-memory", default=d["gpu_memory"], metavar="BUDGETS",
                    help="memory budgets to sweep with planner-chosen chunks: GiB (6) or sizes (64MB); '' for none")
    ap.add_argument("--dedup", default=d["dedup"], metavar="MODES",
                    help="offload communication dedup modes to sweep: comma list of none, reuse, full")
    ap.add_argument("--chunker", default=d["chunker"], metavar="CHUNKERS",
                    help="offload chunkers to sweep: comma list of range, metis, auto")
    ap.add_argument("--reorganize", default=d["reorganize"], help="chunk reorganisation (Algorithm 4): auto, on, off")
    ap.add_argument("--partitions", type=int, default=d["partitions"])
    ap.add_argument("--partition-method", default=d["partition_method"], help="metis, random or range")
    ap.add_argument("--gather", default=d["gather"], help="auto, index_select or uva (offload row gathers)")
    ap.add_argument("--warmup", type=int, default=d["warmup"], help="untimed epochs before the timed ones")
    ap.add_argument("--epochs", type=int, default=d["epochs"], help="timed epochs (the median is reported)")
    ap.add_argument("--seed", type=int, default=d["seed"])
    ap.add_argument("--skip-inmemory", action="store_true", help="no in-memory engine baseline")
    ap.add_argument("--skip-pyg", action="store_true", help="no PyG baseline")
    ap.add_argument("--pyg", default=d["pyg"], metavar="VARIANTS",
                    help="PyG baselines: edge_index (impl 'pyg') and/or sparse (adj_t, impl 'pyg-sparse')")
    ap.add_argument("--count-timed", action="store_true",
                    help="CPU: keep the offload engine's live-bytes counter on in the timed epochs too")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_flags(ap, DEFAULTS)


def settings(args: argparse.Namespace, defaults: dict[str, Any], quick: dict[str, Any]) -> dict[str, Any]:
    """The flags' values, with ``quick``'s for those left at ``defaults`` under --quick; checked."""
    s = {k: quick[k] if args.quick and k in quick and getattr(args, k) == defaults[k] else getattr(args, k)
         for k in defaults}
    s.update(root=args.root, skip_inmemory=args.skip_inmemory, count_timed=args.count_timed,
             pyg=[] if args.skip_pyg else split_list(s["pyg"]))
    try:
        dedups, chunkers = split_list(s["dedup"]), split_list(s["chunker"])
        if not dedups or not chunkers:
            raise ValueError("--dedup and --chunker need at least one value each")
        for dd in dedups:
            for ch in chunkers:
                TrainConfig(dedup=dd, chunker=ch, reorganize=s["reorganize"])
        if s["warmup"] < 0 or s["epochs"] < 1:
            raise ValueError("--warmup must be >= 0 and --epochs >= 1")
        if any(v not in PYG_VARIANTS for v in s["pyg"]):
            raise ValueError(f"--pyg: choose from {', '.join(PYG_VARIANTS)}, got {args.pyg!r}")
        for b in split_list(s["gpu_memory"]):
            parse_budget(b)
        for m in split_list(s["models"]):
            TrainConfig(model=m, layers=s["layers"], hidden=s["hidden"], partitions=s["partitions"])
    except (GnnscaleError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    return {**s, "dedup": dedups, "chunker": chunkers}


def model_cases(s: dict[str, Any], chunks: list[int], prefix: str = "") -> list[Case]:
    """Per model, one group: an offload case per (chunks or budget, dedup, chunker), in-memory, the PyG variants."""
    common = {k: s[k] for k in ("dataset", "root", "device", "layers", "hidden", "heads", "dropout", "partitions",
                                "partition_method", "gather", "reorganize", "warmup", "epochs", "seed",
                                "count_timed")}
    none = {"chunks_requested": None, "budget_spec": None, "dedup_requested": None, "chunker_requested": None}
    out = []
    for model in split_list(s["models"]):
        configs = [*(({"chunks_requested": c, "budget_spec": None}, f"chunks {c}") for c in chunks),
                   *(({"chunks_requested": None, "budget_spec": b}, b) for b in split_list(s["gpu_memory"]))]
        impls = [({"impl": "offload", **cfg, "dedup_requested": dd, "chunker_requested": ch},
                  f"offload {what} {dd}/{ch}") for cfg, what in configs for dd in s["dedup"] for ch in s["chunker"]]
        impls += [] if s["skip_inmemory"] else [({"impl": "inmemory", **none}, "inmemory")]
        impls += [({"impl": PYG_VARIANTS[v], **none}, PYG_VARIANTS[v]) for v in s["pyg"]]
        group = f"{prefix}{model}"
        out += [Case(f"{group} {label}", {**common, "model": model, **p}, group=group) for p, label in impls]
    return out


def cases(args: argparse.Namespace) -> list[Case]:
    s = settings(args, DEFAULTS, QUICK)
    return model_cases(s, [int(c) for c in split_list(s["chunks"])])


# ------------------------------------------------------------------------------------------------ one case
def _maker(g: Graph, params: dict[str, Any], dev: torch.device) -> Callable[[], tuple[Step, dict[str, Any]]]:
    base = TrainConfig(**{k: params[k] for k in MODEL_KEYS if k not in ("warmup",)}, gather=params["gather"])
    impl = params["impl"]
    if impl == "inmemory":
        cfg = TrainConfig(**{**asdict(base), "engine": "inmemory"})
        return lambda: make_engine(g, cfg, dev)
    if impl != "offload":
        return lambda: make_pyg_step(g, base, dev, impl == "pyg-sparse")
    fields: dict[str, Any] = ({"chunks": params["chunks_requested"]} if params["budget_spec"] is None else
                              {"chunks": None, "memory_budget": parse_budget(params["budget_spec"])})
    cfg = TrainConfig(**{**asdict(base), "engine": "offload", **fields, "dedup": params["dedup_requested"],
                         "chunker": params["chunker_requested"]})
    count = None if params["count_timed"] or params["warmup"] == 0 else params["warmup"]
    return lambda: make_engine(g, cfg, dev, count)


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One implementation and configuration: ``bench``'s record with the graph's and the configuration's fields."""
    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))  # partition plans
    dev = resolve_device(params["device"])
    g, load_s = load_graph(params["dataset"], params["root"], params["seed"])
    r = bench(params["impl"], _maker(g, params, dev), dev, params["warmup"], params["epochs"])
    if r["status"] == "ok" and params["impl"] == "offload":
        r.update(row_volumes(r, g.num_nodes))
    ds = {"dataset": g.meta.get("spec", params["dataset"]), "graph": g.name, "nodes": g.num_nodes,
          "edges": g.num_edges, "avg_in_degree": g.num_edges / max(g.num_nodes, 1), "features": g.num_features,
          "classes": g.num_classes, "load_s": load_s}
    mine = {k: params[k] for k in (*MODEL_KEYS, *CONFIG_KEYS[1:])}
    return {"device": str(dev), "device_name": device_name(str(dev)), **ds, **mine, **r, "engine": params["impl"]}


def describe(r: dict[str, Any]) -> str:
    if r.get("status") != "ok":
        return f"{r.get('impl')}: {r.get('status')}: {str(r.get('reason'))[:100]}"
    return f"{r['impl']}: median {r['median_epoch_s']:.3f} s, loss {r['final_loss']:.4f}"


# ------------------------------------------------------------------------------------------------ rendering
def _pick(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's record of a run: over the harness's rounds, the round with the median epoch time (the
    lower middle of an even count); records from before the harness (no ``round``), the last."""
    ok = sorted((r for r in recs if "round" in r and r.get("status") == "ok"), key=lambda r: r["median_epoch_s"])
    return ok[(len(ok) - 1) // 2] if ok else recs[-1]


def runs(records: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> list[list[dict[str, Any]]]:
    """The records grouped by (run, ``key``) in first-seen order; in each, one record per configuration
    (:func:`_pick`)."""
    groups: dict[Any, dict[tuple[Any, ...], list[dict[str, Any]]]] = {}
    for r in records:
        if r.get("impl") is not None:
            config = tuple(r.get(k) for k in CONFIG_KEYS)
            groups.setdefault((session_of(r), key(r)), {}).setdefault(config, []).append(r)
    return [[_pick(recs) for recs in g.values()] for g in groups.values()]


def ratios(rows: list[dict[str, Any]]) -> tuple[dict[int, tuple[float | None, float | None]], str | None]:
    """``{id(row): (epoch time / in-memory's, / the faster PyG variant's)}`` and that variant's name."""
    ok = [r for r in rows if r.get("status") == "ok"]
    inmem = next((r for r in ok if r["impl"] == "inmemory"), None)
    pyg = min((r for r in ok if r["impl"].startswith("pyg")), key=lambda r: r["median_epoch_s"], default=None)
    out = {id(r): tuple(None if b is None else r["median_epoch_s"] / b["median_epoch_s"] for b in (inmem, pyg))
           for r in ok}
    return out, None if pyg is None else pyg["impl"]  # type: ignore[return-value]


def impl_label(r: dict[str, Any]) -> str:
    impl, conv = r["impl"], CONV.get(r.get("model", ""), r.get("model", ""))
    if impl == "offload":
        dd, ch = r.get("dedup_requested"), r.get("chunker_requested")
        return "offload" if dd in (None, "full") and ch in (None, "range") else f"offload ({dd}, {ch})"
    return {"inmemory": "gnnscale inmemory", "pyg": f"PyG `{conv}`, edge_index",
            "pyg-sparse": f"PyG `{conv}`, sparse `adj_t`"}.get(impl, impl)


def mib(n: int | None) -> str:
    return fmt(None if n is None else n / 2**20, ".0f", "")


def device_peak(r: dict[str, Any]) -> int | None:
    """The device-side peak: CUDA's, or offload's live count on CPU (not the RSS of in-memory and PyG there)."""
    return None if "RSS" in str(r.get("peak_kind")) else r.get("peak_bytes")


def failure(r: dict[str, Any]) -> str | None:
    if r.get("status") == "ok":
        return None
    why = r.get("reason") if r.get("status") else r.get("error")
    return f"{r.get('status') or 'failed'}: {str(why)[:80]}"


def _row(r: dict[str, Any], rat: tuple[float | None, float | None] | None) -> list[str]:
    off = r["impl"] == "offload"
    head = [impl_label(r), str(r.get("chunks", r.get("chunks_requested")) or "") if off else "",
            ("(forced)" if r.get("budget_spec") is None else r["budget_spec"]) if off else "",
            fmt(r.get("alpha"), ".2f", "")]
    if failure(r):
        return [*head, failure(r) or "", *[""] * 7]
    h2d = r.get("h2d_bytes")
    return [*head, f"{r['median_epoch_s']:.3f}", fmt(None if h2d is None else h2d / GB, ".2f", ""),
            fmt(r.get("h2d_GBps"), ".2f", ""), mib(device_peak(r)), mib(r.get("plan_estimate_bytes")),
            mib(r.get("host_peak_rss_bytes")), *(fmt(x, ".2f", "") for x in (rat or (None, None)))]


def caption(rows: list[dict[str, Any]]) -> str:
    """What one table is: model, width, graph, device, commit and date of its run."""
    r = rows[0]
    heads = f" ({r.get('heads')} heads)" if r.get("model") == "gat" else ""
    nodes = f" ({r['nodes']:,} nodes, {r['edges']:,} edges)" if r.get("nodes") else ""
    return (f"{str(r.get('model')).upper()}, hidden {r.get('hidden')}{heads}, `{r.get('dataset')}`{nodes} on "
            f"{r.get('device_name')}: commit {r.get('gnnscale_rev')}, {str(r.get('date'))[:10]}, "
            f"{r.get('warmup')} warm-up, median of {r.get('epochs')} epochs")


HEADER = ["implementation", "chunks", "budget", "alpha", "median epoch (s)", "H2D (GB)", "H2D GB/s",
          "device peak (MiB)", "estimate (MiB)", "host RSS (MiB)", "/ inmemory", "/ PyG"]


def render(records: list[dict[str, Any]]) -> str:
    groups = runs(records, lambda r: (r.get("model"), r.get("hidden")))
    parts = [provenance([r for g in groups for r in g]),
             "One table per run and model, in the order they ran (a run repeated under one command and commit: "
             "the last record of each configuration; a run of several rounds: each configuration's round with the "
             "median epoch time). Ratios: epoch time over in-memory's and the faster PyG "
             "variant's in the same run (< 1: offload faster); device peak: CUDA's, or on CPU offload's own count "
             "of live device-side bytes; host RSS: the increase of the process's peak RSS."]
    for rows in groups:
        rat, _ = ratios(rows)
        parts.append(f"{caption(rows)}:\n\n{table(HEADER, [_row(r, rat.get(id(r))) for r in rows])}")
    return "\n\n".join(parts) + "\n"


def headline(records: list[dict[str, Any]]) -> list[Row]:
    """Offload against in-memory, per device type (the CPU, an accelerator): the first offload configuration of
    the latest run's first model on it."""
    out = []
    for kind in dict.fromkeys(str(r.get("device", "cpu")).split(":")[0] for r in records if r.get("impl")):
        recs = latest_session(records, lambda r, k=kind: r.get("impl") is not None
                              and str(r.get("device", "cpu")).split(":")[0] == k)
        rows = runs(recs, lambda r: (r.get("model"), r.get("hidden")))[:1]
        if not rows:
            continue
        rat, _ = ratios(rows[0])
        off = next((r for r in rows[0] if r["impl"] == "offload" and id(r) in rat), None)
        inmem = next((r for r in rows[0] if r["impl"] == "inmemory"), None)
        if off is None or rat[id(off)][0] is None or inmem is None:
            continue
        what = f"chunks {off.get('chunks')}" if off.get("budget_spec") is None else f"budget {off['budget_spec']}"
        figure = (f"{rat[id(off)][0]:.2f}x in-memory's epoch ({off['median_epoch_s']:.3f} s against "
                  f"{inmem['median_epoch_s']:.3f} s), {fmt((off.get('h2d_bytes') or 0) / GB, '.2f')} GB "
                  f"host->device per epoch: {str(off.get('model')).upper()} hidden {off.get('hidden')}, offload "
                  f"{what}, `{off.get('dataset')}`")
        out.append(Row(f"offload against in-memory, {off.get('device_name')}", figure, (off, inmem)))
    return out
