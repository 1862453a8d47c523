"""The Engine interface: every training strategy (in-memory, offload, task-parallel, ...) implements it."""

from __future__ import annotations

import shutil
import tempfile
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.decoupled import DECOUPLED_MODELS
from gnnscale.nn.probe import model_chunk_reasons
from gnnscale.nn.stack import Stack
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.memory import estimate_host_bytes
from gnnscale.plan.rates import Rates
from gnnscale.units import format_bytes

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


def graph_bytes(graph: Graph) -> int:
    """Bytes of the graph's arrays (topology, features, labels): what an engine that loads it whole holds."""
    arrays = [graph.indptr, graph.indices, graph.x, graph.y, graph.edge_weight]
    return sum(t.numel() * t.element_size() for t in arrays if t is not None)


class Engine(ABC):
    """Trains a :class:`~gnnscale.nn.stack.Stack` (a built-in model or a user's) on a
    :class:`~gnnscale.graph.Graph`, one epoch per call.

    Engines own where data lives and in which order work happens, never what is computed: for the same model,
    seed and graph, every full-graph engine must produce the in-memory engine's losses and gradients.

    Subclasses set :attr:`name`, implement :meth:`_not_supported_reasons`, :meth:`train_epoch` and
    :meth:`evaluate`.
    """

    name: ClassVar[str]
    mode: ClassVar[str] = "full"
    """Training mode: ``full`` (full-graph: exact gradients of the whole graph), ``sampled`` (mini-batches of
    sampled neighbourhoods) or ``distributed`` (a job of ranks). ``--engine auto`` chooses among the engines of
    the requested mode."""
    trains_beside_accelerators: ClassVar[bool] = False
    """Whether the engine trains on the CPU *and* the accelerators together (its own device, where the master
    model lives, is then always the CPU, and ``--devices`` names the CPU among the accelerators)."""
    predicts: ClassVar[bool] = True
    """Whether the engine runs inference in one process (``gnnscale predict``, :func:`gnnscale.predict.predict`);
    an engine that only trains a job of ranks does not."""
    plan_kind: ClassVar[str | None] = None
    """What ``gnnscale partition --engine NAME`` shows for this engine without training: ``"partition"`` (a
    two-level partition plan), ``"tasks"`` (a task assignment), ``"pipeline"`` (a pipeline's predicted split);
    ``None``: the engine has no such plan (``gnnscale plan`` still lists its estimate)."""
    also_reads: ClassVar[tuple[str, ...]] = ()
    """Fields of option groups outside :attr:`options` that the engine reads too (not warned about as ignored)."""
    spills_to_scratch: ClassVar[bool] = False
    """Whether the host rows past ``--host-memory`` spill to ``--scratch`` (then they are not priced as RAM)."""
    host_layer_copies: ClassVar[int] = 0
    """Rows per vertex and hidden layer the engine keeps in host memory: 0 (the in-memory engine: its own estimate
    counts its device), 1 (layer-wise inference keeps each layer's output), 2 (offload and task-parallel keep every
    vertex's layer input and its gradient): its host memory grows with the graph and the hidden width
    (:func:`~gnnscale.plan.memory.estimate_host_bytes`)."""
    host_topology_copies: ClassVar[float] = 1.0
    """The engine's topology index, in copies of the graph's CSR bytes it builds in host memory beside the graph's
    own arrays (normalised, permuted, transposed, its temporaries at their peak): part of the base that
    ``--host-memory`` does not bound (:class:`~gnnscale.plan.host.HostBase`). Measured: minibatch's sampling lists
    1.5, offload's normalised, permuted and cut blocks with their transposes 7 (Kronecker scale 18)."""
    trains_jk: ClassVar[bool] = False
    """Whether the engine trains ``--jk`` (the class scores from every layer's output: :meth:`GNN.head
    <gnnscale.nn.stack.Stack.head>`); the engines that compute the scores with the last layer refuse it."""
    trains_layered: ClassVar[bool] = True
    """Whether the engine trains the layer-stack models (gcn, sage, gat, gin: ``--residual`` and ``--jk`` are
    theirs)."""
    splits_layers: ClassVar[bool] = True
    """Whether the engine runs a layer on parts of the graph (chunks, sampled blocks, ranks' shares): every engine
    but the in-memory one. A user's layer must then be local (:meth:`layer_reasons`)."""
    trains_decoupled: ClassVar[bool] = False
    """Whether the engine trains the decoupled models (:data:`~gnnscale.nn.decoupled.DECOUPLED_MODELS`)."""
    options: ClassVar[tuple[type, ...]] = ()
    """The option groups of :class:`~gnnscale.config.TrainConfig` this engine reads besides the model's and the
    run's (``ModelOptions``, ``RunOptions``): ``--help`` groups the flags by them, and a flag of another group
    has no effect on this engine (the CLI says so once)."""

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: torch.device):
        self.graph, self.model, self.config, self.device = graph, model, config, device
        allocator = config.host_allocator
        if allocator == "auto":
            allocator = "retain" if self.auto_retains(graph, model, config, device) else "untouched"
        if allocator != "untouched":
            rt.set_host_allocator(allocator)
        self.timings: dict[str, float] = {}
        """Seconds of the engine's preparation steps (partitioning, planning, ...), for the run's summary."""
        self.model.to(rt.torch_device(device))  # a sim device's tensors are in host memory
        self.optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        before_norm = model.biases_before_norm()
        if before_norm:  # their true gradient is zero: rounding noise must not move them (GNN.biases_before_norm)
            self.optimizer.register_step_pre_hook(lambda *_: _zero_grads(before_norm))

    @property
    def is_primary(self) -> bool:
        """Whether this process reports and writes (checkpoints, saved models): always, except on the ranks
        other than 0 of a distributed job."""
        return True

    @classmethod
    def check_options(cls, config: TrainConfig) -> None:
        """Raise :class:`~gnnscale.errors.ConfigError` when ``config``'s options for this engine cannot be right
        on any graph (run when a :class:`~gnnscale.config.TrainConfig` naming this engine is made); nothing by
        default."""
        del config

    @classmethod
    def not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device, *,
                              model: Stack | None = None) -> list[str]:
        """Why this engine cannot run this graph/model/budget on ``device``; empty when it can: the host memory it
        needs (:meth:`host_reason`, checked first, alone when short), the model's options, then a user's layers
        (:meth:`layer_reasons`), then the engine's own reasons. ``model``: the model to train when it is a
        user's (``train(model=...)``); ``None``: ``config``'s built-in one."""
        host = cls.host_reason(graph, config, model)
        if host:  # priced first and alone: the engine's own checks may plan (partition, chunk) the whole graph
            return [host]
        options = cls.model_option_reasons(config, model)
        if options:  # alone too, for the same reason
            return options
        layers = cls.layer_reasons(model)
        if layers:
            return layers
        return cls._not_supported_reasons(graph, config, device, model=model)

    @classmethod
    def layer_reasons(cls, model: Stack | None) -> list[str]:
        """Why this engine cannot train the layers of a user's ``model`` exactly: an engine that runs a layer on
        parts of the graph (every one but the in-memory engine: :attr:`splits_layers`) probes each user's layer
        once, whole against in chunks (:func:`~gnnscale.nn.probe.model_chunk_reasons`); a full-graph engine
        refuses a layer that draws its own random numbers too."""
        if model is None or not cls.splits_layers:
            return []
        return model_chunk_reasons(model, randomness=cls.mode == "full")

    @classmethod
    def auto_skip_reason(cls, config: TrainConfig) -> str | None:
        """Why ``--engine auto`` passes this engine over although it could train (``--engine NAME`` runs it);
        ``None`` by default."""
        del config
        return None

    @classmethod
    def model_option_reasons(cls, config: TrainConfig, model: Stack | None = None) -> list[str]:
        """Why this engine cannot train ``config``'s model: its kind (:attr:`trains_layered`,
        :attr:`trains_decoupled`, alone), else one line per model option (:mod:`gnnscale.nn.norm`) it cannot train
        exactly yet: ``--norm batch`` (:meth:`batch_norm_reason`) and ``--jk`` (:attr:`trains_jk`). LayerNorm and the
        residuals are per vertex: every engine drives the layers through :meth:`GNN.layer_input
        <gnnscale.nn.stack.Stack.layer_input>` and the layers' halves, and trains them unchanged."""
        name = config.model if model is None else model.kind
        decoupled = config.model in DECOUPLED_MODELS if model is None else model.decoupled
        if decoupled and not cls.trains_decoupled:
            return [f"{name} is a decoupled model, which this engine does not train"]
        if not decoupled and not cls.trains_layered:
            what = config.model if model is None else "a Stack of layers"
            return [f"it trains the decoupled models ({', '.join(DECOUPLED_MODELS)}) only, not {what}"]
        norm, jk = (config.norm, config.jk) if model is None else (model.norm, model.jk)
        reasons = []
        why = cls.batch_norm_reason(config) if norm == "batch" else None
        if why:
            reasons.append(f"--norm batch: {why}")
        if jk != "none" and not cls.trains_jk:
            reasons.append(f"--jk {jk}: this engine computes the class scores with the last layer (and its "
                           "evaluation layer by layer), not from every layer's output")
        return reasons

    @classmethod
    def batch_norm_reason(cls, config: TrainConfig) -> str | None:
        """Why this engine cannot train ``--norm batch`` exactly (``None``: it can). By default it cannot: a
        full-graph engine other than the in-memory one computes a layer in parts (chunks, devices), while
        BatchNorm's statistics span all of the layer's vertices; a sampled engine splits a batch among trainers."""
        del config
        if cls.mode == "full":
            return ("this engine computes a layer one chunk at a time, and the statistics must span every chunk "
                    "(not reduced across chunks yet); train it with --engine inmemory, or use --norm layer")
        return ("this engine's trainers would each normalise their own share of a batch, not the whole batch (the "
                "statistics are not reduced across them yet); train it with --engine minibatch on one device, or "
                "use --norm layer")

    @classmethod
    def auto_retains(cls, graph: Graph, model: Stack, config: TrainConfig, device: torch.device) -> bool:
        """Whether ``--host-allocator auto`` retains freed blocks: where host memory is the training device, no
        layer computes per edge and the host has room (:meth:`host_room`). A layer with per-edge work (GAT) frees
        ``[heads, E]``, ``[E]`` and ``[V, F]`` blocks of many sizes each epoch; kept in glibc's heap, they
        fragment it over the epochs (GAT, csbm 800K, one thread: the resident peak climbs from 4.4 to 5.2 GiB
        over five epochs, then stays; 3.1 GiB with glibc's default, at 1.6x the epoch time: benchmarks/HISTORY.md).
        There, ``auto`` leaves glibc's default and ``--host-allocator retain`` buys the speed with the memory."""
        return (device.type == "cpu" and not any(layer.edge_compute for layer in model.block_layers)
                and config.host_memory is None  # retained blocks are resident: past a budget's bound
                and cls.host_room(graph, config, model))

    @classmethod
    def honours_host_memory(cls) -> bool:
        """Whether ``--host-memory`` bounds this engine's host memory (it reads the option)."""
        return "host_memory" in cls.also_reads or any(
            "host_memory" in getattr(o, "__dataclass_fields__", {}) for o in cls.options)

    @classmethod
    def host_room(cls, graph: Graph, config: TrainConfig, model: Stack | None = None) -> bool:
        """Whether this engine's host estimate is at most half the available memory: then ``--host-allocator
        auto`` retains freed blocks (a larger resident peak), else it leaves glibc's default (a graph near the
        host's size needs every freed page back). ``model``: the model trained (``None``: ``config``'s)."""
        need = sum(estimate_host_bytes(graph, config, layer_copies=cls.host_layer_copies, model=model).values())
        return 2 * need <= rt.mem_get_info(torch.device("cpu"))[0]

    @classmethod
    def host_reason(cls, graph: Graph, config: TrainConfig, model: Stack | None = None) -> str | None:
        """Why the host cannot hold what this engine keeps there (its estimate against the available memory);
        ``None`` when it can. ``model``: a user's model (its widths and parameters; ``None``: ``config``'s)."""
        parts = estimate_host_bytes(graph, config, layer_copies=cls.host_layer_copies, model=model)
        if cls.spills_to_scratch and config.host_memory is not None \
                and "activations" in parts:  # what --host-memory cannot hold spills to files: not RAM
            spill = parts["activations"] - config.host_memory
            folder = config.scratch or tempfile.gettempdir()
            try:
                free = shutil.disk_usage(folder).free
            except OSError:
                free = None  # the folder is made (and its error said) when the engine spills
            if free is not None and spill > free:
                return (f"spills about {format_bytes(spill)} of activations past --host-memory to files in {folder}, "
                        f"which has {format_bytes(free)} free: raise --host-memory, choose a --scratch folder with "
                        "room, or lower --hidden or --layers")
            parts["activations"] = min(parts["activations"], config.host_memory)
        need, have = sum(parts.values()), rt.mem_get_info(torch.device("cpu"))[0]
        if need <= have:
            return None
        detail = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items())
        return (f"needs about {format_bytes(need)} of host memory ({detail}), more than is available "
                f"({format_bytes(have)}): lower --hidden or --layers, or use a machine with more memory")

    @classmethod
    def estimate(cls, graph: Graph, config: TrainConfig, device: torch.device, *, model: Stack | None = None) -> str:
        """One line for ``gnnscale plan``: what this engine would take for this graph and config (its memory
        model's peak, its plan); empty when it has no model. Called only when :meth:`not_supported_reasons` is
        empty. ``model``: a user's model to train (``None``: ``config``'s)."""
        del graph, config, device, model
        return ""

    @classmethod
    def predict_epoch(cls, graph: Graph, config: TrainConfig, device: torch.device, rates: Rates, *,
                      model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime | None:
        """This engine's predicted training epoch (:mod:`gnnscale.plan.epoch_time`): its seed system's performance
        model fed with ``rates``; ``None`` when it has none. Called only when :meth:`not_supported_reasons` is
        empty. ``model``: a user's model to train (``None``: ``config``'s); ``cluster``: a what-if of more
        machines or devices (the default: this machine as it is)."""
        del graph, config, device, rates, model, cluster
        return None

    @classmethod
    def predicts_epochs(cls) -> bool:
        """Whether this engine overrides :meth:`predict_epoch` (has a model of its epoch time)."""
        return cls.predict_epoch.__func__ is not Engine.predict_epoch.__func__  # type: ignore[attr-defined]

    @classmethod
    def predict_floor(cls, graph: Graph, config: TrainConfig, device: torch.device, rates: Rates, *,
                      model: Stack | None = None) -> float:
        """A lower bound of :meth:`predict_epoch`'s seconds found without planning (``0``: none): ``--engine auto``
        does not plan an engine whose floor is already slower than a candidate it predicted."""
        del graph, config, device, rates, model
        return 0.0

    @classmethod
    @abstractmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device, *,
                               model: Stack | None = None) -> list[str]: ...

    @abstractmethod
    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One forward/backward pass over the training vertices and one optimiser step.

        Returns ``{"loss": ..., **counters}``; engines add their own counters (bytes moved, chunks, ...).
        """

    @abstractmethod
    def evaluate(self) -> dict[str, float | None]:
        """Accuracy on ``train``/``val``/``test`` masks without dropout: ``{"train_acc", "val_acc", "test_acc"}``."""

    def predict(self) -> Tensor:
        """``[N]`` int64: every vertex's predicted class, in the graph's vertex order, without dropout -- through
        the engine's own inference path (chunked, layer-wise or pipelined), so whatever trains under a memory
        budget also predicts under it."""
        raise NotImplementedError(f"engine {self.name} does not predict")

    def state_dict(self) -> dict[str, Any]:
        """Engine state a checkpoint must keep besides the model and optimiser (empty by default: the engines'
        dropout masks, epoch permutations and samples are keyed by (seed, epoch), so nothing else carries over
        between epochs). An engine with state across epochs returns it here and takes it in
        :meth:`load_state_dict`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` returned (after the model's and optimiser's state are loaded)."""
        if state:
            raise ValueError(f"engine {self.name} keeps no state, but the checkpoint has {sorted(state)}")

    def report(self) -> dict[str, Any]:
        """What the engine reports once, in the summary record (``engine_report``): e.g. predicted against
        measured stage times; empty by default."""
        return {}

    def describe(self) -> str:
        """One line about how this engine runs (its plan), for the CLI and the summary record; may be empty."""
        return ""

    def accuracies(self, pred: Tensor, y: Tensor, masks: dict[str, Tensor]) -> dict[str, float | None]:
        """Accuracy of predicted classes ``pred`` (``[N]``; or logits ``[N, C]``) per mask (``None`` for an empty
        or missing mask)."""
        if pred.dim() == 2:
            pred = pred.argmax(dim=-1)
        out: dict[str, float | None] = {}
        for mname in MASK_NAMES:
            key = mname.replace("_mask", "_acc")
            m = masks.get(mname)
            n = 0 if m is None else int(m.sum())  # counted exactly, divided in float64: every engine's figure is
            out[key] = None if n == 0 else int((pred[m] == y[m]).sum()) / n  # the same whatever its device
        return out


def _zero_grads(params: list[torch.nn.Parameter]) -> None:
    """Make the gradients of ``params`` exactly zero (those with none keep none)."""
    for p in params:
        if p.grad is not None:
            p.grad.zero_()
