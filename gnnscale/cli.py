"""``gnnscale`` command line: thin — parse flags, build a config, pick an engine, train.

Bad input of any kind exits with status 2 and one ``error: ...`` line on stderr, leaving no partial files.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from gnnscale import progress
from gnnscale.distributed import current as current_comm
from gnnscale.errors import ConfigError, GnnscaleError, RankFailure

USAGE_ERROR = 2


class _UsageError(GnnscaleError):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``error: ...`` line (raised, so main() reports it like any other)."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog.split()[-1]}: {message}")


def _add_dataset_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--dataset", required=required, default=None if required else "csbm", metavar="SPEC",
                   help="csbm[:opts], kronecker[:opts], planetoid:<name>, npz:<file>, edgelist:<file>, "
                        "ogb:<name>, or a directory written by 'gnnscale convert' (default: csbm)")
    p.add_argument("--root", metavar="DIR", help="folder with Planetoid/OGB files; fallback folder for file paths")
    p.add_argument("--seed", type=int, default=0, help="seed for weights, dropout and random splits (default 0)")


def _add_plan_dir(p: Any) -> None:
    p.add_argument("--plan-dir", metavar="DIR",
                   help="where partition plans are saved and reused (default: $GNNSCALE_CACHE_DIR/plans or "
                        "~/.cache/gnnscale/plans)")


def _add_hybrid_args(p: Any) -> None:
    p.add_argument("--drm", choices=["on", "off"], default="on",
                   help="dynamic resource management (Algorithm 1): after each iteration move seeds between the "
                        "CPU and accelerator trainers, or threads between the CPU stages (default on)")
    p.add_argument("--threads", metavar="S,L,T",
                   help="threads of the CPU sampler, the feature loader and the CPU trainer, at most the cores in "
                        "all (default: half the cores to the trainer, the rest split)")


def build_parser() -> argparse.ArgumentParser:
    from gnnscale import __version__
    from gnnscale.config import ALL_MODELS, STRATEGIES
    from gnnscale.engines import ENGINES
    from gnnscale.partition import CHUNKERS, PARTITION_METHODS
    from gnnscale.partition.dedup import DEDUP_MODES, REORGANIZE_MODES
    from gnnscale.sample import SAMPLE_NORMS
    from gnnscale.store import GATHER_METHODS

    parser = _Parser(prog="gnnscale", description="Train GNNs on graphs bigger than one GPU's memory.")
    parser.add_argument("--version", action="version", version=f"gnnscale {__version__}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{train,predict,partition,plan,info,report,convert}")

    t = sub.add_parser("train", help="train a model and report accuracy")
    _add_dataset_args(t, required=False)
    t.add_argument("--model", choices=list(ALL_MODELS), default="gcn",
                   help="layer type, or a decoupled model (T tasks, then P tasks): dgcn, dgat (default gcn)")
    t.add_argument("--layers", type=int, default=2, help="layers, the last one giving class scores (default 2)")
    t.add_argument("--hidden", type=int, default=64, help="hidden width (GAT: total over heads; default 64)")
    t.add_argument("--heads", type=int, default=4, help="GAT attention heads (default 4)")
    t.add_argument("--dropout", type=float, default=0.5, help="drop probability before every layer (default 0.5)")
    t.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    t.add_argument("--weight-decay", type=float, default=5e-4, help="Adam weight decay (default 5e-4)")
    t.add_argument("--epochs", type=int, default=100, help="training epochs (default 100)")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    t.add_argument("--engine", choices=["auto", *ENGINES], default="auto",
                   help="auto: the first engine that fits, in this order (never minibatch); default auto")
    t.add_argument("--gpu-memory", "--memory-budget", dest="gpu_memory", metavar="GIB",
                   help="device memory the engine may use: GiB (e.g. 6) or a size (512MB); default: what is free")
    o = t.add_argument_group("offload engine (HongTu)")
    o.add_argument("--partitions", type=int, default=1, help="level-1 partitions m (default 1)")
    o.add_argument("--chunks", type=int, help="chunks per partition n (default: the fewest that fit --gpu-memory)")
    o.add_argument("--partition-method", choices=PARTITION_METHODS, default="metis",
                   help="level-1 partitioner (default metis)")
    o.add_argument("--gather", choices=["auto", *GATHER_METHODS], default="auto",
                   help="how chunk rows reach the GPU: index_select (CPU gather + async copy) or uva (Triton "
                        "kernel reading pinned host memory); default auto")
    o.add_argument("--devices", metavar="LIST",
                   help="comma-separated devices (e.g. cuda:0,cuda:1): offload runs partition i on device i mod "
                        "count; minibatch runs one trainer per device; default: --device")
    o.add_argument("--dedup", choices=DEDUP_MODES, default="full",
                   help="host->device deduplication: none, reuse (keep rows shared with the previous chunk), "
                        "full (HongTu: load each batch's rows once, share them, reuse them); default full")
    o.add_argument("--chunker", choices=["auto", *CHUNKERS], default="range",
                   help="how partitions split into chunks: range (edge-balanced), metis (fewer shared rows; METIS "
                        "runs once at the chosen chunk count) or auto (both, the lower modelled cost); default range")
    o.add_argument("--reorganize", choices=REORGANIZE_MODES, default="auto",
                   help="reorder chunks into batches (HongTu Algorithm 4): on, off, or auto (when the modelled "
                        "cost drops); default auto")
    _add_plan_dir(o)
    mb = t.add_argument_group("minibatch engine (XGNN)")
    mb.add_argument("--batch-size", type=int, default=1024, help="seed vertices per mini-batch (default 1024)")
    mb.add_argument("--fanouts", metavar="LIST",
                    help="neighbours sampled per hop, the seeds' hop first, -1 for all (default 15,10 for 2 layers)")
    mb.add_argument("--eval-fanouts", metavar="LIST",
                    help="sampled evaluation with these fanouts (default: exact layer-wise full-neighbour inference)")
    mb.add_argument("--sample-norm", choices=SAMPLE_NORMS, default="sampled",
                    help="GCN's degrees on a sampled block: sampled (each vertex's degree in the sample, as PyG's "
                         "GCNConv on a sampled subgraph) or graph (the whole graph's, as full-graph training); each "
                         "vertex keeps one self-loop outside the fanout. Default sampled")
    mb.add_argument("--gpu-graph-ratio", type=float, metavar="R",
                    help="fraction of vertices, hottest first, whose neighbour lists live on the devices "
                         "(default: what half of --gpu-memory holds, topology before features)")
    mb.add_argument("--gpu-feature-ratio", type=float, metavar="R",
                    help="fraction of vertices, hottest first, whose features live on the devices (default: what "
                         "the rest of half of --gpu-memory holds after the topology)")
    mb.add_argument("--shares", metavar="LIST",
                    help="fraction of every global batch each --devices trainer takes, e.g. 0.2,0.8 for a CPU "
                         "beside a GPU (each in (0, 1), summing to 1; default equal)")
    mb.add_argument("--hotness", choices=["degree", "presample"], default="degree",
                    help="rank vertices for device memory by out-degree or by access counts of a few sampled "
                         "batches (default degree)")
    hy = t.add_argument_group("hybrid engine (HyScale-GNN; also reads the minibatch flags above)")
    _add_hybrid_args(hy)
    tp = t.add_argument_group("taskparallel engine (NeutronTask; models dgcn, dgat)")
    tp.add_argument("--dependency", choices=["exact", "skip"], default="exact",
                    help="exact: every T task before the first P task (the in-memory model exactly); skip: "
                         "Algorithm 1, edges from later subgraphs of the epoch skipped, T and P overlap (default "
                         "exact)")
    tp.add_argument("--subgraphs", type=int, metavar="S",
                    help="subgraphs per epoch (default: the fewest, at least 2, that fit --gpu-memory); --chunks "
                         "sets the chunks per subgraph (default: the P group size)")
    tp.add_argument("--t-devices", type=int, metavar="N",
                    help="devices of --devices that run the T tasks (default: the scheduling model, Eqs. 7-8)")
    ds = t.add_argument_group("distributed engine (torchrun, or --ranks)")
    ds.add_argument("--ranks", type=int, metavar="R",
                    help="start R ranks on this machine (without torchrun; under torchrun: the job's size)")
    ds.add_argument("--strategy", choices=list(STRATEGIES), default="micrograph",
                    help="micrograph: the model moves to the features (HopGNN, default); model-centric: the "
                         "features move to the model (DistDGL)")
    ds.add_argument("--pregather", choices=["on", "off"], default="on",
                    help="micrograph: fetch an iteration's remote features in one exchange (default on)")
    ds.add_argument("--merge", default="auto", metavar="off|auto|K",
                    help="micrograph: time-step merging: auto (from epoch 3, after a warm-up and a baseline "
                         "epoch, while epochs get 5%% faster; default), off, or K merges")
    ds.add_argument("--timeout", type=float, default=180.0, metavar="S",
                    help="seconds a collective may wait before the job stops (default 180)")
    ds.add_argument("--plan", metavar="FILE",
                    help="a partition plan (gnnscale partition --partitions R) with one part per rank; default: "
                         "partition with --partition-method, reusing a saved plan")
    ck = t.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint", metavar="DIR",
                    help="keep DIR/checkpoint.pt (model, optimiser, epoch, best epoch, records, engine state), "
                         "written atomically every --checkpoint-every epochs and after the last")
    ck.add_argument("--checkpoint-every", type=int, default=1, metavar="N", help="epochs between checkpoints "
                    "(default 1)")
    ck.add_argument("--checkpoint-iterations", type=int, default=None, metavar="N",
                    help="distributed: also checkpoint every N iterations within an epoch (default 100; 0: at "
                         "epoch ends only)")
    ck.add_argument("--resume", action="store_true",
                    help="go on from --checkpoint DIR if it holds a checkpoint (same model settings; --epochs is "
                         "the total); the metrics file continues the old run's")
    ck.add_argument("--save-model", metavar="PATH",
                    help="write the model at its best epoch (the weights the reported test accuracy comes from) "
                         "for 'gnnscale predict' and gnnscale.load_model; --checkpoint DIR also keeps DIR/model.pt")
    t.add_argument("--metrics", metavar="FILE", help="write JSON Lines: one object per epoch, then a summary")
    t.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")
    t.set_defaults(func=cmd_train)

    pa = sub.add_parser("partition", aliases=["plan"],
                        help="plan without training: two-level partition (offload), task assignment "
                             "(taskparallel) or pipeline prediction (hybrid)")
    _add_dataset_args(pa, required=True)
    pa.add_argument("--partitions", type=int, default=1, help="level-1 partitions m (default 1)")
    pa.add_argument("--chunks", type=int, default=1, help="destination chunks per partition n (default 1)")
    pa.add_argument("--method", choices=PARTITION_METHODS, default="metis", help="level-1 partitioner")
    pa.add_argument("--chunker", choices=CHUNKERS, default="range",
                    help="level-2 splitter: range (edge-balanced) or metis (fewer shared rows); default range")
    _add_plan_dir(pa)
    pa.add_argument("--engine", choices=["offload", "taskparallel", "hybrid"], default="offload",
                    help="offload: the two-level plan (default); taskparallel: the task assignment, per-device "
                         "memory estimate and replication factors (with --model, --layers, --hidden, --devices, "
                         "--t-devices, --subgraphs, --gpu-memory); hybrid: the performance model's initial split "
                         "and per-stage times (with --model, --layers, --hidden, --devices, --batch-size, "
                         "--fanouts, --shares, --threads)")
    pa.add_argument("--model", choices=list(ALL_MODELS),
                    help="taskparallel: decoupled model (default dgcn); hybrid: layer type (default gcn)")
    pa.add_argument("--layers", type=int, default=2, help="taskparallel, hybrid: layers (default 2)")
    pa.add_argument("--hidden", type=int, default=64, help="taskparallel, hybrid: hidden width (default 64)")
    pa.add_argument("--devices", metavar="LIST",
                    help="taskparallel: devices (default: cpu); hybrid: cpu and the accelerators (default: cpu and "
                         "every GPU)")
    pa.add_argument("--batch-size", type=int, default=1024, help="hybrid: seeds per global batch (default 1024)")
    pa.add_argument("--fanouts", metavar="LIST", help="hybrid: neighbours per hop (default 15,10 for 2 layers)")
    pa.add_argument("--shares", metavar="LIST", help="hybrid: the split to predict (default: the model's)")
    pa.add_argument("--threads", metavar="S,L,T", help="hybrid: sampler, loader, CPU trainer threads")
    pa.add_argument("--t-devices", type=int, metavar="N", help="taskparallel: devices for the T tasks")
    pa.add_argument("--subgraphs", type=int, metavar="S", help="taskparallel: subgraphs per epoch")
    pa.add_argument("--gpu-memory", "--memory-budget", dest="gpu_memory", metavar="GIB",
                    help="taskparallel: device memory budget (default: what is free)")
    pa.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    pa.set_defaults(func=cmd_partition)

    i = sub.add_parser("info", help="print size, degree statistics and memory footprint of a dataset")
    _add_dataset_args(i, required=True)
    i.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    i.set_defaults(func=cmd_info)

    pr = sub.add_parser("predict", help="predict every vertex's class with a saved model")
    _add_dataset_args(pr, required=True)
    pr.add_argument("--model", required=True, metavar="PATH", help="a model written by 'train --save-model'")
    pr.add_argument("--out", required=True, metavar="FILE", help="predicted labels: .npy, .pt or .csv")
    pr.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    pr.add_argument("--engine", choices=["auto", *ENGINES], default="auto",
                    help="inference path: auto, or an engine (offload predicts chunk by chunk under --gpu-memory; "
                         "not distributed)")
    pr.add_argument("--gpu-memory", "--memory-budget", dest="gpu_memory", metavar="GIB",
                    help="device memory the engine may use (default: what is free)")
    pr.add_argument("--devices", metavar="LIST", help="comma-separated devices for multi-device engines")
    pr.add_argument("--partitions", type=int, default=1, help="offload: level-1 partitions (default 1)")
    pr.set_defaults(func=cmd_predict)
    r = sub.add_parser("report", help="plot or tabulate one or more metrics files (loss, accuracy, time, memory, "
                                      "bytes moved per epoch)")
    r.add_argument("runs", nargs="+", metavar="RUN.jsonl", help="metrics files written by 'train --metrics'")
    r.add_argument("--out", metavar="FILE", help="PNG to write (needed for --format png)")
    r.add_argument("--format", choices=["png", "md"], default="png",
                   help="png: a figure of panels, runs overlaid (needs matplotlib); md: Markdown tables on stdout "
                        "(default png)")
    r.set_defaults(func=cmd_report)
    c = sub.add_parser("convert", help="write a dataset in gnnscale's memory-mappable directory format")
    _add_dataset_args(c, required=True)
    c.add_argument("--out", required=True, metavar="DIR", help="new directory to create")
    c.set_defaults(func=cmd_convert)
    return parser


# ------------------------------------------------------------------------------------------------ train
class _MetricsWriter:
    """JSON Lines to FILE, one record per finished epoch, flushed as it is written (an interrupted or failed run
    keeps the epochs it finished; the summary record comes last, only when training ends). FILE is created at the
    first record, so bad input that stops a run before its first epoch leaves nothing behind."""

    def __init__(self, path: str):
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"--metrics {path} is a directory")
        if not self.path.parent.is_dir():
            raise ConfigError(f"--metrics {path}: directory {self.path.parent} does not exist")
        if not os.access(self.path.parent, os.W_OK) or (self.path.exists() and not os.access(self.path, os.W_OK)):
            raise ConfigError(f"--metrics {path}: not writable")
        self.fh: Any = None

    def write(self, record: dict[str, Any]) -> None:
        if self.fh is None:
            self.fh = open(self.path, "w")  # noqa: SIM115 -- kept open across epochs, closed by close()
        self.fh.write(json.dumps(_finite(record), allow_nan=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def _finite(v: Any) -> Any:
    """``v`` with NaN and infinities as ``None`` (JSON has no NaN: ``JSON.parse`` and strict parsers reject it)."""
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _fmt(v: float | None) -> str:
    return "  n/a " if v is None else f"{v:.4f}"


def _device_list(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(d.strip() for d in text.split(","))
    if not all(items):
        raise ConfigError(f"--devices {text!r}: give a comma-separated list such as cuda:0,cuda:1")
    return items


def _num_list(flag: str, text: str | None, kind: type[float] | type[int], example: str) -> Any:
    """``a,b,c`` as a tuple of ``kind``; ``None`` stays ``None``; anything else is one error naming the flag."""
    if text is None:
        return None
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise ConfigError(f"{flag} {text!r}: give comma-separated {what} such as {example}") from None


# the flags only some engines read (``--devices`` and ``--gpu-memory`` matter to several, so they are not listed)
ENGINE_FLAGS: dict[str, tuple[str, ...]] = {
    "--partitions": ("offload",), "--chunks": ("offload", "taskparallel"),
    "--partition-method": ("offload", "distributed"),
    "--gather": ("offload",), "--dedup": ("offload",), "--chunker": ("offload",), "--reorganize": ("offload",),
    "--plan-dir": ("offload", "distributed"), "--batch-size": ("minibatch", "hybrid", "distributed"),
    "--fanouts": ("minibatch", "hybrid", "distributed"), "--ranks": ("distributed",), "--strategy": ("distributed",),
    "--pregather": ("distributed",), "--merge": ("distributed",), "--timeout": ("distributed",),
    "--plan": ("distributed",),
    "--eval-fanouts": ("minibatch", "hybrid"), "--gpu-graph-ratio": ("minibatch", "hybrid"),
    "--gpu-feature-ratio": ("minibatch",), "--hotness": ("minibatch",), "--shares": ("minibatch", "hybrid"),
    "--drm": ("hybrid",), "--threads": ("hybrid",), "--dependency": ("taskparallel",),
    "--subgraphs": ("taskparallel",), "--t-devices": ("taskparallel",), "--heads": ("gat",),
}


def ignored_flags(args: argparse.Namespace, engine: str) -> list[str]:
    """The engine-specific flags given (set to something other than their default) that ``engine`` does not read
    (``--heads``: only GAT reads it)."""
    defaults = build_parser().parse_args(["train"])
    out = []
    for flag, users in ENGINE_FLAGS.items():
        dest = flag.lstrip("-").replace("-", "_")
        if getattr(args, dest) == getattr(defaults, dest):
            continue
        if flag == "--heads":
            if args.model != "gat":
                out.append(flag)
        elif engine not in users:
            out.append(flag)
    return out


def _warm_imports() -> None:
    with contextlib.suppress(Exception):
        importlib.import_module("torch._dynamo")


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from gnnscale.checkpoint import check_checkpoint_args
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.plan.memory import parse_budget
    from gnnscale.train import TrainConfig, check_trainable, resolve_devices, train

    config = TrainConfig(
        model=args.model, layers=args.layers, hidden=args.hidden, heads=args.heads, dropout=args.dropout,
        lr=args.lr, weight_decay=args.weight_decay, epochs=args.epochs, seed=args.seed, engine=args.engine,
        memory_budget=None if args.gpu_memory is None else parse_budget(args.gpu_memory),
        partitions=args.partitions, chunks=args.chunks, partition_method=args.partition_method, gather=args.gather,
        plan_dir=args.plan_dir, devices=_device_list(args.devices), dedup=args.dedup, chunker=args.chunker,
        reorganize=args.reorganize, batch_size=args.batch_size,
        fanouts=_num_list("--fanouts", args.fanouts, int, "15,10"),
        eval_fanouts=_num_list("--eval-fanouts", args.eval_fanouts, int, "15,10"),
        sample_norm=args.sample_norm,
        gpu_graph_ratio=args.gpu_graph_ratio, gpu_feature_ratio=args.gpu_feature_ratio, hotness=args.hotness,
        dependency=args.dependency, subgraphs=args.subgraphs, t_devices=args.t_devices,
        shares=_num_list("--shares", args.shares, float, "0.25,0.75"), drm=args.drm,
        threads=_num_list("--threads", args.threads, int, "1,1,2"),
        ranks=args.ranks, strategy=args.strategy, pregather=args.pregather, merge=args.merge, timeout=args.timeout,
        plan=args.plan,
    )
    check_checkpoint_args(args.checkpoint, args.checkpoint_every, args.resume)
    if args.save_model and (Path(args.save_model).is_dir() or not Path(args.save_model).parent.is_dir()):
        raise ConfigError(f"--save-model {args.save_model}: give a file path in an existing folder")
    if args.checkpoint_iterations and args.checkpoint is None:
        raise ConfigError("--checkpoint-iterations needs --checkpoint DIR (where to write)")
    rank = 0
    if config.engine == "distributed":
        from gnnscale.distributed.launch import launched

        if not launched():
            if args.ranks is None:
                raise ConfigError("--engine distributed runs as a job of ranks: start it with torchrun (torchrun "
                                  "--nproc-per-node R -m gnnscale train --engine distributed ...) or give --ranks R "
                                  "to start R ranks on this machine")
            if args.metrics:
                _MetricsWriter(args.metrics)  # a bad path fails here, before any rank starts
            from gnnscale.train import rank_device

            rank_device(args.device, args.ranks, 0)  # one GPU per rank: say so before any rank starts
            if args.plan is not None:
                from gnnscale.engines.distributed import load_rank_plan

                load_rank_plan(args.plan, args.ranks)
            from gnnscale.distributed.launch import run_ranks

            return run_ranks(args.argv, args.ranks)
        rank = int(os.environ["RANK"])
        if rank != 0:  # rank 0 reports; the others speak only of their own failures (stderr)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- for the rest of this rank's life
            args.metrics, args.save_model, args.quiet = None, None, True
    device = resolve_devices(config, args.device)
    if args.device == "auto" and not config.devices and device.type == "cpu":
        print("no CUDA device found: training on CPU (--device cpu says so and silences this)")
    writer = _MetricsWriter(args.metrics) if args.metrics else None
    progress.enable(not args.quiet and sys.stderr.isatty())
    # torch's optimisers import torch._dynamo (seconds) when the engine is built: import it while the data loads
    threading.Thread(target=_warm_imports, daemon=True, name="gnnscale-imports").start()
    timings: dict[str, float] = {}
    try:
        with progress.stage("load", timings):
            graph = load_dataset(args.dataset, args.root, seed=args.seed)
        check_trainable(graph)
        print(f"dataset {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
              f"{graph.num_features} features, {graph.num_classes} classes")
        bar = tqdm(total=config.epochs, unit="epoch", file=sys.stderr, leave=False,
                   disable=args.quiet or not sys.stderr.isatty())

        def on_epoch(rec: dict[str, Any]) -> None:
            if writer:
                writer.write(rec)
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", val=_fmt(rec["val_acc"]))
            if not args.quiet:
                tqdm.write(f"epoch {rec['epoch']:>4}/{config.epochs}  loss {rec['loss']:.4f}  "
                           f"train {_fmt(rec['train_acc'])}  val {_fmt(rec['val_acc'])}  "
                           f"test {_fmt(rec['test_acc'])}  {rec['epoch_time_s']:.3f}s", file=sys.stdout)

        def on_start(engine: Any, rejected: dict[str, list[str]], ready: dict[str, float]) -> None:
            for name, reasons in rejected.items():
                print(f"engine {name} rejected: {'; '.join(reasons)}")
            ignored = ignored_flags(args, engine.name)
            if ignored and rank == 0:  # one warning per job, not per rank
                print(f"warning: {', '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} no effect on the "
                      f"{engine.name} engine", file=sys.stderr)
            detail = engine.describe()
            if detail:
                print(detail)
            steps = ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in ready.items() if k != "ready_s")
            print(f"ready to train in {ready['ready_s']:.1f}s ({steps})", flush=True)

        def on_resume(history: list[dict[str, Any]]) -> None:
            print(f"resuming from {args.checkpoint} after epoch {history[-1]['epoch'] if history else 0}")
            bar.update(len(history))
            for rec in history:  # the metrics file continues the old run's (rewritten from the checkpoint)
                if writer:
                    writer.write(rec)

        result = train(graph, config, device, on_epoch=on_epoch, on_start=on_start, timings=timings,
                       checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
                       checkpoint_iterations=args.checkpoint_iterations, resume=args.resume, on_resume=on_resume)
        bar.close()
        s = result.summary
        print(f"engine {result.engine} on {s['device']}, model {config.model}, {config.epochs} epochs "
              f"in {s['total_time_s']:.1f}s")
        if s["best_by"] == "val":
            print(f"test accuracy {_fmt(s['test_acc_at_best_val'])} at best val {_fmt(s['best_val_acc'])} "
                  f"(epoch {s['best_epoch']}); final test accuracy {_fmt(s['final_test_acc'])}")
        else:
            print(f"no validation vertices: best epoch {s['best_epoch']} by training accuracy, test accuracy "
                  f"{_fmt(s['test_acc_at_best_val'])} there; final test accuracy {_fmt(s['final_test_acc'])}")
        last = result.history[-1]
        if "predicted_t_s" in last:
            print(f"task forward times, last epoch (summed over devices): T tasks {last['t_forward_s']:.3f}s "
                  f"measured vs {last['predicted_t_s']:.3g}s predicted by Eq. 5; P tasks {last['p_forward_s']:.3f}s "
                  f"vs {last['predicted_p_s']:.3g}s by Eq. 6 (with recomputation and backward: T "
                  f"{last['t_busy_s']:.3f}s, P {last['p_busy_s']:.3f}s)")
        if s.get("engine_report"):
            _print_stage_table(s["engine_report"])
        if args.save_model:
            from gnnscale.predict import save_model

            print(f"saved the epoch-{s['best_epoch']} model to "
                  f"{save_model(args.save_model, result.model, config, graph, result.best_state)}")
        if writer:
            writer.write(s)
    finally:
        if writer:
            writer.close()
    comm = current_comm()
    if comm is not None:  # a failed job keeps it: main names the failed rank through it
        comm.close()
    return 0


def _print_stage_table(report: dict[str, Any]) -> None:
    """The hybrid engine's predicted and measured seconds per iteration, stage by stage (last epoch)."""
    pred, meas = report["predicted"], report["measured"]
    print(f"per-stage seconds per iteration, last epoch (split {', '.join(f'{x:.3f}' for x in report['split'])}, "
          f"threads {','.join(map(str, report['threads']))}):")
    print(f"  {'stage':<8}{'predicted':>11}{'measured':>11}")
    for k in ("SC", "SA", "Load", "Tran", "TC", "TA", "sync"):
        print(f"  {k:<8}{pred.get(k, 0.0):>11.4f}{meas.get(k, 0.0):>11.4f}")
    print(f"  {'epoch':<8}{pred['epoch_s']:>11.3f}{meas['epoch_s']:>11.3f}")


