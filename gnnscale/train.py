"""``gnnscale.train(graph, config)``: the one training loop every engine runs under."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gnnscale import runtime as rt
from gnnscale.checkpoint import (
    RESUME_FIELDS,
    check_checkpoint_args,
    check_fields,
    check_optimizer_state,
    check_resumable,
    check_resume_records,
    checkpoint_path,
    load_checkpoint,
    lock_checkpoint,
    save_checkpoint,
)
from gnnscale.config import TrainConfig
from gnnscale.engines import ignored_warning, select_engine
from gnnscale.engines.base import Engine
from gnnscale.engines.devices import peak_device_bytes, reset_peak_device_bytes, resolve_devices
from gnnscale.errors import ConfigError, GnnscaleError, GraphError, TrainingError
from gnnscale.graph.fingerprint import fingerprint
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack, as_stack, build_model
from gnnscale.nn.factory import build_from_factory
from gnnscale.nn.stack import class_count
from gnnscale.notes import note, warn
from gnnscale.plan.host import HostBase, host_base, host_peak_bytes
from gnnscale.predict import save_model
from gnnscale.progress import stage, timed
from gnnscale.report import plot_records
from gnnscale.units import format_bytes

EpochRecord = dict[str, Any]
ITERATION_CHECKPOINTS = 100
"""Iterations between checkpoints within an epoch, by default, for engines that checkpoint mid-epoch (the
distributed engine: HopGNN §8's iteration-level checkpoints)."""


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model, one record per epoch, and the summary record."""

    model: Stack
    """The model as trained: its weights are the *last* epoch's."""
    history: list[EpochRecord]
    summary: EpochRecord
    engine: str
    rejected: dict[str, list[str]] = field(default_factory=dict)
    best_state: dict[str, torch.Tensor] = field(default_factory=dict)
    """A CPU copy of the weights at the epoch the summary calls best (``best_epoch``): restore them with
    ``result.model.load_state_dict(result.best_state)``."""

    def plot(self, out: str | os.PathLike[str] | None = None, *, dpi: int = 100) -> Any:
        """The figure ``gnnscale report`` draws of this run's metrics file (the same panels: loss, accuracy, epoch
        time, memory held, bytes moved), from :attr:`history` in memory: a matplotlib ``Figure`` (a notebook shows
        it), also written as a PNG to ``out`` when given. Needs matplotlib (``pip install gnnscale[report]``)."""
        return plot_records(self.history, self.summary, out, dpi=dpi)

    def __repr__(self) -> str:
        """One line: the engine, the epochs and the accuracies (not the model's weights)."""
        s = self.summary
        fields = {"engine": self.engine, "model": s.get("model"), "dataset": s.get("dataset"),
                  "epochs": len(self.history), "interrupted": s.get("interrupted"), "best_epoch": s.get("best_epoch"),
                  "best_val_acc": s.get("best_val_acc"), "test_acc_at_best_val": s.get("test_acc_at_best_val"),
                  "final_test_acc": self.history[-1].get("test_acc") if self.history else None}
        return "TrainResult(" + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v!r}"
                                          for k, v in fields.items() if v is not None) + ")"


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


def as_graph(graph: object) -> Graph:
    """``graph`` itself, or a PyG ``Data`` converted by :meth:`Graph.from_pyg` (said in a note); anything else is
    a GraphError naming the ways to build a Graph."""
    if isinstance(graph, Graph):
        return graph
    if getattr(graph, "edge_index", None) is not None:
        note(f"train: converted the {type(graph).__name__} with Graph.from_pyg (call it yourself to pick a split=, "
             "a name or coalesce=True)")
        return Graph.from_pyg(graph)
    raise GraphError(f"train takes a gnnscale Graph, got a {type(graph).__name__}: build one with Graph.from_pyg("
                     "data), Graph.from_edge_index(edge_index, x=..., y=..., train_mask=...) or load_dataset(spec)")


def made_up_parts(graph: Graph) -> list[str]:
    """Which of the graph's ``features`` and ``labels`` a reader made up (drawn at random: the data had none), as
    its ``meta["made_up"]`` records them."""
    return [p for p in ("features", "labels") if p in (graph.meta.get("made_up") or [])]


_UNWEIGHTED = {"sage": "as PyG's SAGEConv, which takes no edge_weight",
               "gat": "as PyG's GATConv, which reads edge features only with edge_dim",
               "gin": "as PyG's GINConv, which takes no edge_weight", "dgat": "its attention weighs the edges",
               "mlp": "it reads no edges"}
