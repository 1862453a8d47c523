"""``TrainConfig``: what to train and how, shared by the training loop and every engine.

It lives apart from :mod:`gnnscale.train` so that engines and planners import it without importing the loop
that drives them (``train`` sits above ``engines``; nothing below it imports it).
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from gnnscale.errors import ConfigError
from gnnscale.nn.decoupled import DECOUPLED_MODELS
from gnnscale.nn.factory import SPEC as FACTORY_SPEC
from gnnscale.nn.norm import JK_MODES, NORMS
from gnnscale.nn.zoo import ALL_MODELS
from gnnscale.partition import PARTITION_METHODS
from gnnscale.partition.dedup import DEDUP_MODES, REORGANIZE_MODES
from gnnscale.partition.plan import CHUNKERS
from gnnscale.runtime.host import HOST_ALLOCATORS
from gnnscale.sample import SAMPLE_NORMS
from gnnscale.store import GATHER_METHODS
from gnnscale.units import parse_budget

MODES = ("auto", "full", "sampled", "distributed")
"""``--mode``: the training modes ``--engine auto`` chooses in."""
STRATEGIES = ("micrograph", "model-centric")
"""``--strategy`` of the distributed engine."""
MAX_LAYERS = 10_000
"""The most ``--layers``: far beyond the deepest GNNs trained (RevGNN: 1,001), short of a model too big to build."""

_CHECKS: list[Callable[[TrainConfig], None]] = []


def register_check(check: Callable[[TrainConfig], None]) -> Callable[[TrainConfig], None]:
    """Add a check every :class:`TrainConfig` runs when it is made (it raises
    :class:`~gnnscale.errors.ConfigError`). The engine registry (:mod:`gnnscale.engines`) registers the engine's
    name and each engine's own options this way, so that this module, below the engines, never names one."""
    _CHECKS.append(check)
    return check


@dataclass(kw_only=True)
class ModelOptions:
    """What model to train and how to optimise it (every engine)."""

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
    input_dropout: float | None = None
    """Drop probability of the input features (before the first layer); ``None``: :attr:`dropout`, as Kipf &
    Welling's GCN. ``0`` is PyG's ``BasicGNN``, which drops only between layers (its GIN with batch norm gains
    4.5 points from it on Amazon Photo: benchmarks/HISTORY.md, "Normalisation")."""
    norm: str = "none"
    """Normalisation of every hidden layer's output, before its activation (PyG's ``BasicGNN`` order): ``none``,
    ``batch`` (BatchNorm: statistics over the layer's vertices, all of them full-graph, the batch's sampled;
    running statistics in evaluation) or ``layer`` (LayerNorm over each vertex's features). The decoupled models
    normalise between their T tasks' linear layers (PyG's ``MLP``)."""
    residual: bool = False
    """Every layer adds a bias-free linear map of its own input to its output (PyG ``GATConv``'s ``residual``)."""
    jk: str = "none"
    """Jumping knowledge: ``none`` (the last layer outputs the classes), or ``last``, ``cat``, ``max``: every layer
    outputs the hidden width, the outputs are combined so and a final linear layer gives the classes."""
    model_factory: str | None = None
    """A model of your own instead of :attr:`model`: ``module:function``, called as ``function(in_features,
    num_classes)`` under :attr:`seed`, returning a :class:`~gnnscale.nn.Stack` or a PyG ``BasicGNN``. The module
    is imported: code you chose to run (:mod:`gnnscale.nn.factory`). The other model fields are then ignored."""
    lr: float = 0.01
    """Adam learning rate."""
    weight_decay: float = 5e-4
    """Adam L2 weight decay."""
    epochs: int = 100
    """Training epochs (one full-graph step each)."""
    seed: int = 0
    """Seeds initial weights and dropout masks."""