# ------------------------------------------------------------------------------------------- partition
def cmd_partition(args: argparse.Namespace) -> int:
    import time

    from gnnscale.graph.datasets import load_dataset
    from gnnscale.partition import load_or_chunk, load_or_partition, permute_csr
    from gnnscale.partition.dedup import chunk_rows, comm_volume, default_schedule, reorganize

    if args.engine == "taskparallel":
        return _partition_taskparallel(args)
    if args.engine == "hybrid":
        return _plan_hybrid(args)
    for flag, value in (("--partitions", args.partitions), ("--chunks", args.chunks)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    t0 = time.perf_counter()
    plan, path, reused = load_or_partition(g, args.partitions, args.chunks, args.method, args.seed, args.plan_dir)
    plan = load_or_chunk(plan, g, args.chunks, args.chunker, args.plan_dir)
    seconds = time.perf_counter() - t0
    st = {"dataset": g.name, **plan.stats(g), "seconds": seconds, "reused": reused,
          "plan": None if path is None else str(path)}
    # rows per layer pass under each --dedup mode, as scheduled and reorganised (Algorithm 4), in units of |V|
    ip, ix = permute_csr(g.indptr, g.indices, None, plan.perm, plan.inverse())[:2]
    rows = chunk_rows(ip, ix, plan.chunk_ptr)
    n = max(g.num_nodes, 1)
    for name, sched in (("", default_schedule(plan.partitions, plan.chunks)),
                        ("reorganized_", reorganize(rows, plan.partitions, plan.chunks, g.num_nodes))):
        vol = comm_volume(rows, sched)
        st[f"{name}rows_per_pass"] = {mode: vol.h2d(mode) / n for mode in ("none", "reuse", "full")}
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"dataset     {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges")
    print(f"plan        {st['partitions']} partition(s) x {st['chunks']} chunk(s), {st['method']}, {args.chunker} "
          f"chunks, "
          f"{'reused' if reused else 'computed'} in {seconds:.1f}s")
    print(f"alpha       {st['alpha']:.3f} (chunk in-neighbour sets a vertex appears in, on average)")
    print(f"edge cut    {100 * st['edge_cut']:.1f}% of edges cross partitions")
    print(f"partitions  {', '.join(f'{s:,}' for s in st['partition_sizes'])} vertices")
    print(f"chunks      max {st['chunk_vertices_max']:,} vertices, max {st['chunk_edges_max']:,} in-edges "
          f"(max/mean {st['chunk_edge_imbalance']:.2f}), max {st['chunk_rows_max']:,} rows with neighbours")
    for name, label in (("", "as split"), ("reorganized_", "reorganized")):
        per = st[f"{name}rows_per_pass"]
        print(f"host->dev   {label}: " + ", ".join(f"--dedup {m} {v:.2f}|V|" for m, v in per.items())
              + " rows per layer pass")
    print(f"saved       {path}" if path is not None else "saved       (plan directory not writable; not saved)")
    return 0