"""Why a model that does not read edge weights does not (the note's words)."""


def data_caveats(graph: Graph, model: Stack) -> list[tuple[str, str]]:
    """What training ``model`` on ``graph`` quietly would not do as its user may think, as ``(kind, line)`` pairs
    (``note``/``warn``): edge weights the model does not read (only GCN's normalised adjacency is weighted, as in
    PyG, where ``GCNConv`` takes ``edge_weight`` and ``SAGEConv``, ``GATConv`` and ``GINConv`` do not), and a train
    split of fewer than two classes (every prediction is then that class: accuracies of 1.0 say nothing)."""
    out = []
    if graph.edge_weight is not None and not model.adjacency.weighted:
        why = _UNWEIGHTED.get(model.kind, "it aggregates over unweighted edges")
        out.append(("note", f"the {model.kind} model ignores the edge weights of {graph.name} ({why}); only gcn "
                            "and dgcn aggregate with them"))
    if graph.y is not None and graph.train_mask is not None:
        classes = torch.unique(graph.y[graph.train_mask])
        if classes.numel() == 1:  # (none: an empty train split, an error of check_trainable)
            c = int(classes[0])
            named = f" ({graph.class_names[c]!r})" if graph.class_names else ""
            out.append(("warn", f"the {int(graph.train_mask.sum())} training vertices of {graph.name} all have class "
                                f"{c}{named}: the model learns to predict that class, and its accuracies (1.0 where "
                                "every vertex has it) say nothing"))
    return out


def _host_bound(record: EpochRecord, base: HostBase, budget: int | None, warned: bool) -> bool:
    """The epoch record's ``host_base_bytes`` and ``host_peak_bytes`` (``VmHWM`` so far); a warning, unless
    ``warned`` already, when the peak passed the base plus ``--host-memory``. Whether it has warned."""
    peak = host_peak_bytes()
    record["host_base_bytes"], record["host_peak_bytes"] = base.total, peak
    assert budget is not None
    if peak is not None and peak > base.total + budget and not warned:
        warn(f"--host-memory {format_bytes(budget)}: the peak resident memory {format_bytes(peak)} passed the "
             f"{format_bytes(base.total + budget)} it should stay under ({base.describe(budget)})")
        return True
    return warned


MODEL_FIELDS = ("model", "hidden", "layers", "dropout", "heads", "norm", "residual", "jk", "input_dropout")
"""The config's fields that describe the model: ignored when :func:`train` is given a model of the user's."""


def user_model(model: torch.nn.Module | None, config: TrainConfig, graph: Graph, primary: bool) -> Stack | None:
    """The user's model an engine trains: ``model`` as a Stack (:func:`~gnnscale.nn.as_stack`), else the one
    ``config.model_factory`` makes (:func:`~gnnscale.nn.factory.build_from_factory`), else ``None`` (the config's
    built-in model); with one warning (``primary``: the process that reports) naming the config's model fields
    that were set, which do not apply to a model of the user's."""
    if model is None and config.model_factory is None:
        return None
    assert graph.num_classes is not None
    if model is not None:
        stack = as_stack(model)
    else:
        assert config.model_factory is not None
        stack = build_from_factory(config.model_factory, graph.num_features, graph.num_classes, config.seed)
    default = TrainConfig()
    changed = [f"{f}={getattr(config, f)!r}" for f in MODEL_FIELDS if getattr(config, f) != getattr(default, f)
               and not (f == "layers" and config.layers == len(stack.layers))]  # (the sampled engines' fanouts)
    if model is not None and config.model_factory is not None:
        changed.append(f"model_factory={config.model_factory!r}")
    if changed and primary:
        who = "model=" if model is not None else f"--model-factory {config.model_factory}"
        warn(f"{who}: the config's model fields are ignored ({', '.join(changed)}): the model given is trained")
    check_model_fits(stack, graph)
    return stack


def check_model_fits(model: Stack, graph: Graph) -> None:
    """A user's model must take the graph's features and give its classes."""
    width, classes = model.block_layers[0].in_features, class_count(model)
    if width != graph.num_features or classes != graph.num_classes:
        raise ConfigError(f"the model takes {width} features and gives {classes} class scores; {graph.name} has "
                          f"{graph.num_features} features and {graph.num_classes} classes")


