"""The ``gnnscale`` command's flags: one parser, one sub-parser per command, one flag group per engine."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any, NoReturn

from gnnscale.config import (
    MODES,
    OPTION_GROUPS,
    STRATEGIES,
    ChunkOptions,
    DistributedOptions,
    GatherOptions,
    HybridOptions,
    MiniBatchOptions,
    ModelOptions,
    OffloadOptions,
    PartitionOptions,
    RunOptions,
    SamplingOptions,
    StoreOptions,
    TaskParallelOptions,
    TrainConfig,
)
from gnnscale.engines import ENGINES, model_refusers, readers_of
from gnnscale.errors import GnnscaleError
from gnnscale.nn import ALL_MODELS, JK_MODES, NORMS
from gnnscale.partition import CHUNKERS, PARTITION_METHODS
from gnnscale.partition.dedup import DEDUP_MODES, REORGANIZE_MODES
from gnnscale.runtime.host import HOST_ALLOCATORS
from gnnscale.sample import SAMPLE_NORMS
from gnnscale.store import GATHER_METHODS
from gnnscale.version import __version__

USAGE_ERROR = 2
"""Exit status of bad input (flags, files, graphs, budgets)."""


class _UsageError(GnnscaleError):
    pass


INT64_MAX = 2**63 - 1
"""The largest integer a flag takes: the int64 the tensors and numpy arrays hold it in."""
MAX_SEED = 2**32 - 1
"""The largest ``--seed``: numpy's ``np.random.seed`` and PyG's ``seed_everything`` take ``[0, 2**32)``."""


def _int(text: str) -> int:
    """An integer flag's value, refused at parse time beyond int64 (not an OverflowError deep inside torch)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"{text} is out of range: give at most {INT64_MAX} (int64)")
    return value