@dataclass(kw_only=True)
class RunOptions:
    """Which engine runs, on how much device memory and which devices (every engine)."""

    engine: str = "auto"
    """Engine name, or ``auto``: the first engine of the training mode (:attr:`mode`) with no reason against it,
    in the registry's order (``gnnscale plan`` lists them with their estimates or reasons)."""
    mode: str = "auto"
    """Training mode ``--engine auto`` chooses in: ``full`` (full-graph engines), ``sampled`` (mini-batch
    engines) or ``distributed`` (a job of ranks); ``auto``: the named engine's mode, else ``distributed`` when
    ranks are given, else ``full``."""
    memory_budget: int | None = None
    """Device memory the engine may use, in bytes; ``None``: what is free on the device. A string reads as the
    CLI's ``--gpu-memory`` does: ``"6"`` is 6 GiB, ``"512MB"`` 512 * 10^6 bytes, ``"6GiB"`` 6 * 2^30
    (:mod:`gnnscale.units`); an int is bytes."""
    devices: tuple[str, ...] | None = None
    """Devices (a tuple, or a string ``"cuda:0,cuda:1"`` as the CLI's ``--devices`` takes). Offload: devices the
    partitions run on (partition ``i`` on ``devices[i % len(devices)]``), one thread each.
    Mini-batch: one trainer per device, each training its share of every batch. ``None``: the training device.
    The first is the training device."""
    host_allocator: str = "auto"
    """What the host allocator does with freed large blocks (:func:`~gnnscale.runtime.host.set_host_allocator`):
    ``retain`` keeps them for reuse (no page faults on the next ``[V, F]`` temporary; a larger resident peak),
    ``system`` is glibc's default; ``auto``: ``retain`` when the training device is the CPU, no layer computes
    per edge (GAT: the retained heap fragments) and the engine's host estimate is at most half the available
    memory, else untouched (:meth:`~gnnscale.engines.core.base.Engine.auto_retains`)."""


@dataclass(kw_only=True)
class ChunkOptions:
    """How many chunks a full-graph engine streams the vertices in."""

    chunks: int | None = None
    """Offload: destination chunks per partition ``n``; ``None``: the planner picks the fewest that fit."""


@dataclass(kw_only=True)
class PartitionOptions:
    """How the graph is partitioned, and where plans are kept."""

    partition_method: str = "metis"
    """Offload: ``metis``, ``random`` or ``range`` level-1 partitioning."""
    plan_dir: str | None = None
    """Where partition plans are saved and reused; ``None``: the user cache (``gnnscale.partition``)."""


@dataclass(kw_only=True)
class GatherOptions:
    """How rows in host memory reach a device."""

    gather: str = "auto"
    """How host rows (offload's chunk rows, the mini-batch store's host tier) reach the device: ``index_select``
    (CPU gather + async copy), ``uva`` (Triton kernel reading pinned host memory) or ``auto``."""


@dataclass(kw_only=True)
class OffloadOptions:
    """HongTu's offload engine: partitions, deduplication, chunk order."""

    partitions: int = 1
    """Offload: level-1 partitions ``m`` (HongTu schedules one per GPU; on one device they run in turn)."""
    dedup: str = "auto"
    """Offload: ``none`` (every chunk loads its rows), ``reuse`` (rows shared with the partition's previous chunk
    stay on the device), ``full`` (HongTu: each batch's rows loaded once, shared between partitions, reused) or
    ``auto`` (``full`` on accelerators, ``none`` on the CPU, where no transfer is saved:
    :func:`~gnnscale.partition.dedup.resolve_dedup`)."""
    chunker: str = "range"
    """Offload: ``range`` (edge-balanced id ranges, HongTu's), ``metis`` (METIS sub-partitions: fewer shared rows,
    less balanced) or ``auto`` (both, the lower Eq. 4 cost; METIS runs once per chunk count and is saved)."""
    reorganize: str = "auto"
    """Offload: reorder chunks into batches by Algorithm 4: ``on``, ``off`` or ``auto`` (when it lowers Eq. 4)."""
    scratch: str | None = None
    """Offload with ``host_memory``: a folder the host buffers (layer inputs, gradients, projections, cached
    aggregations) past the budget spill to, as unlinked file-backed maps (``""`` or ``None``: the system's temporary
    folder, said in a note when something spills)."""


