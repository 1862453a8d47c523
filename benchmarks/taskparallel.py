"""The task-parallel engine (NeutronTask) against the offload engine (HongTu, data parallel over partitions) and
the in-memory engine: per-device peak memory and epoch time on one graph, and neighbour replication factors.

    .venv/bin/python benchmarks/taskparallel.py --device cpu --threads 1 --devices 4 --repeats 5
    .venv/bin/python benchmarks/taskparallel.py --device cpu --threads 1 --devices 4 --repeats 5 --dataset csbm
    PYTHONPATH=. python3 benchmarks/taskparallel.py --device cuda --devices 4 --repeats 5 \\
        --dataset kronecker:scale=20,edgefactor=16

(the first is issue #13's acceptance case: Kronecker scale 16, 4 devices.) ``--devices N`` runs on N copies of
``--device`` (``cpu`` N times, or ``cuda:0 .. cuda:N-1``); a comma list names them.

**Engines**, on one graph (``--dataset``, any :func:`gnnscale.load_dataset` spec) in one run, every setting not
named here at its default (as a user would run them):

* ``taskparallel``: ``--model`` (decoupled, ``dgcn`` by default), ``--dependency`` (``exact``), the N devices;
  the planner assigns the tasks and picks the subgraphs (``--subgraphs`` forces them);
* ``offload``: ``--dedup none --partitions N`` (``--partitions`` overrides N) on the same N devices: data
  parallelism, each partition gathering its in-neighbours' rows. It declines decoupled models, so it trains the
  closest coupled model, ``--coupled-model`` (``gcn``), with the same layers and hidden width; every record says
  so (``model``, ``note``). The two models are not the same computation: dgcn propagates class-wide rows
  (``g_theta``'s output), gcn aggregates hidden-wide rows;
* ``inmemory``: ``--model`` on one device (the first), the reference.

Each engine is built, then runs ``--warmup`` untimed epochs (default 1) and ``--repeats`` timed ones; the table
gives the mean and min of the timed epochs. Peak memory on CPU is each device's own count of the bytes live in its
"device-side" tensors (:class:`~gnnscale.plan.memory.LiveBytesCounter`, one per device thread, the engines'
``device_peak_bytes``), in the warm-up epochs only: the counter runs Python on every tensor op, so the timed epochs
run without it (``--count-timed``: always; with ``--warmup 0`` every epoch counts). The in-memory engine runs under a
counter of the same kind whose baseline is what it keeps on its device before an epoch (the graph's topology and
features, labels, masks, parameters, Adam's state), so its figure is comparable; ``host_peak_rss_bytes`` (the
increase of the process's peak RSS) is recorded for every engine too. On CUDA the peak is
``torch.cuda.max_memory_allocated`` of the first device only (not run yet: no GPU so far). ``--explain-peaks``
records, per device, the live tensors (shape, dtype) at its peak, largest first.

Ratios are taskparallel over the other engine (< 1: taskparallel is faster / holds less): mean epoch time and the
largest per-device peak. For taskparallel ``p_rows_replication`` is the engine's own count of P-task input rows it
sent from T to P devices in the first epoch over ``|V|`` rows (1.0: no row cached twice; a hybrid P group of g
devices shows the replication inside the group), ``p_rows_replication_per_epoch`` the same for every epoch (the
subgraphs are regrouped each epoch), and ``p_group_replication_per_epoch`` what the planner's assignment predicts
for those epochs (:func:`gnnscale.plan.taskparallel.p_group_parts`: each chunk to the group member of its slot in
its subgraph; with ``--dependency exact`` the two agree).

**Replication factors** (``--parts``, default 2,4,8,16; '' skips): NeutronTask's alpha (Table 2: average copies of a
vertex's row when each of ``n`` data-parallel parts holds its own and its in-neighbours' rows;
:func:`gnnscale.plan.taskparallel.replication_factor`) for ``--method`` parts (:func:`gnnscale.partition.
partition_graph`, METIS by default) of this graph, next to Table 2's values on ogbn-papers100M, and, for
``n`` devices, the taskparallel planner's assignment and the factor of its P group in the first epoch (one P task
per device: 1.0; a hybrid group of g devices: the engine's assignment, :func:`gnnscale.plan.taskparallel.
p_group_parts`), as ``gnnscale partition --engine taskparallel --json`` prints them, with, for reference,
``metis_parts_of_group_replication``: ``--method`` parts of the group size.

One JSON line per engine (``"kind": "engine"``), per part count (``"kind": "replication"``) and one comparison
(``"kind": "comparison"``) is appended to ``--out`` (default benchmarks/results/taskparallel.jsonl) with the
environment (date, device, torch/PyG versions, git revision, command, ``OMP_*``/``MALLOC_*`` variables).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.taskparallel
    from offload import _fmt, _list, append_records, environment, prepare
    from offload import bench as time_epochs
except ImportError:  # pragma: no cover
    from benchmarks.offload import _fmt, _list, append_records, environment, prepare
    from benchmarks.offload import bench as time_epochs

from gnnscale.engines import InMemoryEngine, OffloadEngine, TaskParallelEngine, select_engine
from gnnscale.engines.devices import resolve_device
from gnnscale.errors import GnnscaleError
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.decoupled import DECOUPLED_MODELS
from gnnscale.partition import partition_graph
from gnnscale.plan.memory import LiveBytesCounter, estimate_inmemory_bytes
from gnnscale.plan.taskparallel import p_group_parts, plan_taskparallel, replication_factor
from gnnscale.train import TrainConfig

Step = Callable[[int], dict[str, Any]]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "taskparallel.jsonl"
DEFAULT_DATASET = "kronecker:scale=16,edgefactor=16"
NEUTRONTASK_TABLE2 = {2: 1.25, 4: 1.52, 8: 2.13, 16: 3.02}
"""NeutronTask Table 2: replication factor of data-parallel METIS partitioning on ogbn-papers100M."""
MIB = 2**20


# ------------------------------------------------------------------------------------------------ peak counting
class PeakTensors(LiveBytesCounter):
    """A :class:`LiveBytesCounter` that also remembers the shape and dtype of every tensor it tracks and, at each
    new peak, which tensors were live (``--explain-peaks``)."""

    def __init__(self, baseline: int = 0):
        super().__init__(baseline)
        self.meta: dict[int, tuple[tuple[int, ...], str]] = {}
        self.at_peak: list[tuple[tuple[int, ...], str, int]] = []

    def _track(self, t: Any) -> None:
        if isinstance(t, Tensor) and t.layout == torch.strided and t.device.type != "meta":
            key = t.untyped_storage().data_ptr()
            entry = self.live.get(key)
            if entry is None or entry[0].expired():  # a new storage (not a second view of a live one)
                self.meta[key] = (tuple(t.shape), str(t.dtype).removeprefix("torch."))
        super()._track(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = self.peak
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.peak > before:
            self.at_peak = [(*self.meta.get(k, ((), "?")), b) for k, (ref, b) in self.live.items()
                            if not ref.expired()]
        return out

    def summary(self, top: int = 8) -> list[dict[str, Any]]:
        """The live tensors at the peak grouped by (shape, dtype), largest total first."""
        groups: dict[tuple[tuple[int, ...], str], list[int]] = collections.defaultdict(list)
        for shape, dtype, b in self.at_peak:
            groups[(shape, dtype)].append(b)
        rows: list[dict[str, Any]] = [{"shape": list(s), "dtype": d, "count": len(bs), "bytes": sum(bs)}
                                      for (s, d), bs in groups.items()]
        rows.sort(key=lambda r: -r["bytes"])
        return rows[:top]


def _resident_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (sparse tensors: their components)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, Tensor):
            continue
        if t.layout == torch.sparse_csr:
            parts = [t.crow_indices(), t.col_indices(), t.values()]
        elif t.layout == torch.strided:
            parts = [t]
        else:  # pragma: no cover - no other layout is kept by the engines
            continue
        for p in parts:
            s = p.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def inmemory_resident(engine: InMemoryEngine) -> int:
    """What the in-memory engine keeps on its device between epochs: the whole graph's block (with its cached
    sparse matrices), features, labels, masks, parameters and Adam's state."""
    b = engine.block
    tensors: list[Any] = [b.indptr, b.indices, b.edge_weight, b.src_ids, b.t_indptr, b.t_indices, b.t_weight,
                          *b._cache.values(), engine.x, engine.y, *engine.masks.values(),
                          *engine.model.parameters()]
    for state in engine.optimizer.state.values():
        tensors.extend(v for v in state.values() if isinstance(v, Tensor))
    return _resident_bytes(tensors)