def _float(text: str) -> float:
    """A number flag's value, refused at parse time unless finite (``inf``, ``nan`` and ``1e400`` are no learning
    rate, ratio or timeout)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text} is out of range: give a seed from 0 to {MAX_SEED}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``error: ...`` line (raised, so main() reports it like any other)."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog.split()[-1]}: {message}")


def _refusers(**option: Any) -> str:
    """The engines that refuse a gcn with ``option`` (their capabilities, as the registry reads them)."""
    return ", ".join(model_refusers(TrainConfig(**option))) or "no engine"


def _add_dataset_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--dataset", required=required, default=None if required else "csbm", metavar="SPEC",
                   help="csbm[:opts], kronecker[:opts], planetoid:<name>, npz:<file>, edgelist:<file>, "
                        "ogb:<name>, or a directory written by 'gnnscale convert' (default: csbm)")
    p.add_argument("--root", metavar="DIR", help="folder with Planetoid/OGB files; fallback folder for file paths")
    p.add_argument("--seed", type=_seed, default=0,
                   help=f"seed for weights, dropout and random splits, 0 to {MAX_SEED} (default 0)")


def _add_keep_ids(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-ids", action="store_true",
                   help="edge lists: keep the vertex ids as given (max id + 1 vertices; gaps become isolated "
                        "vertices) instead of numbering the vertices 0..n-1 in id order (the default, said in a "
                        "note; the original ids are kept and written by predict)")


def _add_model_factory(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--model-factory", metavar="MODULE:FUNCTION",
                   help=f"{what}. FUNCTION(in_features, num_classes) of MODULE returns a gnnscale.nn.Stack or a PyG "
                        "BasicGNN. MODULE is imported (from the working folder or PYTHONPATH): it is code you chose to "
                        "run. A saved model keeps this name only, and never imports it (docs/own-model.md)")


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


def _add_host_memory(p: Any) -> None:
    p.add_argument("--host-memory", metavar="SIZE",
                   help="host memory the run may use beyond its base (the loaded process, the engine's topology "
                        "index and kernels: 'gnnscale plan --host-memory' prints it), e.g. 32MB, 2GiB, a plain "
                        "number is GiB: the peak resident memory stays under base + SIZE; a converted directory's "
                        "features are read from disk behind a host cache, offload's activations past it spill to "
                        "--scratch (default: no bound, everything in memory)")


def _option_groups(train: argparse.ArgumentParser) -> dict[type, Any]:
    """One flag group per option group of :class:`~gnnscale.config.TrainConfig`: an engine's own group is titled
    by the engine, a group several engines read names them; the model's and the run's flags stay ungrouped."""
    out: dict[type, Any] = {ModelOptions: train, RunOptions: train}
    for options in OPTION_GROUPS:
        if options in out:
            continue
        readers = readers_of(options)
        doc = (options.__doc__ or "").strip().rstrip(".")
        if len(readers) == 1:
            out[options] = train.add_argument_group(f"{readers[0]} engine", doc)
        else:
            name = options.__name__.removesuffix("Options").lower()
            out[options] = train.add_argument_group(f"{name} options (engines {', '.join(readers)})", doc)
    return out


def _add_partition_args(pa: argparse.ArgumentParser, engine_default: str | None) -> None:
    _add_dataset_args(pa, required=True)
    pa.add_argument("--partitions", type=_int, default=1, help="level-1 partitions m (default 1)")
    pa.add_argument("--chunks", type=_int, help="destination chunks per partition n (partition: default 1; plan: "
                                              "the fewest that fit the budget)")
    pa.add_argument("--method", choices=PARTITION_METHODS, default="metis", help="level-1 partitioner")
    pa.add_argument("--chunker", choices=CHUNKERS, default="range",
                    help="level-2 splitter: range (edge-balanced) or metis (fewer shared rows); default range")
    _add_plan_dir(pa)
    pa.add_argument("--engine", choices=[n for n, cls in ENGINES.items() if cls.plan_kind], default=engine_default,
                    help="offload: the two-level plan (default); taskparallel: the task assignment, per-device "
                         "memory estimate and replication factors (with --model, --layers, --hidden, --devices, "
                         "--t-devices, --subgraphs, --gpu-memory); hybrid: the performance model's initial split "
                         "and per-stage times (with --model, --layers, --hidden, --devices, --batch-size, "
                         "--fanouts, --shares, --threads); distributed: the predicted epoch of both strategies "
                         "(plan --machines N --devices-per-machine G --network RATE)")
    pa.add_argument("--model", choices=list(ALL_MODELS),
                    help="taskparallel: decoupled model (default dgcn); hybrid: layer type (default gcn)")
    _add_model_factory(pa, "plan, taskparallel, hybrid: price a model of your own instead of --model (the offload "
                           "partition plan does not depend on the model)")
    pa.add_argument("--layers", type=_int, default=2, help="taskparallel, hybrid: layers (default 2)")
    pa.add_argument("--hidden", type=_int, default=64, help="taskparallel, hybrid: hidden width (default 64)")
    pa.add_argument("--devices", metavar="LIST",
                    help="taskparallel: devices (default: cpu); hybrid: cpu and the accelerators (default: cpu and "
                         "every GPU)")
    pa.add_argument("--batch-size", type=_int, default=1024, help="hybrid: seeds per global batch (default 1024)")
    pa.add_argument("--fanouts", metavar="LIST", help="hybrid: neighbours per hop (default 15,10 for 2 layers)")
    pa.add_argument("--shares", metavar="LIST", help="hybrid: the split to predict (default: the model's)")
    pa.add_argument("--threads", metavar="S,L,T", help="hybrid: sampler, loader, CPU trainer threads")
    pa.add_argument("--t-devices", type=_int, metavar="N", help="taskparallel: devices for the T tasks")
    pa.add_argument("--subgraphs", type=_int, metavar="S", help="taskparallel: subgraphs per epoch")
    pa.add_argument("--gpu-memory", "--memory-budget", dest="gpu_memory", metavar="GIB",
                    help="taskparallel: device memory budget (default: what is free)")
    pa.add_argument("--json", action="store_true", help="print the statistics as one JSON object")


def _add_whatif_args(pl: argparse.ArgumentParser) -> None:
    w = pl.add_argument_group("what-if past this machine (HopGNN's traffic model; offload and minibatch: G devices)")
    w.add_argument("--machines", type=_int, metavar="N",
                   help="distributed: predict an epoch on N machines (1 to 64), both strategies")
    w.add_argument("--devices-per-machine", type=_int, metavar="G",
                   help="distributed: ranks per machine, sharing its cores and link (default 1); offload, minibatch: "
                        "devices sharing the host bus")
    w.add_argument("--network", metavar="RATE[,latency=T]",
                   help="each machine's link, e.g. 25Gbit,latency=50us or 3GB/s (default: this machine's measured "
                        "rate between processes)")


LIST_FLAGS = ("--fanouts", "--eval-fanouts")
"""Flags whose lists may start with a negative number (``-1`` for every neighbour)."""
_NEGATIVE_LIST = re.compile(r"-\d+(,-?\d+)*")


def join_negative_lists(argv: list[str]) -> list[str]:
    """``--fanouts -1,-1`` as ``--fanouts=-1,-1``: argparse takes ``-1,-1`` for an option, not a value."""
    out: list[str] = []
    for tok in argv:
        if out and out[-1] in LIST_FLAGS and _NEGATIVE_LIST.fullmatch(tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gnnscale", description="Train GNNs on graphs bigger than one GPU's memory.")
    parser.add_argument("--version", action="version", version=f"gnnscale {__version__}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{train,predict,partition,plan,info,report,convert}")
    _add_train_parser(sub)
    _add_partition_parser(sub)
    _add_plan_parser(sub)
    _add_info_parser(sub)
    _add_predict_parser(sub)
    _add_report_parser(sub)
    _add_convert_parser(sub)
    return parser


def _add_train_parser(sub: Any) -> None:
    t = sub.add_parser("train", help="train a model and report accuracy")
    _add_model_and_run_args(t)
    group = _option_groups(t)
    _add_offload_args(t, group)
    _add_sampling_args(group)
    _add_host_memory(t.add_argument_group(
        f"host memory (engines {', '.join(n for n, cls in ENGINES.items() if cls.honours_host_memory())})",
        "bound the process's peak resident memory: a converted directory's features read from disk"))
    _add_hybrid_args(group[HybridOptions])
    _add_taskparallel_args(group[TaskParallelOptions])
    _add_distributed_args(group[DistributedOptions])
    _add_checkpoint_args(t)
    t.add_argument("--metrics", metavar="FILE", help="write JSON Lines: one object per epoch, then a summary")
    t.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")
    _add_recalibrate(t)
    t.set_defaults(command="train")


def _add_model_and_run_args(t: argparse.ArgumentParser) -> None:
    """train's ungrouped flags: the data, the model's (ModelOptions) and the run's (RunOptions)."""
    _add_dataset_args(t, required=False)
    _add_keep_ids(t)
    t.add_argument("--model", choices=list(ALL_MODELS), default="gcn",
                   help="layer type, or a decoupled model (T tasks, then P tasks): dgcn, dgat (default gcn)")
    _add_model_factory(t, "a model of your own instead of --model (the model flags are then ignored, said in a "
                          "warning)")
    t.add_argument("--layers", type=_int, default=2, help="layers, the last one giving class scores (default 2)")
    t.add_argument("--hidden", type=_int, default=64, help="hidden width (GAT: total over heads; default 64)")
    t.add_argument("--heads", type=_int, default=4, help="GAT attention heads (default 4)")
    t.add_argument("--dropout", type=_float, default=0.5, help="drop probability before every layer (default 0.5)")
    t.add_argument("--input-dropout", type=_float, metavar="P",
                   help="drop probability of the input features (default: --dropout; 0 is PyG's BasicGNN, which "
                        "drops only between layers)")
    t.add_argument("--norm", choices=list(NORMS), default="none",
                   help="normalise each hidden layer's output before its activation (PyG's BasicGNN): batch "
                        "(BatchNorm), layer (LayerNorm per vertex) or none (default none)")
    t.add_argument("--residual", action="store_true",
                   help="each layer adds a bias-free linear map of its input to its output (PyG GATConv's residual); "
                        f"refused by {_refusers(residual=True)}")
    t.add_argument("--jk", choices=list(JK_MODES), default="none",
                   help="jumping knowledge: combine every layer's output (last, cat, max), then a linear layer "
                        "gives the classes; none: the last layer does (default none); refused by "
                        f"{_refusers(jk='cat')}")
    t.add_argument("--lr", type=_float, default=0.01, help="Adam learning rate (default 0.01)")
    t.add_argument("--weight-decay", type=_float, default=5e-4, help="Adam weight decay (default 5e-4)")
    t.add_argument("--epochs", type=_int, default=100, help="training epochs (default 100)")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    t.add_argument("--engine", choices=["auto", *ENGINES], default="auto",
                   help="auto: the first engine that fits, in this order (never minibatch); default auto. "
                        "Each engine's own flags are in its group below; a flag of a group the engine does not read "
                        "has no effect on it (said once, as a warning)")
    t.add_argument("--mode", choices=list(MODES), default="auto",
                   help="the training mode --engine auto chooses in: full (full-graph engines), sampled (mini-batch "
                        "engines) or distributed; default auto: full, or distributed with --ranks")
    t.add_argument("--gpu-memory", "--memory-budget", dest="gpu_memory", metavar="GIB",
                   help="device memory the engine may use: GiB (e.g. 6) or a size (512MB); default: what is free")
    t.add_argument("--host-allocator", choices=list(HOST_ALLOCATORS), default="auto",
                   help="freed large host blocks: retain (kept for reuse: no page faults on the next epoch's "
                        "temporaries, a larger resident peak) or system (glibc's default); default auto: retain "
                        "when training on the CPU with room (the engine's host estimate at most half the free "
                        "memory) and no per-edge layer (GAT: there the retained heap fragments, so auto leaves "
                        "glibc's default)")