@dataclass(kw_only=True)
class TaskParallelOptions:
    """NeutronTask's task-parallel engine: dependencies, subgraphs, T-task devices."""

    dependency: str = "exact"
    """Task-parallel: ``exact`` (every T task finishes before the first P task: the in-memory model exactly) or
    ``skip`` (NeutronTask Algorithm 1: edges from subgraphs later in this epoch's shuffled order are skipped, and
    P tasks start as soon as their subgraph's T tasks are done)."""
    subgraphs: int | None = None
    """Task-parallel: subgraphs ``S`` per epoch; ``None``: the fewest (at least 2) that fit ``memory_budget``."""
    t_devices: int | None = None
    """Task-parallel: devices for the T tasks (``N_t``); ``None``: the scheduling model (Eqs. 7-8) decides."""


@dataclass(kw_only=True)
class SamplingOptions:
    """Sampled training: batches, fanouts and GCN's weights on sampled blocks."""

    batch_size: int = 1024
    """Mini-batch: seed vertices per batch."""
    fanouts: tuple[int, ...] | None = None
    """Mini-batch: neighbours sampled per hop, the first for the seeds' hop (-1: all); ``None``: 15,10 for two
    layers, else 10 per layer."""
    sample_norm: str = "sampled"
    """Sampled engines: whose degrees GCN's weights on a sampled block read. ``sampled``: each vertex's degree in
    the sampled graph, its keyed sample plus its loop (PyG's ``GCNConv`` on a sampled subgraph); ``graph``: the
    whole graph's (full-graph training's weights). Either way each vertex keeps one self-loop outside the fanout,
    the weights do not depend on the batch, and fanout -1 is full-graph training (:mod:`gnnscale.sample.adjacency`)."""


@dataclass(kw_only=True)
class MiniBatchOptions:
    """Sampled training on several trainers with a device tier (XGNN's store)."""

    eval_fanouts: tuple[int, ...] | None = None
    """Mini-batch: sampled evaluation with these fanouts; ``None``: layer-wise full-neighbour inference."""
    gpu_graph_ratio: float | None = None
    """Mini-batch: fraction of vertices (hottest first) whose neighbour lists live on the devices; ``None``: as
    many as half the device budget holds (topology first, then features: XGNN §4.3)."""
    shares: tuple[float, ...] | None = None
    """Mini-batch: the fraction of every global batch each trainer (``devices[i]``) takes, in (0, 1) and summing to
    1; ``None``: equal shares. Unequal devices (a CPU beside a GPU) want unequal shares; what is learned does not
    change, keyed sampling makes a step on any split equal one step on the whole batch."""


@dataclass(kw_only=True)
class StoreOptions:
    """What the mini-batch store keeps on the devices."""

    gpu_feature_ratio: float | None = None
    """Mini-batch: fraction of vertices (hottest first) whose features live on the devices; ``None``: see above."""
    hotness: str = "degree"
    """Mini-batch: what ranks vertices for device memory: ``degree`` (out-degree) or ``presample`` (access counts
    of a few sampled batches)."""
    host_memory: int | None = None
    """Host memory, in bytes, the run may use beyond its base (:class:`~gnnscale.plan.host.HostBase`: the process's
    peak stays under base + this; every engine that reads it, ``Engine.honours_host_memory``) for the disk tier's
    caches, buffers, batches or chunks and activations (a string reads as ``memory_budget`` does: ``"32MB"``,
    ``"2GiB"``, a plain number is GiB). Set, and the features a memory map of a converted directory (``gnnscale
    convert``): they are read from its ``x.npy`` by positional reads behind a host cache of the hottest rows, not
    held in host memory. ``None``: no bound; the features stay where the graph holds them."""


