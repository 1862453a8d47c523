"""Mini-batch path as XGNN (issue #12): our sampler against baselines, read amplification, epoch time.

The mini-batch engine (XGNN store + keyed k-hop sampler): sampler throughput against baselines in the same run,
read amplification, epoch time for 1..k trainers and pipeline stages vs the store's ratios.

    python -m benchmarks minibatch --device cpu --hidden 64 --fanouts 15,10 \
        --dataset edgelist:/work/shared/datasets/snap/ego-twitter.txt.gz:symmetrize=1 \
        --gpu-feature-ratio 0.25 --trainers 1,2 --epochs 3 --warmup 1 --repeats 3
    python -m benchmarks minibatch --device cuda \
        --dataset csbm:nodes=2450000,avg_degree=50,features=100,classes=47 --fanouts 25,10 --batch-size 1024 \
        --gpu-feature-ratio 0.25

(the second is the products-scale GPU target: GraphSAGE, 2 layers, hidden 256, fanouts 25,10, batch 1024, a
quarter of the features on the GPU; goal <= 0.3 s per epoch.) The default ``--dataset`` is ego-twitter, symmetrised
(``symmetrize=1``, explicit: the file lists each undirected edge once), when ``../shared/datasets/snap`` has it.

**Samplers** (``--samplers on``, the default): one epoch's batches (the training vertices, shuffled,
``--batch-size`` seeds each, ``--fanouts``) sampled on an in-memory CSR of the model's adjacency on ``--device``,
every sampler producing the same blocks (relabelled, one per hop) from the same seeds:

* ours, :func:`gnnscale.sample.sample_blocks`: per hop the frontier's degrees, positions drawn by Floyd's algorithm
  keyed by (key, hop, vertex), then only those neighbour entries fetched;
* (a) fetch-all-then-sample: gnnscale's sampler before issue #12, copied from commit feae281 -- the frontier's
  whole neighbour lists fetched, then random keys for every candidate and one segmented sort keep ``fanout``;
* (b) a straightforward vectorised O(fanout) sampler on torch's RNG, fetching only the drawn entries through the
  same store request as ours: Floyd's algorithm with ``torch.rand`` on all rows at once (ours but for the RNG);
  with ``--rejection`` also (b2), rejection: ``fanout`` positions with replacement per row, rows holding a repeat
  redraw the repeated slots until distinct;
* (c) PyG's ``NeighborSampler`` when ``pyg_lib`` or ``torch_sparse`` is installed (CPU only); otherwise a note says
  it was skipped.

Each sampler runs the epoch once untimed, then ``--repeats`` rounds in which the samplers take turns. Per sampler:
median seconds, MTEPS (sampled edges / s / 10^6), read amplification (neighbour entries fetched / sampled edges:
ours and (b) count ``CSRTopology.fetched_entries``, (a) the whole lists it fetched) and our MTEPS over its.

One graph (``--dataset``, any :func:`gnnscale.load_dataset` spec) and one model (``--model``, GraphSAGE by default;
``--layers`` defaults to the number of ``--fanouts``), trained by ``--engine minibatch`` once per
``--gpu-feature-ratio`` value (comma list) at one ``--gpu-graph-ratio``: the hottest (highest out-degree) fraction
of the vertices keep their feature rows / neighbour lists in device memory, the rest in host memory
(:class:`gnnscale.store.GlobalMemoryStore`). Each configuration runs ``--warmup`` untimed, then ``--epochs`` timed
training epochs (``MiniBatchEngine.train_epoch``: every training vertex once as a seed, ``--batch-size`` seeds and
one optimiser step per batch; no evaluation).

Per configuration: the median epoch time (wall clock around ``train_epoch``, device synchronised), the medians of
the engine's ``sample_s`` / ``extract_s`` / ``train_s``, the sampled edges per epoch (every block's edges, all
hops), MTEPS = sampled edges / median epoch time / 10^6 (HyScale-GNN's throughput metric), the store's feature and
graph hit rates (requests answered from device memory), ``h2d_bytes`` (the store's count of bytes read from host
memory onto the device), the batch count and the engine's read amplification (the store's
``fetched_neighbor_entries`` / sampled edges, last timed epoch).

Reading the stage times: ``sample_s`` (k-hop sampling) and ``extract_s`` (feature gathering) are summed over the
batches on the producer thread, which works ahead of training through a bounded queue, so they overlap
``train_s`` (forward, backward, optimiser step on the consumer side) and need not add up to the epoch time. If
``train_s`` is close to the epoch time, the pipeline hides sampling and extraction; if the epoch is much longer
than ``train_s``, training waits for batches.

On CPU the "devices" of the store are host memory too: a feature ratio changes only which rows count as hits and
which bytes are counted as host->device (``h2d_bytes``, counted on CPU as on a GPU), not bytes moved over a bus.
The GPU run is where the ratio matters: a miss there is a host row read over PCIe (UVA or CPU gather + copy).

``--trainers 1,2`` runs each configuration with 1 and with 2 trainers on ``--device`` (threads; each samples,
extracts and trains its share of every batch, gradients summed, one optimiser step per batch). The loss of the
two equals (keyed sampling); a shared neighbour of two trainers' seeds is sampled by both, so the sampled edges
per epoch grow with the trainer count.

Cases (one process each, ``--rounds`` interleaved rounds, one group per dataset): ``samplers`` (the sampler
comparison) and one per (trainer count, feature ratio). The producer thread runs sampling concurrently with
training (both release the GIL in torch ops), so a CPU case can keep two cores busy even at one torch thread.
Records: one per sampler (``"kind": "sampler"``) and one per configuration (``"kind": "engine"``), with ``device``
and ``device_name``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks._minibatch_samplers import (
    PositionFn,
    floyd_positions,
    pyg_sampler,
    rejection_positions,
    sample_fetch_all,
    sample_ours,
    sample_torch_rng,
)
from benchmarks.harness import Case, fmt, split_list
from benchmarks.harness.graphs import device_name, load_graph
from benchmarks.harness.records import provenance, table
from benchmarks.offload import PRODUCTS_LIKE
from benchmarks.offload import bench as time_epochs
from gnnscale.engines import MiniBatchEngine, select_engine
from gnnscale.engines.core.devices import resolve_device
from gnnscale.graph.block import Block, normalized_csr
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.sample import CSRTopology, sample_key
from gnnscale.train import TrainConfig
from gnnscale.units import parse_budget

__all__ = ["OURS", "PositionFn", "bench", "bench_samplers", "floyd_positions", "make_engine", "pyg_sampler",
           "rejection_positions", "sample_fetch_all", "sample_ours", "sample_torch_rng"]

TITLE = "Mini-batch path as XGNN (issue #12), CPU"
ROUNDS = 3
EGO_TWITTER = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "snap" / "ego-twitter.txt.gz"
DEFAULT_DATASET = (f"edgelist:{EGO_TWITTER}:symmetrize=1" if EGO_TWITTER.exists()
                   else "csbm:nodes=100000,avg_degree=10,features=100")
STAGES = ("sample_s", "extract_s", "train_s")
QUICK = {"dataset": "csbm:nodes=3000,avg_degree=10,features=16,classes=4", "hidden": 16, "fanouts": "5,5",
         "batch_size": 256, "gpu_feature_ratio": "0.25", "trainers": "1,2", "epochs": 1, "repeats": 1}
"""--quick: these values for the flags left at their defaults."""


def make_engine(g: Graph, cfg: TrainConfig, dev: torch.device) -> MiniBatchEngine:
    """A mini-batch engine for ``cfg`` (after the selector's checks: a refusal raises EngineError)."""
    engine_cls, _ = select_engine(g, cfg, dev)
    assert engine_cls is MiniBatchEngine and g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return MiniBatchEngine(g, model, cfg, dev)


def bench(g: Graph, cfg: TrainConfig, dev: torch.device, warmup: int, epochs: int) -> dict[str, Any]:
    """Time ``warmup + epochs`` training epochs of one configuration (the offload script's timing loop), adding the
    mini-batch columns; ``status`` is ok, oom or refused."""

    def make() -> tuple[Any, dict[str, Any]]:
        t0 = time.perf_counter()
        engine = make_engine(g, cfg, dev)
        info = {"engine_detail": engine.describe(), "setup_s": time.perf_counter() - t0,
                "store_device_bytes": engine.store.device_bytes(), "hot_graph": engine.store.hot_graph,
                "hot_features": engine.store.hot_features, "gather_method": engine.store.gather,
                "fanouts": list(engine.fanouts), "train_vertices": int(engine.train_ids.numel())}
        return engine.train_epoch, info

    r = time_epochs("minibatch", make, dev, warmup, epochs, keep_stats=True)
    if r["status"] != "ok":
        return r
    timed_stats = r.pop("epoch_stats")[warmup:]
    last, median = timed_stats[-1], r["median_epoch_s"]
    edges = statistics.median(int(s["sampled_edges"]) for s in timed_stats)
    return {**r,
            **{f"median_{k}": statistics.median(float(s[k]) for s in timed_stats) for k in STAGES},
            **{f"{k}_per_epoch": [float(s[k]) for s in timed_stats] for k in STAGES},
            "sampled_edges": edges, "sampled_edges_per_epoch": [int(s["sampled_edges"]) for s in timed_stats],
            "mteps": edges / median / 1e6, "batches": int(last["batches"]),
            "feature_hit_rate": float(last["feature_hit_rate"]), "graph_hit_rate": float(last["graph_hit_rate"]),
            "h2d_bytes": int(last["h2d_bytes"]), "kind": "engine", "trainers": int(last["trainers"]),
            **{k: int(last[k]) for k in ("fetched_neighbor_entries", "h2d_row_bytes", "h2d_topology_bytes",
                                          "d2d_bytes")},
            "read_amplification": int(last["fetched_neighbor_entries"]) / max(int(last["sampled_edges"]), 1)}



OURS = "gnnscale (keyed positions, then fetch)"


def bench_samplers(g: Graph, cfg: TrainConfig, dev: torch.device, repeats: int,
                   rejection: bool = False) -> list[dict[str, Any]]:
    """One epoch's batches (the training vertices, shuffled, ``cfg.batch_size`` each) sampled by ours and the
    baselines (the rejection one if ``rejection``) on the same in-memory CSR (the model's adjacency) on ``dev``, with
    ``cfg.fanouts``.

    Each sampler runs the epoch once untimed, then ``repeats`` timed rounds; the samplers take turns within a round
    (the order rotating), so a disturbance of the shared machine hits them alike. Per sampler: the median seconds,
    the sampled edges and neighbour entries fetched of the last round, MTEPS = sampled edges / median / 10^6, read
    amplification = entries fetched / sampled edges, ``ours_mteps_ratio`` = our MTEPS / its MTEPS (> 1: ours is
    faster) and ``ours_speedup`` = its seconds / ours (the samplers' edge counts differ a little: other draws)."""
    assert cfg.fanouts is not None and g.train_mask is not None
    model = build_model(cfg.model, g.num_features, 8, g.num_classes or 2, layers=cfg.layers, heads=1, dropout=0.0,
                        seed=0)
    topo = CSRTopology(*(t if t is None else t.to(dev) for t in normalized_csr(g, model.adjacency)))  # type: ignore[misc]
    train = torch.nonzero(g.train_mask).view(-1)
    seeds = train[torch.randperm(train.numel(), generator=torch.Generator().manual_seed(cfg.seed))].to(dev)
    batches = [seeds[i : i + cfg.batch_size] for i in range(0, seeds.numel(), cfg.batch_size)]
    fanouts = tuple(cfg.fanouts)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)

    def edges_of(run: Callable[[Tensor], tuple[list[Block], int]]) -> Callable[[Tensor], tuple[int, int | None]]:
        def f(b: Tensor) -> tuple[int, int | None]:
            blocks, fetched = run(b)
            return sum(blk.num_edges for blk in blocks), fetched
        return f

    key = [sample_key(cfg.seed, 0)]  # ours: one key per epoch, as the engine
    samplers: dict[str, Sampler] = {
        OURS: edges_of(lambda b: sample_ours(topo, b, fanouts, key[0])),
        "fetch-all-then-sample (gnnscale feae281)": edges_of(lambda b: sample_fetch_all(topo, b, fanouts, gen)),
        "Floyd, torch RNG (O(fanout))": edges_of(lambda b: sample_torch_rng(topo, b, fanouts, floyd_positions,
                                                                             gen))}
    if rejection:
        samplers["rejection, torch RNG (O(fanout))"] = edges_of(
            lambda b: sample_torch_rng(topo, b, fanouts, rejection_positions, gen))
    pyg, note = pyg_sampler(topo, fanouts)
    if pyg is None:
        print(f"  note: PyG's sampler skipped: {note}", file=sys.stderr)
    else:
        samplers[note] = lambda b: (pyg(b), None)
    names = list(samplers)

    def next_round(r: int) -> None:
        key[0] = sample_key(cfg.seed, r + 1)

    times, counts, load = time_rounds(samplers, batches, dev, repeats, next_round)
    out = []
    for name in names:
        med = statistics.median(times[name])
        edges, fetched = counts[name]
        out.append({"kind": "sampler", "sampler": name, "median_sample_s": med, "sample_s_per_repeat": times[name],
                    "sampled_edges": edges, "fetched_neighbor_entries": fetched, "mteps": edges / med / 1e6,
                    "read_amplification": None if fetched is None else fetched / max(edges, 1),
                    "batches": len(batches), "repeats": repeats, "fanouts": list(fanouts),
                    "loadavg_1m_before_after": load, **({"pyg_note": note} if name == OURS and pyg is None else {})})
    for r in out:
        r["ours_mteps_ratio"] = out[0]["mteps"] / r["mteps"]
        r["ours_speedup"] = r["median_sample_s"] / out[0]["median_sample_s"]  # its seconds / ours (gpu_check)
    return out