def _add_offload_args(t: argparse.ArgumentParser, group: dict[type, Any]) -> None:
    o = group[OffloadOptions]
    o.add_argument("--partitions", type=_int, default=1, help="level-1 partitions m (default 1)")
    group[ChunkOptions].add_argument("--chunks", type=_int,
                                     help="chunks per partition n (default: the fewest that fit --gpu-memory)")
    group[PartitionOptions].add_argument("--partition-method", choices=PARTITION_METHODS, default="metis",
                   help="level-1 partitioner (default metis)")
    group[GatherOptions].add_argument("--gather", choices=["auto", *GATHER_METHODS], default="auto",
                   help="how chunk rows reach the GPU: index_select (CPU gather + async copy) or uva (Triton "
                        "kernel reading pinned host memory); default auto")
    t.add_argument("--devices", metavar="LIST",
                   help="comma-separated devices (e.g. cuda:0,cuda:1): offload runs partition i on device i mod "
                        "count; minibatch runs one trainer per device; default: --device")
    o.add_argument("--dedup", choices=DEDUP_MODES, default="auto",
                   help="host->device deduplication: none, reuse (keep rows shared with the previous chunk), "
                        "full (HongTu: load each batch's rows once, share them, reuse them) or auto (full on "
                        "accelerators, none on the CPU, where there is no transfer to save); default auto")
    o.add_argument("--chunker", choices=["auto", *CHUNKERS], default="range",
                   help="how partitions split into chunks: range (edge-balanced), metis (fewer shared rows; METIS "
                        "runs once at the chosen chunk count) or auto (both, the lower modelled cost); default range")
    o.add_argument("--reorganize", choices=REORGANIZE_MODES, default="auto",
                   help="reorder chunks into batches (HongTu Algorithm 4): on, off, or auto (when the modelled "
                        "cost drops); default auto")
    o.add_argument("--scratch", metavar="DIR", nargs="?", const="",
                   help="offload with --host-memory: the folder the layer activations and gradients the budget "
                        "cannot hold spill to, as files removed at the end (default: the system's temporary folder); "
                        "without --host-memory nothing spills (said in a warning)")
    _add_plan_dir(group[PartitionOptions])