def train(
    graph: Graph,
    config: TrainConfig,
    device: str | torch.device = "auto",
    *,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    on_start: Callable[[Engine, dict[str, list[str]], dict[str, float]], None] | None = None,
    timings: dict[str, float] | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 1,
    checkpoint_iterations: int | None = None,
    resume: bool = False,
    on_resume: Callable[[list[EpochRecord]], None] | None = None,
    on_stop: Callable[[TrainResult, BaseException], None] | None = None,
    model: torch.nn.Module | None = None,
) -> TrainResult:
    """Train ``config.model`` on ``graph`` with the selected engine; same seed and device -> same metrics.

    Args:
        graph: features, labels and a train mask are required.
        config: model, optimiser and engine settings.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        on_epoch: called with each epoch's record (progress bars, metrics files).
        on_start: called before the first epoch with the engine, the engines ``auto`` rejected (and why) and the
            seconds each preparation step took (``prepare_s`` this function's part, ``ready_s`` with the caller's
            ``load_s``): the CLI prints the plan there.
        timings: seconds of steps the caller ran before (``load_s``, a part of the summary's ``wall_s``),
            reported with the engine's own. The summary's ``timings`` split the wall time into parts that sum to
            it (``engines.schema.WALL_PARTS``, docs/metrics.md).
        checkpoint: a folder for ``checkpoint.pt`` (:mod:`gnnscale.checkpoint`), written every
            ``checkpoint_every`` epochs and after the last one.
        checkpoint_iterations: also every this many iterations within an epoch (engines that checkpoint mid-epoch:
            the distributed one); 0: at epoch ends only; ``None``: :data:`ITERATION_CHECKPOINTS` for those engines,
            0 for the others.
        resume: go on from the checkpoint in ``checkpoint`` when there is one (the epochs it holds are not
            trained again, and ``on_epoch`` is not called for them); a config that changes the model is refused.
        on_resume: called with the checkpoint's epoch records before the first new epoch (a metrics file
            continues from them).
        on_stop: called when training stops before its last epoch (Ctrl-C, SIGTERM, an error) with what it has
            (the model as it stands, the finished epochs' records, the best weights so far; ``summary`` holds
            ``interrupted``, ``epochs_done`` and ``best_epoch``) and the exception, which is raised again after.
        model: a model of your own to train instead of ``config.model``: a :class:`~gnnscale.nn.Stack` (of PyG
            convs or gnnscale layers) or a PyG ``BasicGNN`` (converted over its parameters,
            :func:`~gnnscale.nn.as_stack`). It is trained in place (``result.model`` is the Stack that holds its
            parameters); the config's model fields (``model``, ``hidden``, ``layers``, ...) are then ignored,
            with a warning naming those set. docs/own-model.md says what a layer must satisfy.

    Raises:
        GnnscaleError: bad config, unusable graph, or no engine fits; the message says which.
    """
    start = time.perf_counter()
    graph = as_graph(graph)  # a PyG Data too
    dev = resolve_devices(config, device)
    check_trainable(graph)
    made_up = made_up_parts(graph)
    if made_up:
        note(f"the {' and '.join(made_up)} of {graph.name} are made up (drawn at random: the data has none)"
             + ("; accuracy on made-up labels is not a result" if "labels" in made_up else ""))
    check_checkpoint_args(checkpoint, checkpoint_every, resume)
    if checkpoint_iterations is not None and checkpoint_iterations < 0:
        raise ConfigError(f"--checkpoint-iterations must be >= 0, got {checkpoint_iterations}")
    if checkpoint_iterations and checkpoint is None:
        raise ConfigError("--checkpoint-iterations needs --checkpoint DIR (where to write)")
    # one run per checkpoint folder (rank 0 of a job writes; the launcher of a --ranks job holds it for its ranks)
    lock = lock_checkpoint(checkpoint) if checkpoint is not None and os.environ.get("RANK", "0") == "0" else None
    try:
        return _train(graph, config, dev, start, made_up, on_epoch=on_epoch, on_start=on_start, timings=timings,
                      checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                      checkpoint_iterations=checkpoint_iterations, resume=resume, on_resume=on_resume,
                      on_stop=on_stop, given=model)
    finally:
        if lock is not None:
            lock.release()


