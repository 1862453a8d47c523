"""The offload engine (HongTu) against the in-memory engine and PyG: epoch time vs chunk count, memory budget,
deduplication mode and chunker.

    .venv/bin/python benchmarks/offload.py --device cpu
    .venv/bin/python benchmarks/offload.py --device cpu --threads 1 --dataset kronecker:scale=16,edgefactor=16 \\
        --models gcn --layers 2 --hidden 64 --partitions 4 --chunks 8 --dedup none,reuse,full \\
        --chunker range,metis --epochs 3 --warmup 1
    .venv/bin/python benchmarks/offload.py --dataset csbm:nodes=100000,avg_degree=10,features=100 \\
        --models gcn,gat --hidden 64 --chunks 1,4,16,64 --gpu-memory 64MB,256MB --epochs 4 --warmup 1
    PYTHONPATH=. python3 benchmarks/offload.py --device cuda \\
        --dataset csbm:nodes=2450000,avg_degree=50,features=100,classes=47 --models gcn --hidden 256 \\
        --chunks '' --gpu-memory 6

One graph (``--dataset``, any :func:`gnnscale.load_dataset` spec) and, per model, these implementations on one
device in one run:

* ``offload`` once per ``--chunks`` value (chunks per partition forced; the budget is the device's free memory),
  then once per ``--gpu-memory`` budget (GiB when a plain number, else a size such as ``64MB``; the planner picks
  the fewest chunks whose estimated footprint fits); each of these once per ``--dedup`` mode (comma list of
  ``none``, ``reuse``, ``full``; default ``full``) and per ``--chunker`` (comma list of ``range``, ``metis``,
  ``auto``; default ``range``), with one ``--reorganize`` setting (``auto``, ``on`` or ``off``) for all
  (``TrainConfig.dedup``/``chunker``/``reorganize``, HongTu §5-6);
* ``inmemory``, the reference engine, unless ``--skip-inmemory``;
* ``pyg`` / ``pyg-sparse`` (``--pyg edge_index,sparse``): the plain PyG model of ``inmemory_vs_pyg.py``
  (``GCNConv(cached=True)``, ``SAGEConv(aggr="mean")`` or ``GATConv``) on ``edge_index`` / on the ``adj_t`` of
  ``ToSparseTensor``, unless ``--skip-pyg``; ratios are taken against the faster of the two that ran.

Each runs ``--warmup`` untimed, then ``--epochs`` timed training epochs (one forward, backward and optimiser step
over the whole graph, no evaluation); the table gives the median epoch time, the achieved host -> device rate
``h2d_bytes / median epoch time`` (GB/s, 10^9; the engine's own byte count of one epoch), peak memory and the
ratios ``offload / inmemory`` and ``offload / pyg`` (< 1: offload is faster). A configuration that cannot run
(CUDA out of memory, the planner or engine selector refusing it) is recorded with its reason instead of aborting.

Communication volume (offload rows): ``dedup`` and ``chunker`` are those the plan used (``auto`` resolved),
``reorganized`` whether Algorithm 4 reordered the chunks; ``h2d/|V|`` is the rows actually loaded host -> device per
layer pass over the vertex count (``rows_h2d / layer_passes / |V|``, the engine's own count), ``ori/|V|`` the same
for HongTu's ``V_ori`` (every chunk loading all its rows, what ``--dedup none`` moves) and ``h2d/ori`` their ratio
(< 1: rows saved by reuse / inter-partition sharing). Every line also keeps the epoch's other row counters
(``rows_p2p``, ``rows_reused``, ``rows_d2d`` and the ``_bytes`` variants) and the plan's ``volume``.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` for every implementation. On CPU the offload engine's
own count of bytes live in its "device-side" buffers (``LiveBytesCounter``), while in-memory and PyG report the
increase of the process's peak RSS; the two are not comparable, so ``host_peak_rss_bytes`` (the RSS measure for
every implementation, host buffers included) is recorded as well. The counter runs Python on every tensor op
(+40% epoch time at 64 chunks), so it is on in the warm-up epochs only (``--count-timed``: always).

CPU timings: ``--threads 1`` keeps them stable on a shared machine (two OpenMP threads competing with another busy
process can be 100x slower); glibc's ``MALLOC_*`` settings change them too (large tensors are mmap'ed and
page-faulted afresh each time). ``OMP_*``/``MKL_*``/``MALLOC_*`` variables are recorded in each line's ``env``.

One JSON line per (model, implementation, configuration) is appended to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch_geometric

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.offload
    from inmemory_vs_pyg import SPARSE_ADJ, end_peak, free_memory, make_pyg, start_peak, sync
    from inmemory_vs_pyg import environment as base_environment
except ImportError:  # pragma: no cover
    from benchmarks.inmemory_vs_pyg import SPARSE_ADJ, end_peak, free_memory, make_pyg, start_peak, sync
    from benchmarks.inmemory_vs_pyg import environment as base_environment

from gnnscale.engines import InMemoryEngine, OffloadEngine, select_engine
from gnnscale.engines.devices import resolve_device
from gnnscale.errors import GnnscaleError
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.train import TrainConfig, check_trainable
from gnnscale.units import parse_budget

Step = Callable[[int], dict[str, Any]]  # one training epoch -> {"loss": ..., engine counters}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "offload.jsonl"
DEFAULT_DATASET = "csbm:nodes=100000,avg_degree=10,features=100"
PYG_VARIANTS = {"edge_index": "pyg", "sparse": "pyg-sparse"}
PRODUCTS_LIKE = "csbm:nodes=2449029,avg_degree=50,features=100,classes=47,communities=256,p_intra=0.9"  # issue #11
GB = 1e9
_ENV_PREFIXES = ("OMP_", "MKL_", "MALLOC_", "CUDA_VISIBLE", "PYTORCH_CUDA_ALLOC")  # recorded: they move timings


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


# ------------------------------------------------------------------------------------------------ environment
def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def environment(dev: torch.device) -> dict[str, Any]:
    """What the numbers depend on: ``inmemory_vs_pyg.environment`` plus the CPU model, command and env vars."""
    env = base_environment(dev)
    if dev.type == "cpu":
        env["device_name"] = f"{cpu_model()} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    return {**env, "host_cpu": f"{cpu_model()} ({os.cpu_count()} cores)",
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "env": {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}}


def _list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _mib(b: int | None) -> float | None:
    return None if b is None else b / 2**20


def _label(r: dict[str, Any]) -> str:
    """An offload configuration: budget or forced chunks, dedup mode and chunker as requested."""
    what = r.get("budget_spec") or f"chunks {r.get('chunks_requested')}"
    return f"{what}, dedup {r.get('dedup_requested')}, chunker {r.get('chunker_requested')}"


def print_table(rows: list[dict[str, Any]], pyg_ref: str | None) -> None:
    print(f"  {'impl':<11}{'chunks':>7}{'budget':>9}{'dedup':>7}{'chunker':>8}{'reorg':>6}{'median (s)':>11}"
          f"{'h2d/|V|':>8}{'ori/|V|':>8}{'h2d/ori':>8}{'H2D GB/ep':>10}{'H2D GB/s':>9}{'peak MiB':>9}"
          f"{'RSS MiB':>8}{'/inmem':>7}{'/pyg':>6}{'loss':>8}")
    for r in rows:
        budget = "-" if r.get("budget_spec") is None else r["budget_spec"]
        chunks = r.get("chunks", r.get("chunks_requested"))
        offload = r["impl"] == "offload"
        dedup = r.get("dedup", r.get("dedup_requested")) if offload else "-"
        chunker = r.get("chunker", r.get("chunker_requested")) if offload else "-"
        reorg = ("yes" if r["reorganized"] else "no") if "reorganized" in r else "-"
        head = (f"  {r['impl']:<11}{_fmt(chunks, 'd') if chunks is not None else '-':>7}{budget:>9}{dedup:>7}"
                f"{chunker:>8}{reorg:>6}")
        if r["status"] != "ok":
            print(f"{head}  {r['status']}: {r['reason'][:110]}")
            continue
        h2d = None if r["h2d_bytes"] is None else r["h2d_bytes"] / GB
        print(f"{head}{r['median_epoch_s']:>11.3f}{_fmt(r.get('rows_h2d_per_pass_V'), '.3f'):>8}"
              f"{_fmt(r.get('rows_ori_per_pass_V'), '.3f'):>8}{_fmt(r.get('h2d_over_ori'), '.3f'):>8}"
              f"{_fmt(h2d, '.3f'):>10}{_fmt(r['h2d_GBps'], '.2f'):>9}"
              f"{_fmt(_mib(r['peak_bytes']), '.0f'):>9}{_fmt(_mib(r['host_peak_rss_bytes']), '.0f'):>8}"
              f"{_fmt(r.get('ratio_vs_inmemory'), '.2f'):>7}{_fmt(r.get('ratio_vs_pyg'), '.2f'):>6}"
              f"{r['final_loss']:>8.4f}")
    kinds = sorted({r["peak_kind"] for r in rows if r["status"] == "ok"})
    print(f"  peak: {'; '.join(kinds)}. RSS: increase of the host's peak RSS. /inmem, /pyg: epoch time over "
          f"inmemory's and {pyg_ref or 'PyG'}'s (< 1: faster). h2d/|V|, ori/|V|: rows loaded host -> device, and "
          f"HongTu's V_ori, per layer pass over |V|")
    details = [r for r in rows if r["impl"] == "offload" and r.get("engine_detail")]
    for r in details:  # the planner's line, without the plan file's path; alpha: rows gathered per vertex
        alpha = f"; replication alpha {r['alpha']:.2f}" if "alpha" in r else ""
        print(f"    {_label(r)}: {r['engine_detail'].split('; partition plan')[0]}{alpha}")


# ------------------------------------------------------------------------------------------------ main
def append_records(out: Path, records: list[dict[str, Any]]) -> None:
    """Append ``records`` to the JSON Lines file ``out`` (its folder created if needed)."""
    if not records:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    print(f"\nappended {len(records)} records to {out}")


def prepare(args: argparse.Namespace) -> tuple[Graph, float]:
    """Apply ``--threads``, then build and check ``--dataset``: the graph and the seconds it took."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    check_trainable(g)
    return g, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    ap.add_argument("--dataset", default=DEFAULT_DATASET, metavar="SPEC",
                    help=f"dataset spec (default {DEFAULT_DATASET}; ogbn-products-sized: {PRODUCTS_LIKE})")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--models", default="gcn", help="comma-separated subset of gcn,sage,gat")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4, help="GAT hidden heads")
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--chunks", default="1,4,16,64", help="chunk counts per partition to sweep ('' for none)")
    ap.add_argument("--gpu-memory", default="", metavar="BUDGETS",
                    help="memory budgets to sweep with planner-chosen chunks: GiB (6) or sizes (64MB); '' for none")
    ap.add_argument("--dedup", default="full", metavar="MODES",
                    help="offload communication dedup modes to sweep: comma list of none, reuse, full (default full)")
    ap.add_argument("--chunker", default="range", metavar="CHUNKERS",
                    help="offload chunkers to sweep: comma list of range, metis, auto (default range)")
    ap.add_argument("--reorganize", default="auto", help="offload chunk reorganisation (Algorithm 4): auto, on, off")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--partition-method", default="metis", help="metis, random or range (level-1 partitions)")
    ap.add_argument("--gather", default="auto", help="auto, index_select or uva (offload row gathers)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed epochs before the timed ones")
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs (the median is reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-inmemory", action="store_true", help="no in-memory engine baseline")
    ap.add_argument("--skip-pyg", action="store_true", help="no PyG baseline")
    ap.add_argument("--pyg", default="edge_index,sparse", metavar="VARIANTS",
                    help="PyG baselines: edge_index (message passing over edge_index, impl 'pyg') and/or sparse "
                         "(adj_t from ToSparseTensor, impl 'pyg-sparse'); ratios use the fastest one that ran")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--count-timed", action="store_true",
                    help="CPU: keep the offload engine's live-bytes counter on in the timed epochs too (by default "
                         "it runs in the warmup epochs only, or in every epoch when --warmup is 0)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    args = ap.parse_args(argv)

    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))  # partition plans
    try:
        dev = resolve_device(args.device)
        chunk_list = [int(c) for c in _list(args.chunks)]
        budgets = [(b, parse_budget(b)) for b in _list(args.gpu_memory)]
        models = _list(args.models)
        dedups, chunkers = _list(args.dedup), _list(args.chunker)
        if not dedups or not chunkers:
            raise ValueError("--dedup and --chunker need at least one value each")
        for d, c in ((d, c) for d in dedups for c in chunkers):  # reject bad values before building the graph
            TrainConfig(dedup=d, chunker=c, reorganize=args.reorganize)
        if args.warmup < 0 or args.epochs < 1:
            raise ValueError("--warmup must be >= 0 and --epochs >= 1")
        pyg_variants = [] if args.skip_pyg else _list(args.pyg)
        if any(v not in PYG_VARIANTS for v in pyg_variants):
            raise ValueError(f"--pyg: choose from {', '.join(PYG_VARIANTS)}, got {args.pyg!r}")
        g, load_s = prepare(args)
    except (GnnscaleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    common = environment(dev)
    ds = {"dataset": g.meta.get("spec", args.dataset), "graph": g.name, "nodes": g.num_nodes,
          "edges": g.num_edges, "avg_in_degree": g.num_edges / max(g.num_nodes, 1), "features": g.num_features,
          "classes": g.num_classes}
    print(f"{ds['dataset']}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {g.num_features} features, "
          f"{g.num_classes} classes (built in {load_s:.1f} s)")
    print(f"device {common['device_name']}; torch {torch.__version__}, PyG {torch_geometric.__version__}, "
          f"gnnscale {common['gnnscale_rev']}; warmup {args.warmup}, median of {args.epochs} timed epochs")
    count_epochs = None if args.count_timed or args.warmup == 0 else args.warmup
    records: list[dict[str, Any]] = []
    for model in models:
        try:
            base = TrainConfig(model=model, layers=args.layers, hidden=args.hidden, heads=args.heads,
                               dropout=args.dropout, epochs=args.epochs, seed=args.seed, partitions=args.partitions,
                               partition_method=args.partition_method, gather=args.gather,
                               reorganize=args.reorganize)
        except GnnscaleError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        case = {**ds, "model": model, "layers": base.layers, "hidden": base.hidden, "heads": base.heads,
                "dropout": base.dropout, "partitions": base.partitions, "partition_method": base.partition_method,
                "reorganize": base.reorganize, "warmup": args.warmup, "epochs": args.epochs, "seed": args.seed}
        plans: list[tuple[str, dict[str, Any], Callable[[], tuple[Step, dict[str, Any]]]]] = []

        configs: list[tuple[dict[str, Any], dict[str, Any]]] = [  # (TrainConfig fields, record fields)
            *(({"chunks": c}, {"chunks_requested": c, "budget_spec": None}) for c in chunk_list),
            *(({"chunks": None, "memory_budget": nbytes}, {"chunks_requested": None, "budget_spec": spec})
              for spec, nbytes in budgets)]
        for fields, extra in configs:
            for d in dedups:
                for ch in chunkers:
                    cfg_o = TrainConfig(**{**asdict(base), "engine": "offload", **fields, "dedup": d, "chunker": ch})
                    plans.append(("offload", {**extra, "dedup_requested": d, "chunker_requested": ch},
                                  lambda cfg=cfg_o: make_engine(g, cfg, dev, count_epochs)))
        if not args.skip_inmemory:
            cfg_i = TrainConfig(**{**asdict(base), "engine": "inmemory"})
            plans.append(("inmemory", {}, lambda cfg=cfg_i: make_engine(g, cfg, dev)))
        for variant in pyg_variants:
            sparse = variant == "sparse"
            plans.append((PYG_VARIANTS[variant], {}, lambda cfg=base, sp=sparse: make_pyg_step(g, cfg, dev, sp)))

        print(f"\n{model}: layers {base.layers}, hidden {base.hidden}, dropout {base.dropout}"
              + (f", heads {base.heads}" if model == "gat" else ""))
        rows = []
        for impl, extra, make in plans:
            label = f"{impl} ({_label(extra)})" if impl == "offload" else impl
            print(f"  running {label} ...", file=sys.stderr, flush=True)
            r = {**extra, **bench(impl, make, dev, args.warmup, args.epochs)}
            if r["status"] == "ok" and impl == "offload":
                r.update(row_volumes(r, g.num_nodes))
            rows.append(r)
            done = f"median {r['median_epoch_s']:.3f} s" if r["status"] == "ok" else r["status"]
            print(f"  done {label}: {done}", file=sys.stderr, flush=True)  # kept in a log if the run is cut off
        ok = [r for r in rows if r["status"] == "ok"]
        ref = {"inmemory": next((r for r in ok if r["impl"] == "inmemory"), None),
               "pyg": min((r for r in ok if r["impl"].startswith("pyg")), key=lambda r: r["median_epoch_s"],
                          default=None)}
        for r in ok:
            for name, base_row in ref.items():
                if base_row is not None:
                    r[f"ratio_vs_{name}"] = r["median_epoch_s"] / base_row["median_epoch_s"]
        pyg_ref = None if ref["pyg"] is None else ref["pyg"]["impl"]
        for r in rows:
            records.append({**common, **case, **r, "engine": r["impl"], "pyg_baseline": pyg_ref})
        print_table(rows, pyg_ref)
    if not args.no_save:
        append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