def _add_sampling_args(group: dict[type, Any]) -> None:
    mb = group[MiniBatchOptions]
    sampling = group[SamplingOptions]
    sampling.add_argument("--batch-size", type=_int, default=1024, help="seed vertices per mini-batch (default 1024)")
    sampling.add_argument("--fanouts", metavar="LIST",
                    help="neighbours sampled per hop, the seeds' hop first, -1 for all (default 15,10 for 2 layers)")
    mb.add_argument("--eval-fanouts", metavar="LIST",
                    help="sampled evaluation with these fanouts (default: exact layer-wise full-neighbour inference)")
    sampling.add_argument("--sample-norm", choices=SAMPLE_NORMS, default="sampled",
                    help="GCN's degrees on a sampled block: sampled (each vertex's degree in the sample, as PyG's "
                         "GCNConv on a sampled subgraph) or graph (the whole graph's, as full-graph training); each "
                         "vertex keeps one self-loop outside the fanout. Default sampled")
    mb.add_argument("--gpu-graph-ratio", type=_float, metavar="R",
                    help="fraction of vertices, hottest first, whose neighbour lists live on the devices "
                         "(default: what half of --gpu-memory holds, topology before features)")
    group[StoreOptions].add_argument("--gpu-feature-ratio", type=_float, metavar="R",
                    help="fraction of vertices, hottest first, whose features live on the devices (default: what "
                         "the rest of half of --gpu-memory holds after the topology)")
    mb.add_argument("--shares", metavar="LIST",
                    help="fraction of every global batch each --devices trainer takes, e.g. 0.2,0.8 for a CPU "
                         "beside a GPU (each in (0, 1), summing to 1; default equal)")
    group[StoreOptions].add_argument("--hotness", choices=["degree", "presample"], default="degree",
                    help="rank vertices for device memory by out-degree or by access counts of a few sampled "
                         "batches (default degree)")