def _train(
    graph: Graph,
    config: TrainConfig,
    dev: torch.device,
    start: float,
    made_up: list[str],
    *,
    on_epoch: Callable[[EpochRecord], None] | None,
    on_start: Callable[[Engine, dict[str, list[str]], dict[str, float]], None] | None,
    timings: dict[str, float] | None,
    checkpoint: str | os.PathLike[str] | None,
    checkpoint_every: int,
    checkpoint_iterations: int | None,
    resume: bool,
    on_resume: Callable[[list[EpochRecord]], None] | None,
    on_stop: Callable[[TrainResult, BaseException], None] | None,
    given: torch.nn.Module | None = None,
) -> TrainResult:
    """:func:`train` after its checks, under the checkpoint folder's lock."""
    saved = load_checkpoint(checkpoint) if resume and checkpoint is not None else None
    prints = fingerprint(graph) if checkpoint is not None else None  # the graph's content, kept with each checkpoint
    resumed = f"--resume: {checkpoint_path(checkpoint or '')}"
    if saved is not None:
        check_fields(saved, RESUME_FIELDS, resumed, "checkpoint")
        check_resume_records(saved, resumed)
        check_resumable(saved, config, graph.name, graph.num_nodes, prints)
    loaded = host_peak_bytes()  # the graph is loaded; the engines' planners have not run
    own = user_model(given, config, graph, os.environ.get("RANK", "0") == "0")
    engine_cls, rejected = select_engine(graph, config, dev, model=own)
    warned = False
    # what --host-memory does not bound (the peak is at most base + budget): the loaded process, the engine's
    # topology index (its planner's and its own copies of the CSR), kernels
    base = (None if config.host_memory is None or not engine_cls.honours_host_memory()
            else host_base(graph.num_nodes, graph.num_edges, engine_cls.host_topology_copies, loaded))
    assert graph.num_classes is not None
    model = own if own is not None else build_model(config.model, graph.num_features, config.hidden,
                                                    graph.num_classes, **config.model_kwargs())
    setup: dict[str, float] = {}
    with stage("setup", setup):
        engine = engine_cls(graph, model, config, dev)
    ignored = ignored_warning(config, engine_cls.name)
    if ignored and engine.is_primary:  # the API and the CLI say it alike, once per job
        warn(ignored)
    for kind, line in data_caveats(graph, model) if engine.is_primary else []:
        (note if kind == "note" else warn)(line)
    if config.scratch is not None and config.host_memory is None and engine.is_primary:
        warn("--scratch has no effect without --host-memory: nothing spills to files unless a host budget cannot "
             "hold it")
    # in the order the steps ran: the caller's (load), the engine's steps (within its set-up), its set-up; then
    # this function's part before the first epoch (prepare_s: checks, selection, model, set-up) and the total
    load_s = (timings or {}).get("load_s", 0.0)
    ready = {**(timings or {}), **engine.timings, **setup}
    ready["prepare_s"] = time.perf_counter() - start
    ready["ready_s"] = load_s + ready["prepare_s"]
    spent = {"training_s": 0.0, "eval_s": 0.0, "checkpoint_s": 0.0}  # the loop's parts of the wall time
    if on_start is not None:
        on_start(engine, rejected, ready)
    history: list[EpochRecord] = []
    best: EpochRecord | None = None
    best_state: dict[str, torch.Tensor] = {}
    best_by = "val" if graph.val_mask is not None and bool(graph.val_mask.any()) else "train"
    first = 1
    if saved is not None:
        try:
            model.load_state_dict(saved["model"])
            check_optimizer_state(engine.optimizer, saved["optimizer"], resumed)
            engine.optimizer.load_state_dict(saved["optimizer"])
            engine.load_state_dict(saved["engine"])
            ref, kept = model.state_dict(), saved["best_state"]
            if kept and (set(kept) != set(ref) or any(not isinstance(kept[k], torch.Tensor) or kept[k].shape
                                                      != ref[k].shape or kept[k].dtype != ref[k].dtype for k in ref)):
                raise ValueError("the best epoch's weights are not the model's")
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:  # read, but damaged or edited
            if isinstance(exc, GnnscaleError):
                raise
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"{resumed} is damaged: its state does not fit the model ({first_line})") from None
        history, best, best_state = saved["history"], saved.get("best"), saved["best_state"]
        first = saved["epoch"] + 1
        if on_resume is not None:
            on_resume(history)

    def save(epoch: int) -> None:
        with timed("checkpoint_s", spent):
            write(epoch)

    def write(epoch: int) -> None:
        assert checkpoint is not None
        if not engine.is_primary:  # one writer per job (the ranks of a distributed job hold the same state)
            return
        try:
            Path(checkpoint).mkdir(parents=True, exist_ok=True)
            save_model(Path(checkpoint) / "model.pt", model, config, graph, best_state, fingerprint=prints)
            save_checkpoint(checkpoint, {
                "epoch": epoch, "config": asdict(config), "dataset": graph.name, "num_nodes": graph.num_nodes,
                "fingerprint": prints,
                "engine_name": engine_cls.name, "model": model.state_dict(),
                "optimizer": engine.optimizer.state_dict(), "engine": engine.state_dict(), "history": history,
                "best": best, "best_state": best_state})
        except OSError as exc:  # the folder went away, the disk is full: one line (on_stop keeps the model)
            raise ConfigError(f"could not write the checkpoint in {checkpoint} ({exc.strerror or exc})") from exc

    if checkpoint_iterations is None:
        checkpoint_iterations = ITERATION_CHECKPOINTS if checkpoint is not None and hasattr(engine, "on_iteration") \
            else 0
    if checkpoint_iterations:
        if not hasattr(engine, "on_iteration"):
            raise ConfigError(f"--checkpoint-iterations: the {engine_cls.name} engine checkpoints at epoch ends only "
                              "(--checkpoint-every)")

        def save_within(epoch: int, done: int) -> None:
            if done % checkpoint_iterations == 0:
                save(epoch - 1)  # epoch - 1 epochs are whole; the engine's state holds this one's progress

        engine.on_iteration = save_within  # type: ignore[attr-defined]

    try:
        for epoch in range(first, config.epochs + 1):
            reset_peak_device_bytes(dev)
            t0, written = time.perf_counter(), spent["checkpoint_s"]
            stats = engine.train_epoch(epoch)
            if rt.is_accelerator(dev):
                rt.synchronize(dev)  # the epoch's time includes its device work
            epoch_time = time.perf_counter() - t0
            spent["training_s"] += epoch_time - (spent["checkpoint_s"] - written)  # less checkpoints within it
            with timed("eval_s", spent):
                accs = engine.evaluate()
            record: EpochRecord = {
                "epoch": epoch,
                "loss": stats.pop("loss"),
                **accs,
                "epoch_time_s": epoch_time,
                "peak_device_bytes": peak_device_bytes(dev),
                **stats,
            }
            if base is not None:
                warned = _host_bound(record, base, config.host_memory, warned)
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
            if checkpoint is not None and (epoch % checkpoint_every == 0 or epoch == config.epochs):
                save(epoch)  # before the epoch is reported: a record seen means its checkpoint is on disk
            if on_epoch is not None:
                on_epoch(record)
    except BaseException as exc:
        if on_stop is not None:  # Ctrl-C, SIGTERM, a failed write: the caller keeps what was trained
            done = history[-1]["epoch"] if history else first - 1
            on_stop(TrainResult(model=model, history=history, engine=engine_cls.name, rejected=rejected,
                                best_state=best_state,
                                summary={"interrupted": True, "epochs_done": done,
                                         "best_epoch": best["epoch"] if best is not None else None}), exc)
        raise
    assert best is not None
    total_s = time.perf_counter() - start
    parts = {"load_s": load_s, "prepare_s": ready["prepare_s"], **spent}
    wall_s = load_s + total_s
    parts["other_s"] = max(0.0, wall_s - sum(parts.values()))  # callbacks, best weights, resumed state, summary
    summary: EpochRecord = {
        "summary": True,
        "engine": engine_cls.name,
        "device": str(dev),
        "model": config.model if own is None else model.kind,  # a user's: its kind (``stack``: its own layers)
        "model_factory": config.model_factory if own is not None and given is None else None,
        "dataset": graph.name,
        "dataset_spec": graph.meta.get("spec", graph.name),
        "epochs": config.epochs,
        "best_val_acc": best["_val"] if best_by == "val" else None,
        "best_by": best_by,
        "best_epoch": best["epoch"],
        "test_acc_at_best_val": best["test_acc"],
        "final_test_acc": history[-1]["test_acc"],
        "total_time_s": total_s,
        "timings": {**ready, "epoch_s": sum(r["epoch_time_s"] for r in history) / len(history), **parts,
                    "wall_s": wall_s},
        "engine_detail": engine.describe(),
        "engine_report": engine.report(),
        "config": asdict(config),
        "resumed_from_epoch": first - 1 if saved is not None else None,
        "made_up": made_up,
    }
    return TrainResult(model=model, history=history, summary=summary, engine=engine_cls.name, rejected=rejected,
                       best_state=best_state)