Sampler = Callable[[Tensor], tuple[int, int | None]]


def time_rounds(samplers: dict[str, Sampler], batches: list[Tensor], dev: torch.device, repeats: int,
                next_round: Callable[[int], None]) -> tuple[dict[str, list[float]], dict[str, tuple[int, int | None]],
                                                           list[float]]:
    """Each sampler's epoch over ``batches`` once untimed, then ``repeats`` rounds in which they take turns (the order
    rotating; ``next_round(r)`` before round ``r``): the seconds per round, the last round's (sampled edges,
    entries fetched) and the 1-minute load before and after."""
    names = list(samplers)
    times: dict[str, list[float]] = {n: [] for n in names}
    counts: dict[str, tuple[int, int | None]] = {}

    def epoch(name: str) -> tuple[float, int, int | None]:
        fn, edges, fetched = samplers[name], 0, 0
        sync(dev)
        t0 = time.perf_counter()
        for b in batches:
            e, f = fn(b)
            edges += e
            fetched = None if f is None or fetched is None else fetched + f
        sync(dev)
        return time.perf_counter() - t0, edges, fetched

    load = [os.getloadavg()[0]]
    for name in names:  # untimed: first-call costs (allocator, lazy init) out of the way
        epoch(name)
    for r in range(repeats):
        next_round(r)
        for name in names[r % len(names):] + names[: r % len(names)]:
            t, edges, fetched = epoch(name)
            times[name].append(t)
            counts[name] = (edges, fetched)
    load.append(os.getloadavg()[0])
    return times, counts, load


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    ap.add_argument("--dataset", default=DEFAULT_DATASET, metavar="SPEC",
                    help=f"dataset spec (default {DEFAULT_DATASET}; ogbn-products-sized: {PRODUCTS_LIKE})")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--model", default="sage", help="gcn, sage, gat, gin or mlp (default sage)")
    ap.add_argument("--layers", type=int, default=None, help="default: the number of --fanouts")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4, help="GAT hidden heads")
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--batch-size", type=int, default=1024, help="seed vertices per batch")
    ap.add_argument("--fanouts", default="25,10", help="neighbours sampled per hop, the seeds' hop first (-1: all)")
    ap.add_argument("--gpu-feature-ratio", default="0,0.25,1", metavar="RATIOS",
                    help="fractions of the vertices (hottest first) whose features live on the device, to sweep")
    ap.add_argument("--gpu-graph-ratio", type=float, default=1.0,
                    help="fraction of the vertices (hottest first) whose neighbour lists live on the device")
    ap.add_argument("--gpu-memory", default=None, metavar="BUDGET",
                    help="device budget for the store: GiB (6) or a size (64MB); default: free device memory")
    ap.add_argument("--gather", default="auto", help="auto, index_select or uva (host feature rows on CUDA)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed epochs before the timed ones")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs (the median is reported)")
    ap.add_argument("--trainers", default="1", metavar="LIST",
                    help="trainer counts to run (comma list): k trainers on --device, one thread each (default 1); "
                         "0: no engine run")
    ap.add_argument("--samplers", choices=["on", "off"], default="on",
                    help="also time our sampler against the baselines on one epoch's batches (default on)")
    ap.add_argument("--rejection", action="store_true",
                    help="sampler comparison: also time the rejection baseline (b2)")
    ap.add_argument("--repeats", type=int, default=3, help="sampler comparison: repeats (the median is reported)")
    ap.add_argument("--seed", type=int, default=0)