def _plan_hybrid(args: argparse.Namespace) -> int:
    """``gnnscale plan --engine hybrid``: HyScale-GNN's performance model (§V) for this machine, graph and model:
    the initial split, each stage's predicted seconds per iteration, the epoch time and MTEPS, without training."""
    import torch

    from gnnscale.engines.hybrid import HybridEngine
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.nn.model import build_model
    from gnnscale.train import TrainConfig, check_trainable, resolve_devices

    config = TrainConfig(model=args.model or "gcn", layers=args.layers, hidden=args.hidden, engine="hybrid",
                         devices=_device_list(args.devices), batch_size=args.batch_size, seed=args.seed,
                         fanouts=_num_list("--fanouts", args.fanouts, int, "15,10"),
                         shares=_num_list("--shares", args.shares, float, "0.25,0.75"),
                         threads=_num_list("--threads", args.threads, int, "1,1,2"))
    device = resolve_devices(config, "auto")
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    check_trainable(g)
    reasons = HybridEngine.not_supported_reasons(g, config, device)
    if reasons:
        raise ConfigError(f"the hybrid engine cannot train {g.name}: {'; '.join(reasons)}")
    assert g.num_classes is not None
    model = build_model(config.model, g.num_features, config.hidden, g.num_classes, layers=config.layers,
                        dropout=config.dropout, heads=config.heads, seed=config.seed)
    engine = HybridEngine(g, model, config, device)
    n = int(engine.train_ids.numel())
    t = engine.perf.stage_times(config.batch_size, engine.split, engine.threads)
    epoch = engine.perf.epoch_time(n, config.batch_size, engine.split, engine.threads)
    shapes = [engine.perf.cpu_sampling.shape(s * config.batch_size, engine.perf.dims) for s in engine.split]
    from gnnscale.plan.hybrid import mteps

    st = {"dataset": g.name, "engine": "hybrid", "model": config.model,
          "devices": [str(d) for d in engine.devices], "split": engine.split,
          "threads": list(engine.threads.as_tuple()), "batch_size": config.batch_size,
          "fanouts": list(engine.fanouts), "stages_s": t, "iterations": -(-n // config.batch_size),
          "epoch_s": epoch, "mteps": mteps(shapes, t["iteration"]) if t["iteration"] > 0 else None}
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"dataset     {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {n:,} training vertices")
    print(f"trainers    {', '.join(str(d) for d in engine.devices)} (CPU trainer "
          f"{engine.devices[engine.cpu_index]})")
    print(f"split       {', '.join(f'{s:.3f}' for s in engine.split)} of each batch of {config.batch_size} "
          f"({'--shares' if config.shares else 'equal predicted trainer times'})")
    print(f"threads     sampler {engine.threads.sampler}, loader {engine.threads.loader}, CPU trainer "
          f"{engine.threads.trainer} of {torch.get_num_threads()} intra-op threads")
    print("per iteration (s): " + "  ".join(f"{k} {v:.4f}" for k, v in t.items()))
    print(f"epoch       {st['iterations']} iterations, {epoch:.3f}s predicted; "
          f"{st['mteps'] or 0:.2f} MTEPS (Eq. 5)")
    return 0