@dataclass(kw_only=True)
class HybridOptions:
    """HyScale-GNN's hybrid CPU + accelerator engine."""

    drm: str = "on"
    """Hybrid: HyScale-GNN's dynamic resource management (Algorithm 1) after every iteration, ``on`` or ``off``
    (the split and threads stay as they start)."""
    threads: tuple[int, ...] | None = None
    """Hybrid: threads of the CPU sampler, the feature loader and the CPU trainer; ``None``: half the cores to
    the trainer, the rest split between the other two (one each at least)."""


@dataclass(kw_only=True)
class DistributedOptions:
    """HopGNN's distributed engine: ranks, strategy, pre-gathering, merging."""

    ranks: int | None = None
    """Distributed: ranks to start on this machine (``--ranks``); ``None``: the job's, from torchrun."""
    strategy: str = "micrograph"
    """Distributed: ``micrograph`` (HopGNN: the model moves to the features) or ``model-centric`` (DistDGL: the
    features move to the model)."""
    pregather: str = "on"
    """Distributed, micrograph: fetch an iteration's remote features in one exchange before its first time step
    (HopGNN §5.2), ``on`` or ``off`` (each time step fetches its own)."""
    merge: str = "auto"
    """Distributed, micrograph: time-step merging (HopGNN §5.3): ``auto`` (one merge more per epoch from epoch 2
    while epochs get faster), ``off``, or a number of merges."""
    timeout: float = 180.0
    """Distributed: seconds a collective may wait before the job is declared failed."""
    plan: str | None = None
    """Distributed: a partition plan file (``gnnscale partition``) with one part per rank; ``None``: partition
    (METIS by default) or reuse the saved plan."""