def _ratios(text: str, flag: str) -> list[float]:
    values = [float(v) for v in split_list(text)]
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise SystemExit(f"error: {flag}: one or more values in [0, 1], got {text!r}")
    return values


def cases(args: argparse.Namespace) -> list[Case]:
    """``samplers`` (unless ``--samplers off``) and one case per (trainer count, feature ratio), one group."""
    defaults = argparse.Namespace()
    add_arguments(ap := argparse.ArgumentParser())
    ap.parse_args([], defaults)
    a = {k: (QUICK[k] if args.quick and k in QUICK and v == getattr(defaults, k) else v)
         for k, v in vars(args).items()}
    fanouts = [int(f) for f in split_list(a["fanouts"])]
    trainers = [int(k) for k in split_list(a["trainers"]) if int(k) != 0]  # 0: samplers only
    if (trainers and min(trainers) < 1) or a["repeats"] < 1 or a["warmup"] < 0 or a["epochs"] < 1:
        raise SystemExit("error: --trainers takes counts >= 1 (or 0), --repeats and --epochs >= 1, --warmup >= 0")
    (graph_ratio,) = _ratios(str(a["gpu_graph_ratio"]), "--gpu-graph-ratio")
    common = {k: a[k] for k in ("device", "dataset", "root", "model", "hidden", "heads", "dropout", "lr",
                                "batch_size", "gather", "warmup", "epochs", "seed", "repeats", "rejection")}
    common |= {"layers": a["layers"] or len(fanouts), "fanouts": fanouts, "gpu_graph_ratio": graph_ratio,
               "memory_budget": None if a["gpu_memory"] is None else parse_budget(a["gpu_memory"])}
    group = a["dataset"]
    out = [Case("samplers", {**common, "what": "samplers"}, group)] if a["samplers"] == "on" else []
    out += [Case(f"{k} trainer(s), feature ratio {r:g}",
                 {**common, "what": "engine", "trainers": k, "gpu_feature_ratio": r}, group)
            for k in trainers for r in _ratios(a["gpu_feature_ratio"], "--gpu-feature-ratio")]
    return out


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The sampler comparison or one engine configuration on ``params["dataset"]``."""
    p = params
    dev = resolve_device(p["device"])
    base = TrainConfig(model=p["model"], layers=p["layers"], hidden=p["hidden"], heads=p["heads"],
                       dropout=p["dropout"], lr=p["lr"], epochs=p["epochs"], seed=p["seed"], engine="minibatch",
                       batch_size=p["batch_size"], fanouts=tuple(p["fanouts"]), gpu_graph_ratio=p["gpu_graph_ratio"],
                       memory_budget=p["memory_budget"], gather=p["gather"])
    g, load_s = load_graph(p["dataset"], p["root"], p["seed"])
    case = {"device": str(dev.type), "device_name": device_name(str(dev)), "dataset": g.meta.get("spec", p["dataset"]),
            "graph": g.name, "nodes": g.num_nodes, "edges": g.num_edges,
            "avg_in_degree": g.num_edges / max(g.num_nodes, 1), "features": g.num_features,
            "classes": g.num_classes, "engine": "minibatch", "model": base.model, "layers": base.layers,
            "hidden": base.hidden, "heads": base.heads, "dropout": base.dropout, "lr": base.lr,
            "batch_size": base.batch_size, "fanouts_requested": list(p["fanouts"]),
            "memory_budget": p["memory_budget"], "gather_requested": base.gather, "warmup": p["warmup"],
            "epochs": p["epochs"], "seed": p["seed"], "load_s": load_s}
    if p["what"] == "samplers":
        return [{**case, **r} for r in bench_samplers(g, base, dev, p["repeats"], p["rejection"])]
    k, ratio = p["trainers"], p["gpu_feature_ratio"]
    cfg = TrainConfig(**{**asdict(base), "gpu_feature_ratio": ratio, "devices": (str(dev),) * k})
    return [{**case, "gpu_feature_ratio": ratio, "gpu_graph_ratio": base.gpu_graph_ratio, "trainers_requested": k,
             **bench(g, cfg, dev, p["warmup"], p["epochs"])}]


def describe(r: dict[str, Any]) -> str:
    if r.get("kind") == "sampler":
        return f"{r['sampler']}: {r['median_sample_s']:.3f} s, {r['mteps']:.2f} MTEPS"
    if r.get("status") != "ok":
        return f"{r.get('status')}: {str(r.get('reason'))[:120]}"
    return f"epoch {r['median_epoch_s']:.3f} s, {r['mteps']:.2f} MTEPS, loss {r['final_loss']:.4f}"


# ------------------------------------------------------------------------------------------------------- rendering
def _label(r: dict[str, Any]) -> str:
    spec = str(r.get("dataset", ""))
    if spec.startswith("csbm"):
        return f"csbm n={r['nodes']:,} degree {round(r['edges'] / max(r['nodes'], 1))}"
    return f"{r.get('graph')}{' sym.' if 'symmetrize=1' in spec else ''}"


def selected(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CPU sampler and engine records shown: per graph, the runs of its latest series (a harness session, or
    every run of the old script's latest command on that graph)."""
    recs = [r for r in records if r.get("device") == "cpu" and r.get("kind") in ("sampler", "engine")
            and r.get("ok", True)]
    series = {_label(r): (r.get("session") or r.get("command")) for r in recs}
    return [r for r in recs if (r.get("session") or r.get("command")) == series[_label(r)]]