def _partition_taskparallel(args: argparse.Namespace) -> int:
    """``gnnscale partition --engine taskparallel``: the task assignment, per-device estimates and the replication
    factor of the P group against data parallelism over METIS parts of the same count."""
    import torch

    from gnnscale.graph.datasets import load_dataset
    from gnnscale.partition import partition_graph
    from gnnscale.plan.memory import format_bytes, parse_budget
    from gnnscale.plan.taskparallel import p_group_parts, plan_taskparallel, replication_factor
    from gnnscale.train import TrainConfig, resolve_devices

    config = TrainConfig(model=args.model or "dgcn", layers=args.layers, hidden=args.hidden, engine="taskparallel",
                         devices=_device_list(args.devices or "cpu"), t_devices=args.t_devices,
                         subgraphs=args.subgraphs, chunks=None if args.chunks == 1 else args.chunks, seed=args.seed,
                         memory_budget=None if args.gpu_memory is None else parse_budget(args.gpu_memory))
    device = resolve_devices(config, "auto")
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    plan = plan_taskparallel(g, config, device)

    def factor(parts: int) -> float:
        if parts <= 1:
            return 1.0
        p = partition_graph(g, parts, 1, args.method, args.seed)
        owner = torch.empty(g.num_nodes, dtype=torch.int64)
        owner[p.perm] = torch.repeat_interleave(torch.arange(parts), p.part_ptr[1:] - p.part_ptr[:-1])
        return replication_factor(g, owner)

    n = len(plan.devices)
    group = max(len(s.devices) for s in plan.p_stages)
    st = {"dataset": g.name, "engine": "taskparallel", "model": args.model, "regime": plan.regime,
          "n_t": plan.n_t, "n_p": plan.n_p,
          "stages": [{"tasks": s.label(args.model == "dgat"), "kind": s.kind, "devices": s.devices}
                     for s in (*plan.t_stages, *plan.p_stages)],
          "subgraphs": plan.subgraphs, "chunks_per_subgraph": plan.chunks_per_subgraph,
          "device_estimate_bytes": plan.estimate, "budget": plan.budget,
          "p_group_size": group,
          "p_group_replication": replication_factor(g, p_group_parts(plan, args.seed)) if group > 1 else 1.0,
          "data_parallel_parts": n, "data_parallel_replication": factor(n), "method": args.method}
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"dataset     {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges")
    print(f"assignment  {plan.regime}: N_t={plan.n_t}, N_p={plan.n_p}")
    for s in st["stages"]:
        print(f"  {s['kind']} {s['tasks']:<12} on device(s) " + ", ".join(
            f"{plan.devices[d]}#{d}" for d in s["devices"]))
    print(f"subgraphs   {plan.subgraphs} x {plan.chunks_per_subgraph} chunk(s)")
    print("memory      " + ", ".join(f"#{d} {format_bytes(b)}" for d, b in enumerate(plan.estimate))
          + f" estimated (budget {format_bytes(plan.budget)})")
    print(f"replication P group of {group} (whole chunks per member, reshuffled each epoch; epoch 1): "
          f"{st['p_group_replication']:.2f}; data parallelism over {n} {args.method} parts: "
          f"{st['data_parallel_replication']:.2f}")
    return 0


