"""``gnnscale.train(graph, config)``: the one training loop every engine runs under."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gnnscale.engines.base import Engine
from gnnscale.errors import ConfigError, GraphError, TrainingError
from gnnscale.graph.graph import Graph
from gnnscale.nn.decoupled import DECOUPLED_MODELS
from gnnscale.nn.model import GNN, MODELS, build_model
from gnnscale.partition import PARTITION_METHODS
from gnnscale.plan.memory import proc_kib

ALL_MODELS = (*MODELS, *DECOUPLED_MODELS)

EpochRecord = dict[str, Any]


@dataclass(kw_only=True)
class TrainConfig:
    """What to train and how; devices are arguments of :func:`train`, not config."""

    model: str = "gcn"
    """Layer type: one of ``gcn``, ``sage``, ``gat``, ``gin``, ``mlp``, or a decoupled model (NeutronTask Eq. 4):
    ``dgcn``, ``dgat``."""
    layers: int = 2
    """Number of layers (the last one outputs class scores)."""
    hidden: int = 64
    """Hidden width (for GAT, the total over heads: each head has ``hidden // heads``)."""
    heads: int = 4
    """Attention heads of GAT's hidden layers."""
    dropout: float = 0.5
    """Drop probability before every layer (keyed by vertex, so identical in every engine)."""
    lr: float = 0.01
    """Adam learning rate."""
    weight_decay: float = 5e-4
    """Adam L2 weight decay."""
    epochs: int = 100
    """Training epochs (one full-graph step each)."""
    seed: int = 0
    """Seeds initial weights and dropout masks."""
    engine: str = "auto"
    """Engine name, or ``auto`` for the first engine with no reason against it."""
    memory_budget: int | None = None
    """Device memory the engine may use, in bytes; ``None``: what is free on the device."""
    partitions: int = 1
    """Offload: level-1 partitions ``m`` (HongTu schedules one per GPU; on one device they run in turn)."""
    chunks: int | None = None
    """Offload: destination chunks per partition ``n``; ``None``: the planner picks the fewest that fit."""
    partition_method: str = "metis"
    """Offload: ``metis``, ``random`` or ``range`` level-1 partitioning."""
    gather: str = "auto"
    """Offload: how chunk rows reach the device: ``index_select`` (CPU gather + async copy), ``uva`` (Triton
    kernel reading pinned host memory) or ``auto``."""
    plan_dir: str | None = None
    """Where partition plans are saved and reused; ``None``: the user cache (``gnnscale.partition``)."""
    devices: tuple[str, ...] | None = None
    """Offload: devices the partitions run on (partition ``i`` on ``devices[i % len(devices)]``), one thread each.
    Mini-batch: one trainer per device, each training its share of every batch. ``None``: the training device.
    The first is the training device."""
    dedup: str = "full"
    """Offload: ``none`` (every chunk loads its rows), ``reuse`` (rows shared with the partition's previous chunk
    stay on the device) or ``full`` (HongTu: each batch's rows loaded once, shared between partitions, reused)."""
    chunker: str = "range"
    """Offload: ``range`` (edge-balanced id ranges, HongTu's), ``metis`` (METIS sub-partitions: fewer shared rows,
    less balanced) or ``auto`` (both, the lower Eq. 4 cost; METIS runs once per chunk count and is saved)."""
    reorganize: str = "auto"
    """Offload: reorder chunks into batches by Algorithm 4: ``on``, ``off`` or ``auto`` (when it lowers Eq. 4)."""
    batch_size: int = 1024
    """Mini-batch: seed vertices per batch."""
    fanouts: tuple[int, ...] | None = None
    """Mini-batch: neighbours sampled per hop, the first for the seeds' hop (-1: all); ``None``: 15,10 for two
    layers, else 10 per layer."""
    eval_fanouts: tuple[int, ...] | None = None
    """Mini-batch: sampled evaluation with these fanouts; ``None``: layer-wise full-neighbour inference."""
    gpu_graph_ratio: float | None = None
    """Mini-batch: fraction of vertices (hottest first) whose neighbour lists live on the devices; ``None``: as
    many as half the device budget holds (topology first, then features: XGNN §4.3)."""
    gpu_feature_ratio: float | None = None
    """Mini-batch: fraction of vertices (hottest first) whose features live on the devices; ``None``: see above."""
    dependency: str = "exact"
    """Task-parallel: ``exact`` (every T task finishes before the first P task: the in-memory model exactly) or
    ``skip`` (NeutronTask Algorithm 1: edges from subgraphs later in this epoch's shuffled order are skipped, and
    P tasks start as soon as their subgraph's T tasks are done)."""
    subgraphs: int | None = None
    """Task-parallel: subgraphs ``S`` per epoch; ``None``: the fewest (at least 2) that fit ``memory_budget``."""
    t_devices: int | None = None
    """Task-parallel: devices for the T tasks (``N_t``); ``None``: the scheduling model (Eqs. 7-8) decides."""
    hotness: str = "degree"
    """Mini-batch: what ranks vertices for device memory: ``degree`` (out-degree) or ``presample`` (access counts
    of a few sampled batches)."""

    def __post_init__(self) -> None:
        from gnnscale.engines import ENGINES
        from gnnscale.partition.dedup import DEDUP_MODES, REORGANIZE_MODES
        from gnnscale.partition.plan import CHUNKERS
        from gnnscale.store import GATHER_METHODS

        checks = [
            (self.model in ALL_MODELS, f"unknown model {self.model!r}; choose one of {', '.join(ALL_MODELS)}"),
            (self.layers >= 1, f"--layers must be >= 1, got {self.layers}"),
            (self.hidden >= 1, f"--hidden must be >= 1, got {self.hidden}"),
            (self.heads >= 1, f"--heads must be >= 1, got {self.heads}"),
            (0.0 <= self.dropout < 1.0, f"--dropout must be in [0, 1), got {self.dropout}"),
            (self.lr > 0, f"--lr must be > 0, got {self.lr}"),
            (self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}"),
            (self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (self.seed >= 0, f"--seed must be >= 0, got {self.seed}"),
            (self.engine == "auto" or self.engine in ENGINES,
             f"unknown engine {self.engine!r}; choose auto or one of {', '.join(ENGINES)}"),
            (self.memory_budget is None or self.memory_budget > 0, "--gpu-memory must be positive"),
            (self.partitions >= 1, f"--partitions must be >= 1, got {self.partitions}"),
            (self.chunks is None or self.chunks >= 1, f"--chunks must be >= 1, got {self.chunks}"),
            (self.partition_method in PARTITION_METHODS,
             f"unknown partition method {self.partition_method!r}; choose one of {', '.join(PARTITION_METHODS)}"),
            (self.gather in ("auto", *GATHER_METHODS),
             f"unknown gather method {self.gather!r}; choose auto or one of {', '.join(GATHER_METHODS)}"),
            (self.dedup in DEDUP_MODES, f"unknown --dedup {self.dedup!r}; choose one of {', '.join(DEDUP_MODES)}"),
            (self.chunker in ("auto", *CHUNKERS),
             f"unknown --chunker {self.chunker!r}; choose auto or one of {', '.join(CHUNKERS)}"),
            (self.reorganize in REORGANIZE_MODES,
             f"unknown --reorganize {self.reorganize!r}; choose one of {', '.join(REORGANIZE_MODES)}"),
            (self.devices is None or len(self.devices) >= 1, "--devices needs at least one device"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.engine != "minibatch" or self.fanouts is None or len(self.fanouts) == self.layers,
             f"--fanouts has {len(self.fanouts or ())} value(s) for {self.layers} layers; give one per layer"),
            (self.engine != "minibatch" or self.eval_fanouts is None or len(self.eval_fanouts) == self.layers,
             f"--eval-fanouts has {len(self.eval_fanouts or ())} value(s) for {self.layers} layers"),
            (self.fanouts is None or all(f >= 1 or f == -1 for f in self.fanouts),
             f"--fanouts must be positive (or -1 for all neighbours), got {self.fanouts}"),
            (self.eval_fanouts is None or all(f >= 1 or f == -1 for f in self.eval_fanouts),
             f"--eval-fanouts must be positive (or -1 for all neighbours), got {self.eval_fanouts}"),
            (self.gpu_graph_ratio is None or 0.0 <= self.gpu_graph_ratio <= 1.0,
             f"--gpu-graph-ratio must be in [0, 1], got {self.gpu_graph_ratio}"),
            (self.dependency in ("exact", "skip"),
             f"unknown --dependency {self.dependency!r}; choose exact or skip"),
            (self.subgraphs is None or self.subgraphs >= 1, f"--subgraphs must be >= 1, got {self.subgraphs}"),
            (self.t_devices is None or self.t_devices >= 1, f"--t-devices must be >= 1, got {self.t_devices}"),
            (self.hotness in ("degree", "presample"),
             f"unknown --hotness {self.hotness!r}; choose degree or presample"),
            (self.gpu_feature_ratio is None or 0.0 <= self.gpu_feature_ratio <= 1.0,
             f"--gpu-feature-ratio must be in [0, 1], got {self.gpu_feature_ratio}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        if self.model == "gat" and self.layers > 1 and self.hidden % self.heads:
            raise ConfigError(f"--hidden ({self.hidden}) must be divisible by --heads ({self.heads}) for GAT")


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model, one record per epoch, and the summary record."""

    model: GNN
    """The model as trained: its weights are the *last* epoch's."""
    history: list[EpochRecord]
    summary: EpochRecord
    engine: str
    rejected: dict[str, list[str]] = field(default_factory=dict)
    best_state: dict[str, torch.Tensor] = field(default_factory=dict)
    """A CPU copy of the weights at the epoch the summary calls best (``best_epoch``): restore them with
    ``result.model.load_state_dict(result.best_state)``."""


def resolve_device(spec: str | torch.device) -> torch.device:
    """``auto`` -> CUDA when available else CPU; validates ``cuda``/``cuda:N`` against what is present."""
    if isinstance(spec, torch.device):
        return spec
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"unknown device {spec!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {spec!r}; use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {spec} requested but no CUDA device is available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) present")
    return dev


def resolve_devices(config: TrainConfig, device: str | torch.device) -> torch.device:
    """The training device; with ``config.devices`` (validated here, all CPU or all CUDA), their first."""
    if not config.devices:
        return resolve_device(device)
    devs = [resolve_device(d) for d in config.devices]
    if any(d.type == "cuda" and d.index is None for d in devs):
        raise ConfigError("--devices takes explicit devices: cpu, or cuda:0,cuda:1,...")
    if len({d.type for d in devs}) > 1:
        raise ConfigError(f"--devices mixes CPU and CUDA devices ({', '.join(config.devices)}); use one kind")
    if not (isinstance(device, str) and device == "auto") and resolve_device(device) != devs[0]:
        raise ConfigError(f"--device {device} disagrees with --devices {','.join(config.devices)}; give one of them")
    return devs[0]


def check_trainable(graph: Graph) -> None:
    """A graph must carry features, labels and a non-empty train mask to be trained on."""
    if graph.x is None or graph.num_features == 0:
        raise GraphError(f"graph {graph.name} has no features to train on")
    if graph.y is None:
        raise GraphError(f"graph {graph.name} has no labels to train on")
    if graph.train_mask is None or not bool(graph.train_mask.any()):
        raise GraphError(f"graph {graph.name} has no training vertices (train_mask is empty)")
    masks = [(m, getattr(graph, m)) for m in ("train_mask", "val_mask", "test_mask")]
    masks = [(m, t) for m, t in masks if t is not None]
    for i, (a, ta) in enumerate(masks):
        for b, tb in masks[i + 1 :]:
            both = int((ta & tb).sum())
            if both:
                raise GraphError(f"graph {graph.name}: {both} vertices are in both {a} and {b}; the splits must be "
                                 "disjoint (a vertex trained on cannot measure generalisation)")


def reset_peak_device_bytes(device: torch.device) -> None:
    """Start a new peak-memory window: the CUDA allocator's peak, or on Linux the process's peak RSS."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # "5" resets VmHWM (Linux >= 4.0)
            fh.write("5")
    except OSError:
        pass


def peak_device_bytes(device: torch.device) -> int:
    """Peak bytes since :func:`reset_peak_device_bytes`: CUDA allocated, or the process's peak resident memory
    on CPU (VmHWM; where it cannot be reset, the lifetime peak)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    hwm = proc_kib("/proc/self/status", "VmHWM")
    return (hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def train(
    graph: Graph,
    config: TrainConfig,
    device: str | torch.device = "auto",
    *,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    on_start: Callable[[Engine, dict[str, list[str]], dict[str, float]], None] | None = None,
    timings: dict[str, float] | None = None,
) -> TrainResult:
    """Train ``config.model`` on ``graph`` with the selected engine; same seed and device -> same metrics.

    Args:
        graph: features, labels and a train mask are required.
        config: model, optimiser and engine settings.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        on_epoch: called with each epoch's record (progress bars, metrics files).
        on_start: called before the first epoch with the engine, the engines ``auto`` rejected (and why) and the
            seconds each preparation step took (``ready_s`` their total): the CLI prints the plan there.
        timings: seconds of steps the caller ran before (``load_s``), reported with the engine's own.

    Raises:
        GnnscaleError: bad config, unusable graph, or no engine fits; the message says which.
    """
    from gnnscale.engines import select_engine
    from gnnscale.progress import stage

    start = time.perf_counter()
    dev = resolve_devices(config, device)
    check_trainable(graph)
    engine_cls, rejected = select_engine(graph, config, dev)
    assert graph.num_classes is not None
    model = build_model(
        config.model,
        graph.num_features,
        config.hidden,
        graph.num_classes,
        layers=config.layers,
        dropout=config.dropout,
        heads=config.heads,
        seed=config.seed,
    )
    setup: dict[str, float] = {}
    with stage("setup", setup):
        engine = engine_cls(graph, model, config, dev)
    # in the order the steps ran: the caller's (load), the engine's planning (in selection), its set-up
    ready = {**(timings or {}), **engine.timings, **setup}
    ready["ready_s"] = (timings or {}).get("load_s", 0.0) + time.perf_counter() - start
    if on_start is not None:
        on_start(engine, rejected, ready)
    history: list[EpochRecord] = []
    best: EpochRecord | None = None
    best_state: dict[str, torch.Tensor] = {}
    best_by = "val" if graph.val_mask is not None and bool(graph.val_mask.any()) else "train"
    for epoch in range(1, config.epochs + 1):
        reset_peak_device_bytes(dev)
        t0 = time.perf_counter()
        stats = engine.train_epoch(epoch)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        epoch_time = time.perf_counter() - t0
        accs = engine.evaluate()
        record: EpochRecord = {
            "epoch": epoch,
            "loss": stats.pop("loss"),
            **accs,
            "epoch_time_s": epoch_time,
            "peak_device_bytes": peak_device_bytes(dev),
            **stats,
        }
        history.append(record)
        if not math.isfinite(record["loss"]):
            if on_epoch is not None:
                on_epoch(record)  # the metrics keep the epoch that diverged (its loss written as null)
            raise TrainingError(f"the loss is {record['loss']} at epoch {epoch}: training diverged; try a lower "
                                f"--lr (now {config.lr}) or check the features for extreme values")
        val = record[f"{best_by}_acc"]
        if best is None or (val is not None and val > best["_val"]):
            best = {"_val": val, "epoch": epoch, "test_acc": record["test_acc"]}
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        if on_epoch is not None:
            on_epoch(record)
    assert best is not None
    summary: EpochRecord = {
        "summary": True,
        "engine": engine_cls.name,
        "device": str(dev),
        "model": config.model,
        "dataset": graph.name,
        "epochs": config.epochs,
        "best_val_acc": best["_val"] if best_by == "val" else None,
        "best_by": best_by,
        "best_epoch": best["epoch"],
        "test_acc_at_best_val": best["test_acc"],
        "final_test_acc": history[-1]["test_acc"],
        "total_time_s": time.perf_counter() - start,
        "timings": {**ready, "epoch_s": sum(r["epoch_time_s"] for r in history) / len(history)},
        "engine_detail": engine.describe(),
        "config": asdict(config),
    }
    return TrainResult(model=model, history=history, summary=summary, engine=engine_cls.name, rejected=rejected,
                       best_state=best_state)