def _counted_units(engine: Any) -> list[Any]:
    """The engine's per-device objects that hold a ``counter`` (task-parallel runners, offload workers)."""
    if isinstance(engine, TaskParallelEngine):
        return list(engine.runners)
    if isinstance(engine, OffloadEngine):
        return [w for w in engine.workers if w.counter is not None] + ([engine] if engine.counter is not None else [])
    return []


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
    units = _counted_units(engine)
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


# ------------------------------------------------------------------------------------------------ output
def _mib_list(bs: list[int] | None) -> str:
    return "-" if not bs else ", ".join(f"{b / MIB:.2f}" for b in bs)


def print_engines(rows: list[dict[str, Any]]) -> None:
    print(f"  {'engine':<13}{'model':<7}{'dev':>4}{'mean (s)':>10}{'min (s)':>9}{'max peak MiB':>13}"
          f"{'est. MiB':>10}{'tp/this time':>13}{'tp/this peak':>13}{'loss':>8}  per-device peak (MiB)")
    for r in rows:
        head = f"  {r['engine']:<13}{r['model']:<7}{len(r.get('devices') or [1]):>4}"
        if r["status"] != "ok":
            print(f"{head}  {r['status']}: {r['reason'][:120]}")
            continue
        est = r.get("plan_estimate_bytes")
        est_max = max(est) if isinstance(est, list) else est
        print(f"{head}{r['mean_epoch_s']:>10.3f}{r['min_epoch_s']:>9.3f}"
              f"{_fmt(None if r['peak_device_bytes'] is None else r['peak_device_bytes'] / MIB, '.2f'):>13}"
              f"{_fmt(None if est_max is None else est_max / MIB, '.2f'):>10}"
              f"{_fmt(r.get('tp_over_this_time'), '.2f'):>13}{_fmt(r.get('tp_over_this_peak'), '.2f'):>13}"
              f"{r['final_loss']:>8.4f}  {_mib_list(r.get('device_peak_bytes'))}")
    for r in rows:
        if r["status"] == "ok" and r.get("engine_detail"):
            print(f"    {r['engine']}: {r['engine_detail'].split('; partition plan')[0]}")
        if r.get("p_rows_replication") is not None:
            per = ", ".join(f"{x:.2f}" for x in r["p_rows_replication_per_epoch"])
            pred = ", ".join(f"{x:.2f}" for x in r["p_group_replication_per_epoch"])
            print(f"      P-task input rows sent T -> P devices per epoch (|V|): {per}; the assignment predicts {pred}")
        if r.get("note"):
            print(f"      note: {r['note']}")
    for r in rows:
        for d, top in enumerate(r.get("peak_tensors") or []):
            base = r["counter_baseline_bytes"][d] / MIB if r.get("counter_baseline_bytes") else 0.0
            what = "; ".join(f"{t['count']}x{t['shape']} {t['dtype']} {t['bytes'] / MIB:.2f}" for t in top[:6])
            print(f"    {r['engine']} device {d} at its peak (MiB): resident before the epoch {base:.2f}; {what}")