# ------------------------------------------------------------------------------------------- info/convert
def cmd_info(args: argparse.Namespace) -> int:
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.plan.memory import format_bytes

    progress.enable(sys.stderr.isatty())  # a terminal sees the load and statistics steps tick
    with progress.stage("load"):
        g = load_dataset(args.dataset, args.root, seed=args.seed)
    with progress.stage("statistics"):
        st = g.stats()
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"name        {st['name']}")
    print(f"nodes       {st['nodes']:,}")
    weighted = f", weighted ({st['weights_from'] or 'given'})" if st["weighted"] else ", unweighted"
    sym = st["symmetrized_from_edges"]
    sym = f"; symmetrised on load from {sym:,} listed edges" if sym is not None else ""
    print(f"edges       {st['edges']:,} (directed, in-neighbour CSR; {st['self_loops']:,} self-loops, "
          f"{st['duplicate_edges']:,} duplicates kept as multi-edges{weighted}{sym})")
    print(f"features    {st['features']}")
    print(f"classes     {st['classes']}")
    for d in ("in_degree", "out_degree"):
        s = st[d]
        print(f"{d.replace('_', '-'):<11} min {s['min']:.0f}  mean {s['mean']:.2f}  median {s['median']:.0f}  "
              f"max {s['max']:.0f}")
    print(f"isolated    {st['isolated_nodes']:,}")
    print(f"split       train {st['train_mask']:,}  val {st['val_mask']:,}  test {st['test_mask']:,}")
    b = st["bytes"]
    print(f"memory      {format_bytes(b['total'])} total: topology {format_bytes(b['topology'])}, "
          f"features {format_bytes(b['features'])}, labels+masks {format_bytes(b['labels'] + b['masks'])}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.plan.memory import parse_budget
    from gnnscale.predict import OUTPUT_SUFFIXES, load_model, predict, write_predictions

    if args.engine == "distributed":
        raise ConfigError("predict runs in one process; the distributed engine only trains. A model it saved "
                          "predicts with any other engine (--engine auto, or offload for features beyond memory)")
    out = Path(args.out)
    if out.suffix not in OUTPUT_SUFFIXES or not out.parent.is_dir():
        raise ConfigError(f"--out {out}: give a .npy, .pt or .csv file in an existing folder")
    model, config = load_model(args.model)
    options: dict[str, Any] = {"engine": args.engine, "partitions": args.partitions,
                               "devices": _device_list(args.devices),
                               "memory_budget": None if args.gpu_memory is None else parse_budget(args.gpu_memory)}
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    pred = predict(g, (model, config), args.device, **options)
    write_predictions(out, pred)
    line = f"wrote {out}: {pred.numel():,} predicted labels"
    if g.y is not None and g.test_mask is not None and bool(g.test_mask.any()):
        acc = float((pred[g.test_mask] == g.y[g.test_mask]).float().mean())
        line += f"; test accuracy {acc:.4f}"
    print(line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gnnscale.report import build_panels, markdown, read_run, render_png

    runs = [read_run(p) for p in args.runs]
    if args.format == "md":
        print(markdown(runs))
        return 0
    if not args.out:
        raise ConfigError("report --format png needs --out FILE.png (or use --format md)")
    out = render_png(build_panels(runs), args.out)
    print(f"wrote {out}: {len(runs)} run(s)")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from gnnscale.graph import io
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.plan.memory import format_bytes

    out = Path(args.out)
    if out.exists():  # checked before the (possibly slow) load
        raise ConfigError(f"output directory {out} already exists; choose a new path")
    for stale in io.remove_stale_partials(out):
        print(f"removed {stale}: partial output of an interrupted convert", file=sys.stderr)
    progress.enable(sys.stderr.isatty())
    with progress.stage("load"):
        g = load_dataset(args.dataset, args.root, seed=args.seed)
    with progress.stage("write"):
        io.save(g, out)
    print(f"wrote {out}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {format_bytes(g.nbytes()['total'])}")
    return 0


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks remove half-written files."""


_SIGNALLED: dict[str, int] = {}
"""The signal that ended the run, set before its exception is raised: C extensions that run Python callbacks
(pymetis) turn any exception into their own RuntimeError, and the run must still end as the signal says."""


def _on_sigterm(signum: int, frame: Any) -> None:
    _SIGNALLED["signal"] = signum
    raise _Terminated()


def _on_sigint(signum: int, frame: Any) -> None:
    _SIGNALLED["signal"] = signum
    raise KeyboardInterrupt


def _line(text: str) -> None:
    """One line to stderr in one write (the ranks of a job share the terminal: lines must not interleave)."""
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), (text + "\n").encode())


def _rank_error(msg: str) -> None:
    """In a distributed job, leave this rank's error where its peers look when it is gone."""
    comm = current_comm()
    if comm is not None:
        comm.record_error(msg)


def _quiet_rank() -> bool:
    """A rank other than 0 started by ``--ranks``: bad input is found by every rank alike, and rank 0 says it."""
    from gnnscale.distributed.launch import LAUNCHED_BY

    return bool(os.environ.get(LAUNCHED_BY)) and os.environ.get("RANK", "0") != "0"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gnnscale`` command; returns the exit status."""
    import signal
    import threading

    previous = None
    _SIGNALLED.clear()
    if threading.current_thread() is threading.main_thread():
        previous = (signal.signal(signal.SIGTERM, _on_sigterm), signal.signal(signal.SIGINT, _on_sigint))
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        return int(args.func(args))
    except GnnscaleError as exc:
        msg = " ".join(str(exc).split())
        _rank_error(msg)
        if not _quiet_rank():
            print(f"error: {msg}", file=sys.stderr)
        return USAGE_ERROR
    except RankFailure as exc:
        _line(f"error: {exc}")
        from gnnscale.distributed.launch import PEER_FAILED

        return PEER_FAILED
    except KeyboardInterrupt:
        from gnnscale.distributed.launch import LAUNCHED_BY

        if not os.environ.get(LAUNCHED_BY):  # under --ranks the launcher says it, once
            print("error: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        comm = current_comm()
        if comm is not None:  # a launcher stopping this rank because another failed: name that one
            _line(f"error: {comm.failure('stopped by the launcher')}")
        else:
            print("error: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        # the reader went away (gnnscale info ... | head): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:
        signum = _SIGNALLED.get("signal")
        if signum is None:
            _rank_error(f"{type(exc).__name__}: {exc}")
            raise
        # a signal's exception, rewrapped by an extension module on its way up
        print(f"error: {'interrupted' if signum == signal.SIGINT else 'terminated'}", file=sys.stderr)
        return 128 + signum
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])


if __name__ == "__main__":
    sys.exit(main())