def _med(rs: list[dict[str, Any]], key: str, spec: str, ranged: bool = False) -> str:
    vals = [r[key] for r in rs if r.get(key) is not None]
    if not vals:
        return "-"
    out = fmt(statistics.median(vals), spec)
    return f"{out} ({fmt(min(vals), spec)}-{fmt(max(vals), spec)})" if ranged and len(vals) > 1 else out


def _tables(recs: list[dict[str, Any]]) -> tuple[str, str]:
    samplers: dict[tuple[str, str], list[dict[str, Any]]] = {}
    engines: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for r in recs:
        if r["kind"] == "sampler":
            samplers.setdefault((_label(r), r["sampler"]), []).append(r)
        elif r.get("status") == "ok":
            engines.setdefault((_label(r), r["trainers_requested"], r["gpu_feature_ratio"]), []).append(r)
    s_rows = [[g, name, _med(rs, "median_sample_s", ".3f", True), _med(rs, "mteps", ".2f", True),
               _med(rs, "read_amplification", ".2f"), _med(rs, "ours_mteps_ratio", ".2f", True), len(rs)]
              for (g, name), rs in samplers.items()]
    e_rows = [[g, k, f"{ratio:g}", _med(rs, "median_epoch_s", ".3f", True), _med(rs, "median_sample_s", ".3f"),
               _med(rs, "median_extract_s", ".3f"), _med(rs, "median_train_s", ".3f"),
               _med(rs, "sampled_edges", ",.0f"), _med(rs, "read_amplification", ".2f"), _med(rs, "mteps", ".2f"),
               _med(rs, "feature_hit_rate", ".3f"), fmt(statistics.median(r["h2d_bytes"] / 1e6 for r in rs), ".1f"),
               _med(rs, "final_loss", ".4f"), len(rs)] for (g, k, ratio), rs in engines.items()]
    s_head = ["graph", "sampler", "epoch of sampling (s)", "MTEPS", "fetched / sampled", "ours / this MTEPS", "runs"]
    e_head = ["graph", "trainers", "feature ratio", "epoch (s)", "sample (s)", "extract (s)", "train (s)",
              "sampled edges", "fetched / sampled", "MTEPS", "feature hit", "H2D MB", "loss", "runs"]
    return table(s_head, s_rows), table(e_head, e_rows)


def render(records: list[dict[str, Any]]) -> str:
    recs = selected(records)
    if not recs:
        return "No CPU records.\n"
    samplers, engines = _tables(recs)
    return (f"{provenance(recs)}\n\nPer graph, the runs of its latest command (a harness session's rounds, or the "
            "old script's repeated invocations): the median over the runs (range in brackets).\n\n"
            "**Samplers**: one epoch's batches on the in-memory CSR of the model's adjacency, every sampler giving "
            "the same blocks; MTEPS = sampled edges / s / 10^6; fetched / sampled = neighbour entries read per "
            f"sampled edge.\n\n{samplers}\n\n**Engine** (`MiniBatchEngine.train_epoch`): median of the timed "
            "epochs per run; sample and extract are the producer threads' summed stage times, overlapping "
            f"train.\n\n{engines}\n")
