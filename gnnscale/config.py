"""``TrainConfig``: what to train and how, shared by the training loop and every engine.

It lives apart from :mod:`gnnscale.train` so that engines and planners import it without importing the loop
that drives them (``train`` sits above ``engines``; nothing below it imports it).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields

from gnnscale.errors import ConfigError
from gnnscale.nn.zoo import ALL_MODELS
from gnnscale.partition import PARTITION_METHODS
from gnnscale.partition.dedup import DEDUP_MODES, REORGANIZE_MODES
from gnnscale.partition.plan import CHUNKERS
from gnnscale.sample import SAMPLE_NORMS
from gnnscale.store import GATHER_METHODS

STRATEGIES = ("micrograph", "model-centric")
"""``--strategy`` of the distributed engine."""

_CHECKS: list[Callable[[TrainConfig], None]] = []


def register_check(check: Callable[[TrainConfig], None]) -> Callable[[TrainConfig], None]:
    """Add a check every :class:`TrainConfig` runs when it is made (it raises
    :class:`~gnnscale.errors.ConfigError`). The engine registry (:mod:`gnnscale.engines`) registers the engine's
    name and each engine's own options this way, so that this module, below the engines, never names one."""
    _CHECKS.append(check)
    return check


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
    sample_norm: str = "sampled"
    """Sampled engines: whose degrees GCN's weights on a sampled block read. ``sampled``: each vertex's degree in
    the sampled graph, its keyed sample plus its loop (PyG's ``GCNConv`` on a sampled subgraph); ``graph``: the
    whole graph's (full-graph training's weights). Either way each vertex keeps one self-loop outside the fanout,
    the weights do not depend on the batch, and fanout -1 is full-graph training (:mod:`gnnscale.sample.adjacency`)."""
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
    shares: tuple[float, ...] | None = None
    """Mini-batch: the fraction of every global batch each trainer (``devices[i]``) takes, in (0, 1) and summing to
    1; ``None``: equal shares. Unequal devices (a CPU beside a GPU) want unequal shares; what is learned does not
    change, keyed sampling makes a step on any split equal one step on the whole batch."""
    drm: str = "on"
    """Hybrid: HyScale-GNN's dynamic resource management (Algorithm 1) after every iteration, ``on`` or ``off``
    (the split and threads stay as they start)."""
    threads: tuple[int, ...] | None = None
    """Hybrid: threads of the CPU sampler, the feature loader and the CPU trainer; ``None``: half the cores to
    the trainer, the rest split between the other two (one each at least)."""
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
    hotness: str = "degree"
    """Mini-batch: what ranks vertices for device memory: ``degree`` (out-degree) or ``presample`` (access counts
    of a few sampled batches)."""

    def __post_init__(self) -> None:
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
            (self.timeout > 0, f"--timeout must be > 0 seconds, got {self.timeout}"),
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


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string literal under it in the class body), from the source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _document(cls: type) -> None:
    """Append every field, its default and its meaning to ``cls.__doc__``, so that ``help(cls)`` shows them."""
    docs = field_docs(cls)
    lines = [(cls.__doc__ or "").rstrip(), "", "Fields (name: type = default):", ""]
    for f in fields(cls):
        default = f.default if f.default is not MISSING else "(required)"
        lines.append(f"    {f.name}: {f.type} = {default!r}")
        lines.extend(textwrap.wrap(docs.get(f.name, "(undocumented)"), 108, initial_indent=" " * 8,
                                   subsequent_indent=" " * 8))
    cls.__doc__ = "\n".join(lines) + "\n"


_document(TrainConfig)