def print_replication(rows: list[dict[str, Any]]) -> None:
    print(f"  {'parts n':>7}{'data-parallel alpha':>20}{'Table 2 (papers100M)':>22}  {'taskparallel on n devices':<45}"
          f"{'P group':>8}{'P-group alpha':>14}{'METIS-of-group':>15}")
    for r in rows:
        plan = r.get("taskparallel_error") or f"{r['regime'].split(' (')[0]}, N_t={r['n_t']}, N_p={r['n_p']}"
        print(f"  {r['parts']:>7}{r['data_parallel_replication']:>20.2f}"
              f"{_fmt(r['neutrontask_table2_papers100m'], '.2f'):>22}  {plan[:45]:<45}"
              f"{_fmt(r.get('p_group_size'), 'd'):>8}{_fmt(r.get('p_group_replication'), '.2f'):>14}"
              f"{_fmt(r.get('metis_parts_of_group_replication'), '.2f'):>15}")


# ------------------------------------------------------------------------------------------------ main
def _devices(spec: str, dev: torch.device) -> tuple[str, ...]:
    if spec.strip().isdigit():
        n = int(spec)
        if n < 1:
            raise ValueError("--devices must be >= 1")
        return tuple("cpu" for _ in range(n)) if dev.type == "cpu" else tuple(f"cuda:{i}" for i in range(n))
    return tuple(_list(spec))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    ap.add_argument("--devices", default="4", metavar="N|LIST",
                    help="devices of taskparallel and offload: a count of --device copies or a comma list")
    ap.add_argument("--dataset", default=DEFAULT_DATASET, metavar="SPEC", help=f"default {DEFAULT_DATASET}")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--engines", default="taskparallel,offload,inmemory", help="subset to run, comma list")
    ap.add_argument("--model", default="dgcn", choices=DECOUPLED_MODELS, help="taskparallel's and inmemory's model")
    ap.add_argument("--coupled-model", default="gcn", help="offload's model (it declines decoupled ones)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--dependency", default="exact", choices=["exact", "skip"])
    ap.add_argument("--subgraphs", type=int, default=None, help="taskparallel subgraphs (default: the planner's)")
    ap.add_argument("--partitions", type=int, default=None, help="offload partitions (default: the device count)")
    ap.add_argument("--dedup", default="none", help="offload --dedup (default none: plain data parallelism)")
    ap.add_argument("--parts", default="2,4,8,16", help="part counts of the replication table ('' for none)")
    ap.add_argument("--method", default="metis", help="partitioner of the replication table: metis, random, range")
    ap.add_argument("--warmup", type=int, default=1, help="untimed epochs first (device bytes counted there)")
    ap.add_argument("--repeats", type=int, default=5, help="timed epochs (mean and min reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--count-timed", action="store_true", help="CPU: count device bytes in the timed epochs too")
    ap.add_argument("--explain-peaks", action="store_true", help="CPU: record the live tensors at each peak")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the tables only")
    args = ap.parse_args(argv)

    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))  # partition plans
    try:
        dev = resolve_device(args.device)
        devices = _devices(args.devices, dev)
        engines = _list(args.engines)
        if not engines or any(e not in ("taskparallel", "offload", "inmemory") for e in engines):
            raise ValueError(f"--engines: choose from taskparallel, offload, inmemory, got {args.engines!r}")
        parts = [int(p) for p in _list(args.parts)]
        if any(p < 1 for p in parts):
            raise ValueError("--parts must be >= 1")
        if args.warmup < 0 or args.repeats < 1:
            raise ValueError("--warmup must be >= 0 and --repeats >= 1")
        common_cfg = {"layers": args.layers, "hidden": args.hidden, "seed": args.seed}
        configs = {
            "taskparallel": TrainConfig(engine="taskparallel", model=args.model, devices=devices,
                                        dependency=args.dependency, subgraphs=args.subgraphs, **common_cfg),
            "offload": TrainConfig(engine="offload", model=args.coupled_model, devices=devices, dedup=args.dedup,
                                   partitions=args.partitions or len(devices), **common_cfg),
            "inmemory": TrainConfig(engine="inmemory", model=args.model, **common_cfg),
        }
        g, load_s = prepare(args)
    except (GnnscaleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    common = environment(dev)
    ds = {"dataset": g.meta.get("spec", args.dataset), "graph": g.name, "nodes": g.num_nodes, "edges": g.num_edges,
          "features": g.num_features, "classes": g.num_classes}
    print(f"{ds['dataset']}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {g.num_features} features, "
          f"{g.num_classes} classes (built in {load_s:.1f} s)")
    print(f"device {common['device_name']}; torch {torch.__version__}, gnnscale {common['gnnscale_rev']}; "
          f"{len(devices)} devices ({','.join(devices)}); warmup {args.warmup}, {args.repeats} timed epochs")
    count_epochs = None if args.count_timed or args.warmup == 0 else args.warmup
    rows = []
    for impl in engines:
        cfg = configs[impl]
        print(f"  running {impl} ({cfg.model}) ...", file=sys.stderr, flush=True)
        r = run_engine(impl, g, cfg, dev, args.warmup, args.repeats, count_epochs, args.explain_peaks)
        r.update(model=cfg.model, layers=cfg.layers, hidden=cfg.hidden, dropout=cfg.dropout)
        if impl == "offload":
            r["note"] = (f"offload declines decoupled models ({args.model}); it trains {cfg.model} with the same "
                         f"layers ({cfg.layers}) and hidden width ({cfg.hidden}), --dedup {cfg.dedup}, "
                         f"--partitions {cfg.partitions}")
        rows.append(r)
        done = f"mean {r['mean_epoch_s']:.3f} s" if r["status"] == "ok" else r["status"]
        print(f"  done {impl}: {done}", file=sys.stderr, flush=True)
    ok = {r["engine"]: r for r in rows if r["status"] == "ok"}
    tp = ok.get("taskparallel")
    comparison: dict[str, Any] = {"kind": "comparison", "devices": list(devices)}
    if tp is not None:
        for r in ok.values():
            r["tp_over_this_time"] = tp["mean_epoch_s"] / r["mean_epoch_s"]
            r["tp_over_this_peak"] = (None if not r["peak_device_bytes"] else
                                      tp["peak_device_bytes"] / r["peak_device_bytes"])
        for name in ("offload", "inmemory"):
            if name in ok:
                comparison[f"taskparallel_over_{name}_time"] = ok[name]["tp_over_this_time"]
                comparison[f"taskparallel_over_{name}_peak"] = ok[name]["tp_over_this_peak"]
                comparison[f"{name}_peak_device_bytes"] = ok[name]["peak_device_bytes"]
        comparison["taskparallel_peak_device_bytes"] = tp["peak_device_bytes"]
        if "offload" in ok:
            comparison["taskparallel_peak_below_offload"] = tp["peak_device_bytes"] < ok["offload"]["peak_device_bytes"]
    print(f"\nengines (taskparallel: {args.model}, --dependency {args.dependency}; offload: {args.coupled_model}, "
          f"--dedup {args.dedup}; inmemory: {args.model}, one device)")
    print_engines(rows)
    if tp is not None and "taskparallel_peak_below_offload" in comparison:
        below = comparison["taskparallel_peak_below_offload"]
        print(f"  acceptance (#13): taskparallel's largest per-device peak "
              f"{tp['peak_device_bytes'] / MIB:.1f} MiB is {'below' if below else 'NOT below'} offload's "
              f"{ok['offload']['peak_device_bytes'] / MIB:.1f} MiB (--dedup {args.dedup}, "
              f"{configs['offload'].partitions} partitions)")
    rep: list[dict[str, Any]] = []
    if parts:
        print(f"\nreplication factors ({args.method} parts of {g.name}; taskparallel planner for {args.model}, "
              f"{args.layers} layers)", file=sys.stderr, flush=True)
        rep = replication_factors(g, parts, configs["taskparallel"], dev, args.method, args.seed)
        print(f"\nreplication (alpha: average copies of a vertex's row over the parts; {args.method})")
        print_replication(rep)
    case = {**ds, "threads": torch.get_num_threads(), "warmup": args.warmup, "repeats_requested": args.repeats,
            "seed": args.seed}
    records = [{**common, **case, **r, "kind": "engine"} for r in rows]
    records += [{**common, **case, **r} for r in rep]
    if tp is not None:
        records.append({**common, **case, **comparison})
    if not args.no_save:
        append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