def _add_taskparallel_args(tp: Any) -> None:
    tp.add_argument("--dependency", choices=["exact", "skip"], default="exact",
                    help="exact: every T task before the first P task (the in-memory model exactly); skip: "
                         "Algorithm 1, edges from later subgraphs of the epoch skipped, T and P overlap (default "
                         "exact)")
    tp.add_argument("--subgraphs", type=_int, metavar="S",
                    help="subgraphs per epoch (default: the fewest, at least 2, that fit --gpu-memory); --chunks "
                         "sets the chunks per subgraph (default: the P group size)")
    tp.add_argument("--t-devices", type=_int, metavar="N",
                    help="devices of --devices that run the T tasks (default: the scheduling model, Eqs. 7-8)")


def _add_distributed_args(ds: Any) -> None:
    ds.add_argument("--ranks", type=_int, metavar="R",
                    help="start R ranks on this machine (without torchrun; under torchrun: the job's size)")
    ds.add_argument("--strategy", choices=list(STRATEGIES), default="micrograph",
                    help="micrograph: the model moves to the features (HopGNN, default); model-centric: the "
                         "features move to the model (DistDGL)")
    ds.add_argument("--pregather", choices=["on", "off"], default="on",
                    help="micrograph: fetch an iteration's remote features in one exchange (default on)")
    ds.add_argument("--merge", default="auto", metavar="off|auto|K",
                    help="micrograph: time-step merging: auto (from epoch 3, after a warm-up and a baseline "
                         "epoch, while epochs get 5%% faster; default), off, or K merges")
    ds.add_argument("--timeout", type=_float, default=180.0, metavar="S",
                    help="seconds a collective may wait before the job stops (default 180)")
    ds.add_argument("--plan", metavar="FILE",
                    help="a partition plan (gnnscale partition --partitions R) with one part per rank; default: "
                         "partition with --partition-method, reusing a saved plan")


def _add_checkpoint_args(t: argparse.ArgumentParser) -> None:
    ck = t.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint", metavar="DIR",
                    help="keep DIR/checkpoint.pt (model, optimiser, epoch, best epoch, records, engine state), "
                         "written atomically every --checkpoint-every epochs and after the last")
    ck.add_argument("--checkpoint-every", type=_int, default=1, metavar="N", help="epochs between checkpoints "
                    "(default 1)")
    ck.add_argument("--checkpoint-iterations", type=_int, default=None, metavar="N",
                    help="distributed: also checkpoint every N iterations within an epoch (default 100; 0: at "
                         "epoch ends only)")
    ck.add_argument("--resume", action="store_true",
                    help="go on from --checkpoint DIR if it holds a checkpoint (same model settings; --epochs is "
                         "the total); the metrics file continues the old run's")
    ck.add_argument("--save-model", metavar="PATH",
                    help="write the model at its best epoch (the weights the reported test accuracy comes from) "
                         "for 'gnnscale predict' and gnnscale.load_model; --checkpoint DIR also keeps DIR/model.pt")


def _add_partition_parser(sub: Any) -> None:
    pa = sub.add_parser("partition",
                        help="a partition plan without training: two-level partition (offload), task assignment "
                             "(taskparallel) or pipeline prediction (hybrid)")
    _add_partition_args(pa, engine_default=next(n for n, cls in ENGINES.items() if cls.plan_kind == "partition"))
    pa.set_defaults(command="partition")