@dataclass(kw_only=True)
class TrainConfig(
    DistributedOptions,
    HybridOptions,
    StoreOptions,
    MiniBatchOptions,
    SamplingOptions,
    TaskParallelOptions,
    OffloadOptions,
    GatherOptions,
    PartitionOptions,
    ChunkOptions,
    RunOptions,
    ModelOptions,
):
    """What to train and how; devices are arguments of :func:`train`, not config. The fields come in groups, one
    dataclass each (:class:`ModelOptions`, :class:`RunOptions`, then the engines' own groups); each engine says
    which groups it reads (``Engine.options``), and a flag of a group it does not read has no effect on it."""

    def model_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~gnnscale.nn.build_model` this configuration sets."""
        kw: dict[str, Any] = {"layers": self.layers, "dropout": self.dropout, "heads": self.heads, "seed": self.seed,
                              "norm": self.norm, "residual": self.residual, "jk": self.jk}
        if self.input_dropout is not None:
            kw["input_dropout"] = self.input_dropout
        return kw

    def __post_init__(self) -> None:
        _coerce_fields(self)
        checks = [
            (self.model in ALL_MODELS, f"unknown model {self.model!r}; choose one of {', '.join(ALL_MODELS)}"),
            (self.model_factory is None or bool(FACTORY_SPEC.match(self.model_factory)),
             f"--model-factory must be module:function (a module you can import and a function in it), got "
             f"{self.model_factory!r}"),
            (1 <= self.layers <= MAX_LAYERS, f"--layers must be from 1 to {MAX_LAYERS}, got {self.layers}"),
            (self.hidden >= 1, f"--hidden must be >= 1, got {self.hidden}"),
            (self.heads >= 1, f"--heads must be >= 1, got {self.heads}"),
            (0.0 <= self.dropout < 1.0, f"--dropout must be in [0, 1), got {self.dropout}"),
            (self.input_dropout is None or 0.0 <= self.input_dropout < 1.0,
             f"--input-dropout must be in [0, 1), got {self.input_dropout}"),
            (self.model not in DECOUPLED_MODELS or self.input_dropout is None,
             f"--input-dropout applies to the layer-stack models, not the decoupled {self.model}"),
            (self.norm in NORMS, f"unknown --norm {self.norm!r}; choose one of {', '.join(NORMS)}"),
            (self.jk in JK_MODES, f"unknown --jk {self.jk!r}; choose one of {', '.join(JK_MODES)}"),
            (self.model not in DECOUPLED_MODELS or (self.residual, self.jk) == (False, "none"),
             f"--residual and --jk apply to the layer-stack models, not the decoupled {self.model}"),
            (0 < self.lr < math.inf, f"--lr must be a finite number > 0, got {self.lr}"),
            (0 <= self.weight_decay < math.inf,
             f"--weight-decay must be a finite number >= 0, got {self.weight_decay}"),
            (self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (0 <= self.seed < 2**32, f"--seed must be from 0 to {2**32 - 1}, got {self.seed}"),
            (self.memory_budget is None or self.memory_budget > 0, "--gpu-memory must be positive"),
            (self.host_memory is None or self.host_memory > 0, "--host-memory must be positive"),
            (self.mode in MODES, f"unknown --mode {self.mode!r}; choose one of {', '.join(MODES)}"),
            (self.partitions >= 1, f"--partitions must be >= 1, got {self.partitions}"),
            (self.chunks is None or self.chunks >= 1, f"--chunks must be >= 1, got {self.chunks}"),
            (self.partition_method in PARTITION_METHODS,
             f"unknown partition method {self.partition_method!r}; choose one of {', '.join(PARTITION_METHODS)}"),
            (self.gather in ("auto", *GATHER_METHODS),
             f"unknown gather method {self.gather!r}; choose auto or one of {', '.join(GATHER_METHODS)}"),
            (self.host_allocator in HOST_ALLOCATORS,
             f"unknown --host-allocator {self.host_allocator!r}; choose one of {', '.join(HOST_ALLOCATORS)}"),
            (self.dedup in DEDUP_MODES, f"unknown --dedup {self.dedup!r}; choose one of {', '.join(DEDUP_MODES)}"),
            (self.chunker in ("auto", *CHUNKERS),
             f"unknown --chunker {self.chunker!r}; choose auto or one of {', '.join(CHUNKERS)}"),
            (self.reorganize in REORGANIZE_MODES,
             f"unknown --reorganize {self.reorganize!r}; choose one of {', '.join(REORGANIZE_MODES)}"),
            (self.devices is None or len(self.devices) >= 1, "--devices needs at least one device"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.sample_norm in SAMPLE_NORMS,
             f"unknown --sample-norm {self.sample_norm!r}; choose one of {', '.join(SAMPLE_NORMS)}"),
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
            (self.shares is None or all(0.0 < s < 1.0 for s in self.shares) or self.shares == (1.0,),
             f"--shares must each lie in (0, 1), got {self.shares}"),
            (self.shares is None or abs(sum(self.shares) - 1.0) < 1e-6,
             f"--shares must sum to 1, got {self.shares} (sum {sum(self.shares or ()):.6g})"),
            (self.shares is None or len(self.shares) == len(self.devices or ("",)),
             f"--shares gives {len(self.shares or ())} fraction(s) for {len(self.devices or ('',))} device(s); give "
             "one per --devices entry"),
            (self.drm in ("on", "off"), f"unknown --drm {self.drm!r}; choose on or off"),
            (self.hotness in ("degree", "presample"),
             f"unknown --hotness {self.hotness!r}; choose degree or presample"),
            (self.ranks is None or self.ranks >= 1, f"--ranks must be >= 1, got {self.ranks}"),
            (self.strategy in STRATEGIES,
             f"unknown --strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}"),
            (self.pregather in ("on", "off"), f"unknown --pregather {self.pregather!r}; choose on or off"),
            (self.merge in ("off", "auto") or (self.merge.isdigit() and int(self.merge) >= 0),
             f"unknown --merge {self.merge!r}; choose off, auto or a number of merges"),
            (0 < self.timeout < math.inf, f"--timeout must be a finite number > 0 of seconds, got {self.timeout}"),
            (self.gpu_feature_ratio is None or 0.0 <= self.gpu_feature_ratio <= 1.0,
             f"--gpu-feature-ratio must be in [0, 1], got {self.gpu_feature_ratio}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        if self.model == "gat" and self.layers > 1 and self.hidden % self.heads:
            raise ConfigError(f"--hidden ({self.hidden}) must be divisible by --heads ({self.heads}) for GAT")
        for check in _CHECKS:
            check(self)


def _flag(name: str) -> str:
    return f"{name}= (--{name.replace('_', '-')})"


_BOOLS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def _scalar(name: str, kind: type, value: Any) -> Any:
    """``value`` as ``kind`` (int, float, str or bool): the value itself, or a string the CLI would take."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOLS:
            return _BOOLS[value.strip().lower()]
        raise ConfigError(f"TrainConfig {_flag(name)} takes True or False, got {value!r}")
    if kind is str:
        if isinstance(value, str):
            return value
        if name == "merge" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"TrainConfig {_flag(name)} takes a string, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"TrainConfig {_flag(name)} takes {'an integer' if kind is int else 'a number'}, "
                          f"got {value!r}")
    try:
        out = kind(value.strip()) if isinstance(value, str) else value
    except ValueError:
        raise ConfigError(f"TrainConfig {_flag(name)}: cannot read {value!r} as "
                          f"{'an integer' if kind is int else 'a number'}") from None
    if kind is int and isinstance(out, float):
        if not out.is_integer():
            raise ConfigError(f"TrainConfig {_flag(name)} takes an integer, got {value!r}")
        out = int(out)
    return kind(out)


def _coerce_fields(config: Any) -> None:
    """Give every field of ``config`` its declared type, reading what the CLI would read: ``"5,5"`` for a tuple of
    ints, ``"cpu,cpu"`` for devices, ``"6GB"`` for a budget; anything else is one :class:`ConfigError` naming the
    field (never a raw ``TypeError`` from deep inside an engine)."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        value = getattr(config, f.name)
        kind = hints[f.name]
        args = typing.get_args(kind)
        optional = type(None) in args
        if value is None:
            if not optional:
                raise ConfigError(f"TrainConfig {_flag(f.name)} cannot be None")
            continue
        if optional:
            kind = next(a for a in args if a is not type(None))
        if f.name in ("memory_budget", "host_memory") and isinstance(value, str):
            try:
                value = parse_budget(value)
            except ConfigError as e:
                raise ConfigError(f"TrainConfig {_flag(f.name)}: {e}") from None
        elif typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()] if value.strip() else []
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                value = [value]
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"TrainConfig {_flag(f.name)} takes a tuple or a comma-separated string, got "
                                  f"{value!r}")
            value = tuple(_scalar(f.name, item, v.strip() if isinstance(v, str) else v) for v in value)
        else:
            value = _scalar(f.name, kind, value)
        object.__setattr__(config, f.name, value)


OPTION_GROUPS: tuple[type, ...] = (
    ModelOptions,
    RunOptions,
    ChunkOptions,
    PartitionOptions,
    GatherOptions,
    OffloadOptions,
    TaskParallelOptions,
    SamplingOptions,
    MiniBatchOptions,
    StoreOptions,
    HybridOptions,
    DistributedOptions,
)
"""Every option group, in the order ``--help`` shows them."""


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string literal under it in the class body), from the source of
    ``cls`` and of its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _document(cls: type, groups: tuple[type, ...]) -> None:
    """Append every field, its default and its meaning to ``cls.__doc__``, group by group, so that
    ``help(cls)`` shows them."""
    docs = field_docs(cls)
    lines = [(cls.__doc__ or "").rstrip(), "", "Fields (name: type = default), by group:"]
    for group in groups:
        lines += ["", f"{group.__name__}: {(group.__doc__ or '').strip()}", ""]
        for f in fields(group):
            default = f.default if f.default is not MISSING else "(required)"
            lines.append(f"    {f.name}: {f.type} = {default!r}")
            lines.extend(textwrap.wrap(docs.get(f.name, "(undocumented)"), 108, initial_indent=" " * 8,
                                       subsequent_indent=" " * 8))
    cls.__doc__ = "\n".join(lines) + "\n"


_document(TrainConfig, OPTION_GROUPS)
