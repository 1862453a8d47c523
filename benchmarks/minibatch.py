"""The mini-batch engine (XGNN store + k-hop sampler): epoch time, pipeline stages and MTEPS vs the store's ratios.

    .venv/bin/python benchmarks/minibatch.py --device cpu --threads 1 \\
        --dataset edgelist:/work/shared/datasets/snap/ego-twitter.txt.gz --gpu-feature-ratio 0,0.25,1 \\
        --epochs 2 --warmup 1
    PYTHONPATH=. python3 benchmarks/minibatch.py --device cuda \\
        --dataset csbm:nodes=2450000,avg_degree=50,features=100,classes=47 --fanouts 25,10 --batch-size 1024 \\
        --gpu-feature-ratio 0.25

(the second is the products-scale GPU target: GraphSAGE, 2 layers, hidden 256, fanouts 25,10, batch 1024, a
quarter of the features on the GPU; goal <= 0.3 s per epoch.)

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
memory onto the device) and the batch count.

Reading the stage times: ``sample_s`` (k-hop sampling) and ``extract_s`` (feature gathering) are summed over the
batches on the producer thread, which works ahead of training through a bounded queue, so they overlap
``train_s`` (forward, backward, optimiser step on the consumer side) and need not add up to the epoch time. If
``train_s`` is close to the epoch time, the pipeline hides sampling and extraction; if the epoch is much longer
than ``train_s``, training waits for batches.

On CPU the "devices" of the store are host memory too: a feature ratio changes only the bookkeeping (which rows
count as hits; ``h2d_bytes`` stays 0, as the store counts no bytes for a CPU requester), not bytes moved over a
bus. Timings across ratios on CPU therefore measure the store's routing overhead, nothing more. The GPU run is
where the ratio matters: a miss there is a host row read over PCIe (UVA or CPU gather + copy).

CPU timings: ``--threads 1`` keeps them stable on a shared machine. The producer thread still runs sampling
concurrently with training (both release the GIL in torch ops), so a CPU run can keep up to two cores busy.

One JSON line per configuration is appended to ``--out`` (default benchmarks/results/minibatch.jsonl), with the
environment (date, device, torch/PyG versions, git revision, command, ``OMP_*``/``MALLOC_*`` variables).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.minibatch
    from offload import PRODUCTS_LIKE, _fmt, _list, append_records, environment, prepare
    from offload import bench as time_epochs
except ImportError:  # pragma: no cover
    from benchmarks.offload import PRODUCTS_LIKE, _fmt, _list, append_records, environment, prepare
    from benchmarks.offload import bench as time_epochs

from gnnscale.engines import MiniBatchEngine, select_engine
from gnnscale.errors import GnnscaleError
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.plan.memory import parse_budget
from gnnscale.train import TrainConfig, resolve_device

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "minibatch.jsonl"
DEFAULT_DATASET = "csbm:nodes=100000,avg_degree=10,features=100"
STAGES = ("sample_s", "extract_s", "train_s")


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
            "h2d_bytes": int(last["h2d_bytes"])}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"  {'feat r':>7}{'graph r':>8}{'median (s)':>11}{'sample':>8}{'extract':>8}{'train':>8}"
          f"{'edges/ep':>12}{'MTEPS':>8}{'feat hit':>9}{'graph hit':>10}{'H2D MB':>8}{'batches':>8}{'loss':>8}")
    for r in rows:
        head = f"  {r['gpu_feature_ratio']:>7g}{r['gpu_graph_ratio']:>8g}"
        if r["status"] != "ok":
            print(f"{head}  {r['status']}: {r['reason'][:110]}")
            continue
        print(f"{head}{r['median_epoch_s']:>11.3f}{r['median_sample_s']:>8.3f}{r['median_extract_s']:>8.3f}"
              f"{r['median_train_s']:>8.3f}{r['sampled_edges']:>12,.0f}{r['mteps']:>8.2f}"
              f"{r['feature_hit_rate']:>9.3f}{r['graph_hit_rate']:>10.3f}{_fmt(r['h2d_bytes'] / 1e6, '.1f'):>8}"
              f"{r['batches']:>8d}{r['final_loss']:>8.4f}")
    print("  sample/extract: producer-thread sums, overlapping train; MTEPS = sampled edges / median epoch / 1e6; "
          "hit: store requests answered from device memory")
    for r in rows:
        if r.get("engine_detail"):
            print(f"    feature ratio {r['gpu_feature_ratio']:g}: {r['engine_detail']}")


def _ratios(text: str, flag: str) -> list[float]:
    values = [float(v) for v in _list(text)]
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"{flag}: one or more values in [0, 1], got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    args = ap.parse_args(argv)

    try:
        dev = resolve_device(args.device)
        fanouts = tuple(int(f) for f in _list(args.fanouts))
        feature_ratios = _ratios(args.gpu_feature_ratio, "--gpu-feature-ratio")
        (graph_ratio,) = _ratios(str(args.gpu_graph_ratio), "--gpu-graph-ratio")
        budget = None if args.gpu_memory is None else parse_budget(args.gpu_memory)
        if args.warmup < 0 or args.epochs < 1:
            raise ValueError("--warmup must be >= 0 and --epochs >= 1")
        base = TrainConfig(model=args.model, layers=args.layers or len(fanouts), hidden=args.hidden,
                           heads=args.heads, dropout=args.dropout, lr=args.lr, epochs=args.epochs, seed=args.seed,
                           engine="minibatch", batch_size=args.batch_size, fanouts=fanouts,
                           gpu_graph_ratio=graph_ratio, memory_budget=budget, gather=args.gather)
        g, load_s = prepare(args)
    except (GnnscaleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    common = environment(dev)
    case = {"dataset": g.meta.get("spec", args.dataset), "graph": g.name, "nodes": g.num_nodes,
            "edges": g.num_edges, "avg_in_degree": g.num_edges / max(g.num_nodes, 1), "features": g.num_features,
            "classes": g.num_classes, "engine": "minibatch", "model": base.model, "layers": base.layers,
            "hidden": base.hidden, "heads": base.heads, "dropout": base.dropout, "lr": base.lr,
            "batch_size": base.batch_size, "fanouts_requested": list(fanouts), "memory_budget": budget,
            "gather_requested": base.gather, "warmup": args.warmup, "epochs": args.epochs, "seed": args.seed,
            "load_s": load_s}
    print(f"{case['dataset']}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {g.num_features} features, "
          f"{g.num_classes} classes (built in {load_s:.1f} s)")
    print(f"device {common['device_name']}; torch {common['torch']}, PyG {common['pyg']}, gnnscale "
          f"{common['gnnscale_rev']}; {base.model}, {base.layers} layers, hidden {base.hidden}, batch "
          f"{base.batch_size}, fanouts {','.join(map(str, fanouts))}; warmup {args.warmup}, median of "
          f"{args.epochs} timed epochs")
    rows = []
    for ratio in feature_ratios:
        cfg = TrainConfig(**{**asdict(base), "gpu_feature_ratio": ratio})
        print(f"  running feature ratio {ratio:g}, graph ratio {graph_ratio:g} ...", file=sys.stderr, flush=True)
        rows.append({"gpu_feature_ratio": ratio, "gpu_graph_ratio": graph_ratio,
                     **bench(g, cfg, dev, args.warmup, args.epochs)})
    print()
    print_table(rows)
    records = [{**common, **case, **r} for r in rows]
    if not args.no_save:
        append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