def _add_plan_parser(sub: Any) -> None:
    pl = sub.add_parser("plan",
                        help="which engine --engine auto would choose: every engine of the training mode with its "
                             "estimate or the reasons against it (with --engine: that engine's plan, as partition)")
    _add_partition_args(pl, engine_default=None)
    pl.add_argument("--mode", choices=list(MODES), default="auto",
                    help="training mode to plan for: full, sampled or distributed (default auto: full)")
    pl.add_argument("--device", default="auto", help="the training device (default auto)")
    _add_host_memory(pl)
    _add_recalibrate(pl)
    _add_whatif_args(pl)
    pl.set_defaults(command="plan")


def _add_info_parser(sub: Any) -> None:
    i = sub.add_parser("info", help="print size, degree statistics and memory footprint of a dataset")
    _add_dataset_args(i, required=True)
    _add_keep_ids(i)
    i.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    i.set_defaults(command="info")


def _add_predict_parser(sub: Any) -> None:
    pr = sub.add_parser("predict", help="predict every vertex's class with a saved model")
    _add_dataset_args(pr, required=True)
    _add_keep_ids(pr)
    pr.add_argument("--model", required=True, metavar="PATH", help="a model written by 'train --save-model'")
    _add_model_factory(pr, "a model of your own (train --model-factory, or train(model=...)): the factory that "
                           "builds it again for its saved weights, needed for such a model; a warning says when the "
                           "file names another")
    pr.add_argument("--out", required=True, metavar="FILE", help="predicted labels: .npy, .pt or .csv")
    pr.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    pr.add_argument("--engine", choices=["auto", *ENGINES], default="auto",
                    help="inference path: auto, or an engine (offload predicts chunk by chunk under --gpu-memory; "
                         "not distributed)")
    pr.add_argument("--gpu-memory", "--memory-budget", dest="gpu_memory", metavar="GIB",
                    help="device memory the engine may use (default: what is free)")
    pr.add_argument("--devices", metavar="LIST", help="comma-separated devices for multi-device engines")
    pr.add_argument("--partitions", type=_int, default=1, help="offload: level-1 partitions (default 1)")
    pr.set_defaults(command="predict")


def _add_report_parser(sub: Any) -> None:
    r = sub.add_parser("report", help="plot or tabulate one or more metrics files (loss, accuracy, time, memory, "
                                      "bytes moved per epoch)")
    r.add_argument("runs", nargs="+", metavar="RUN.jsonl", help="metrics files written by 'train --metrics'")
    r.add_argument("--out", metavar="FILE", help="PNG to write (needed for --format png)")
    r.add_argument("--format", choices=["png", "md"], default="png",
                   help="png: a figure of panels, runs overlaid (needs matplotlib); md: Markdown tables on stdout "
                        "(default png)")
    r.set_defaults(command="report")


def _add_convert_parser(sub: Any) -> None:
    c = sub.add_parser("convert", help="write a dataset in gnnscale's memory-mappable directory format")
    _add_dataset_args(c, required=True)
    _add_keep_ids(c)
    c.add_argument("--out", required=True, metavar="DIR", help="new directory to create")
    c.add_argument("--feature-dtype", choices=["fp32", "bf16"], default=None,
                   help="store the features in float32 or bfloat16 (half the bytes on disk, in host memory and on "
                        "the bus; engines upcast them to float32 on the device); default: as read, float32 for "
                        "every reader (the spec's feature_dtype option wins)")
    c.add_argument("--features", metavar="FILE.npy",
                   help="the vertices' features: one [N, F] numeric array (np.save), row i for vertex i in the "
                        "graph's vertex order (an edge list's ids in increasing order); replaces made-up ones")
    c.add_argument("--labels", metavar="FILE.csv",
                   help="the vertices' labels: lines 'id,label' (id as in the edge list; label a class name or "
                        "number; vertices not listed are unlabelled); names become classes 0..C-1 in sorted order, "
                        "kept in DIR/classes.json; a new 25/50/25 split of the labelled vertices (--seed)")
    c.add_argument("--host-memory", metavar="SIZE",
                   help="kronecker and edgelist specs stream: they are written block by block, without holding "
                        "the graph in memory, and this is the host memory the blocks may use, GiB or a size (512MB; "
                        "default: a quarter of the available RAM); every other spec is loaded whole (this has no "
                        "effect on it, said in a note)")
    c.set_defaults(command="convert")


def _add_recalibrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recalibrate", action="store_true",
                   help="measure this machine's rates again (gather, copy, aggregation, FLOPs, memory, disk: about "
                        "3 s) instead of using the cached ones, which the predicted epoch times are priced with")
