"""``gnnscale.train(graph, config)``: the one training loop every engine runs under, in named steps.

1. load and check (:func:`_load_and_check`): the graph (:mod:`gnnscale.trainable`), the device, the checkpoint
   settings;
2. plan (:func:`_plan`): the checkpoint to resume from, the user's model, the engine
   (:func:`~gnnscale.engines.select_engine`);
3. build or resume (:func:`_build`, :func:`_resume`): the model and its engine, or the checkpoint's state;
4. run the epochs (:func:`_run_epochs`: :func:`_epoch`, :func:`_keep_best`, :func:`_save` for checkpoints);
5. save and report (:func:`_report`): the summary record and the :class:`TrainResult`.

Checkpoints save ``model.pt`` through :func:`gnnscale.saved_model.save_model`, below this module and
:mod:`gnnscale.predict`: training never calls into prediction."""

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
from gnnscale.engines import ignored_warning, resolve_devices, select_engine
from gnnscale.engines.core.base import Engine
from gnnscale.engines.core.devices import peak_device_bytes, reset_peak_device_bytes
from gnnscale.errors import ConfigError, GnnscaleError, TrainingError
from gnnscale.graph.fingerprint import fingerprint
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack, build_model
from gnnscale.notes import note, warn
from gnnscale.plan.host import HostBase, host_base, host_peak_bytes
from gnnscale.progress import stage, timed
from gnnscale.report import plot_records
from gnnscale.saved_model import save_model
from gnnscale.trainable import as_graph, check_trainable, data_caveats, made_up_parts, user_model
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
            seconds each preparation step took (``prepare_s``, ``ready_s``): the CLI prints the plan there.
        timings: seconds of steps the caller ran before (``load_s``), reported with the engine's own; the summary's
            ``timings`` split the wall time into parts that sum to it (docs/metrics.md).
        checkpoint: a folder for ``checkpoint.pt`` (:mod:`gnnscale.checkpoint`), written every ``checkpoint_every``
            epochs, after the last one, and every ``checkpoint_iterations`` iterations within an epoch where the
            engine checkpoints mid-epoch (0: epoch ends only; ``None``: :data:`ITERATION_CHECKPOINTS` there).
        resume: go on from the checkpoint in ``checkpoint`` when there is one (its epochs are not trained again);
            a config that changes the model is refused. ``on_resume`` gets the checkpoint's epoch records first.
        on_stop: called when training stops before its last epoch (Ctrl-C, SIGTERM, an error) with what it has
            (``summary`` holds ``interrupted``, ``epochs_done`` and ``best_epoch``) and the exception, raised again.
        model: a model of your own instead of ``config.model``: a :class:`~gnnscale.nn.Stack` (of PyG convs or
            gnnscale layers) or a PyG ``BasicGNN`` (:func:`~gnnscale.nn.as_stack`), trained in place; the config's
            model fields are then ignored, with a warning. docs/own-model.md says what a layer must satisfy.

    Raises:
        GnnscaleError: bad config, unusable graph, or no engine fits; the message says which.
    """
    start = time.perf_counter()
    graph, dev, made_up = _load_and_check(graph, config, device, checkpoint, checkpoint_every,
                                          checkpoint_iterations, resume)
    # one run per checkpoint folder (rank 0 of a job writes; the launcher of a --ranks job holds it for its ranks)
    lock = lock_checkpoint(checkpoint) if checkpoint is not None and _primary() else None
    try:
        plan = _plan(graph, config, dev, checkpoint, resume, model)
        run = _build(graph, config, dev, start, made_up, plan, model, timings)
        if on_start is not None:
            on_start(run.engine, plan.rejected, run.ready)
        if plan.saved is not None:
            _resume(run, plan.saved, checkpoint, on_resume)
        _checkpoint_iterations(run, checkpoint, checkpoint_iterations)
        _run_epochs(run, checkpoint, checkpoint_every, on_epoch, on_stop)
        return _report(run)
    finally:
        if lock is not None:
            lock.release()


def _primary() -> bool:
    """Whether this process reports and writes: rank 0 of a job (every process outside one)."""
    return os.environ.get("RANK", "0") == "0"


def _resumed(checkpoint: str | os.PathLike[str] | None) -> str:
    """How errors name the checkpoint a run resumes from."""
    return f"--resume: {checkpoint_path(checkpoint or '')}"


@dataclass
class _Plan:
    """What :func:`_plan` decides before anything is built."""

    saved: dict[str, Any] | None
    """The checkpoint resumed from (checked against the config and the graph), or ``None``."""
    prints: dict[str, str] | None
    """The graph's fingerprint, kept with each checkpoint (``None`` without ``checkpoint``)."""
    own: Stack | None
    """The user's model (``model=`` or ``--model-factory``), or ``None``: the config's built-in model."""
    engine_cls: type[Engine]
    rejected: dict[str, list[str]]
    """The engines ``auto`` passed over, and why."""
    base: HostBase | None
    """What ``--host-memory`` does not bound, when it is given and the engine honours it."""


@dataclass
class _Run:
    """One run as :func:`train`'s steps hand it on: what they were given, the plan, the model and its engine, the
    preparation's seconds, and the epochs' bookkeeping (records, best epoch and its weights, wall-time parts)."""

    graph: Graph
    config: TrainConfig
    dev: torch.device
    start: float
    made_up: list[str]
    given: torch.nn.Module | None
    plan: _Plan
    model: Stack
    engine: Engine
    ready: dict[str, float]
    load_s: float
    best_by: str
    """``val``, or ``train`` for a graph without validation vertices."""
    first: int = 1
    """The first epoch to train (after a resumed checkpoint's)."""
    history: list[EpochRecord] = field(default_factory=list)
    best: EpochRecord | None = None
    best_state: dict[str, torch.Tensor] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=lambda: {"training_s": 0.0, "eval_s": 0.0, "checkpoint_s": 0.0})
    """The epoch loop's parts of the wall time."""
    warned: bool = False
    """Whether the run has said that the host peak passed its bound."""


def _load_and_check(graph: object, config: TrainConfig, device: str | torch.device,
                    checkpoint: str | os.PathLike[str] | None, every: int, iterations: int | None,
                    resume: bool) -> tuple[Graph, torch.device, list[str]]:
    """Step 1, load and check: the graph (a PyG ``Data`` converted), the device, the parts of the graph a reader
    made up (said in a note), and the checkpoint settings."""
    graph = as_graph(graph)  # a PyG Data too
    dev = resolve_devices(config, device)
    check_trainable(graph)
    made_up = made_up_parts(graph)
    if made_up:
        note(f"the {' and '.join(made_up)} of {graph.name} are made up (drawn at random: the data has none)"
             + ("; accuracy on made-up labels is not a result" if "labels" in made_up else ""))
    check_checkpoint_args(checkpoint, every, resume)
    if iterations is not None and iterations < 0:
        raise ConfigError(f"--checkpoint-iterations must be >= 0, got {iterations}")
    if iterations and checkpoint is None:
        raise ConfigError("--checkpoint-iterations needs --checkpoint DIR (where to write)")
    return graph, dev, made_up


def _plan(graph: Graph, config: TrainConfig, dev: torch.device, checkpoint: str | os.PathLike[str] | None,
          resume: bool, given: torch.nn.Module | None) -> _Plan:
    """Step 2, plan: the checkpoint to resume from (checked against the config and the graph), the user's model,
    the engine (:func:`~gnnscale.engines.select_engine`) and what ``--host-memory`` does not bound."""
    saved = load_checkpoint(checkpoint) if resume and checkpoint is not None else None
    prints = fingerprint(graph) if checkpoint is not None else None  # the graph's content, kept with each checkpoint
    if saved is not None:
        check_fields(saved, RESUME_FIELDS, _resumed(checkpoint), "checkpoint")
        check_resume_records(saved, _resumed(checkpoint))
        check_resumable(saved, config, graph.name, graph.num_nodes, prints)
    loaded = host_peak_bytes()  # the graph is loaded; the engines' planners have not run
    own = user_model(given, config, graph, _primary())
    engine_cls, rejected = select_engine(graph, config, dev, model=own)
    # what --host-memory does not bound (the peak is at most base + budget): the loaded process, the engine's
    # topology index (its planner's and its own copies of the CSR), kernels
    base = (None if config.host_memory is None or not engine_cls.honours_host_memory()
            else host_base(graph.num_nodes, graph.num_edges, engine_cls.host_topology_copies, loaded))
    return _Plan(saved, prints, own, engine_cls, rejected, base)


def _build(graph: Graph, config: TrainConfig, dev: torch.device, start: float, made_up: list[str], plan: _Plan,
           given: torch.nn.Module | None, timings: dict[str, float] | None) -> _Run:
    """Step 3, build: the model (the user's, or the config's built-in one) and the engine set up on it; the run's
    warnings and notes (settings the engine ignores, data caveats, ``--scratch`` without ``--host-memory``); the
    seconds each preparation step took."""
    assert graph.num_classes is not None
    model = plan.own if plan.own is not None else build_model(config.model, graph.num_features, config.hidden,
                                                              graph.num_classes, **config.model_kwargs())
    setup: dict[str, float] = {}
    with stage("setup", setup):
        engine = plan.engine_cls(graph, model, config, dev)
    ignored = ignored_warning(config, plan.engine_cls.name)
    if ignored and engine.is_primary:  # the API and the CLI say it alike, once per job
        warn(ignored)
    for kind, line in data_caveats(graph, model) if engine.is_primary else []:
        (note if kind == "note" else warn)(line)
    if config.scratch is not None and config.host_memory is None and engine.is_primary:
        warn("--scratch has no effect without --host-memory: nothing spills to files unless a host budget cannot "
             "hold it")
    # in the order the steps ran: the caller's (load), the engine's steps (within its set-up), its set-up; then
    # train's part before the first epoch (prepare_s: checks, selection, model, set-up) and the total
    load_s = (timings or {}).get("load_s", 0.0)
    ready = {**(timings or {}), **engine.timings, **setup}
    ready["prepare_s"] = time.perf_counter() - start
    ready["ready_s"] = load_s + ready["prepare_s"]
    best_by = "val" if graph.val_mask is not None and bool(graph.val_mask.any()) else "train"
    return _Run(graph, config, dev, start, made_up, given, plan, model, engine, ready, load_s, best_by)


def _resume(run: _Run, saved: dict[str, Any], checkpoint: str | os.PathLike[str] | None,
            on_resume: Callable[[list[EpochRecord]], None] | None) -> None:
    """Step 3 on a resume: the checkpoint's model, optimiser and engine state, its records and best epoch; a state
    that does not fit the model is one ConfigError saying the file is damaged."""
    try:
        run.model.load_state_dict(saved["model"])
        check_optimizer_state(run.engine.optimizer, saved["optimizer"], _resumed(checkpoint))
        run.engine.optimizer.load_state_dict(saved["optimizer"])
        run.engine.load_state_dict(saved["engine"])
        ref, kept = run.model.state_dict(), saved["best_state"]
        if kept and (set(kept) != set(ref) or any(not isinstance(kept[k], torch.Tensor) or kept[k].shape
                                                  != ref[k].shape or kept[k].dtype != ref[k].dtype for k in ref)):
            raise ValueError("the best epoch's weights are not the model's")
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:  # read, but damaged or edited
        if isinstance(exc, GnnscaleError):
            raise
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{_resumed(checkpoint)} is damaged: its state does not fit the model ({first_line})") \
            from None
    run.history, run.best, run.best_state = saved["history"], saved.get("best"), saved["best_state"]
    run.first = saved["epoch"] + 1
    if on_resume is not None:
        on_resume(run.history)


def _save(run: _Run, checkpoint: str | os.PathLike[str], epoch: int) -> None:
    """The checkpoint after ``epoch`` (and ``model.pt`` beside it), its seconds counted as ``checkpoint_s``; one
    writer per job (the ranks of a distributed job hold the same state). A failed write is one ConfigError."""
    with timed("checkpoint_s", run.spent):
        if not run.engine.is_primary:
            return
        try:
            Path(checkpoint).mkdir(parents=True, exist_ok=True)
            save_model(Path(checkpoint) / "model.pt", run.model, run.config, run.graph, run.best_state,
                       fingerprint=run.plan.prints)
            save_checkpoint(checkpoint, {
                "epoch": epoch, "config": asdict(run.config), "dataset": run.graph.name,
                "num_nodes": run.graph.num_nodes, "fingerprint": run.plan.prints,
                "engine_name": run.plan.engine_cls.name, "model": run.model.state_dict(),
                "optimizer": run.engine.optimizer.state_dict(), "engine": run.engine.state_dict(),
                "history": run.history, "best": run.best, "best_state": run.best_state})
        except OSError as exc:  # the folder went away, the disk is full: one line (on_stop keeps the model)
            raise ConfigError(f"could not write the checkpoint in {checkpoint} ({exc.strerror or exc})") from exc


def _checkpoint_iterations(run: _Run, checkpoint: str | os.PathLike[str] | None, every: int | None) -> None:
    """Checkpoints within an epoch, every ``every`` iterations (``None``: :data:`ITERATION_CHECKPOINTS` for an
    engine that checkpoints mid-epoch, else 0: none), through the engine's ``on_iteration`` hook."""
    if every is None:
        every = ITERATION_CHECKPOINTS if checkpoint is not None and hasattr(run.engine, "on_iteration") else 0
    if not every:
        return
    if not hasattr(run.engine, "on_iteration"):
        raise ConfigError(f"--checkpoint-iterations: the {run.plan.engine_cls.name} engine checkpoints at epoch ends "
                          "only (--checkpoint-every)")
    assert checkpoint is not None  # (_load_and_check refuses iterations without a folder)

    def save_within(epoch: int, done: int) -> None:
        if done % every == 0:
            _save(run, checkpoint, epoch - 1)  # epoch - 1 epochs are whole; the engine's state holds this one's

    run.engine.on_iteration = save_within  # type: ignore[attr-defined]


def _run_epochs(run: _Run, checkpoint: str | os.PathLike[str] | None, every: int,
                on_epoch: Callable[[EpochRecord], None] | None,
                on_stop: Callable[[TrainResult, BaseException], None] | None) -> None:
    """Step 4, run the epochs: train and evaluate each, keep the best, checkpoint, report the record; whatever
    stops the loop (Ctrl-C, SIGTERM, an error) hands ``on_stop`` what was trained before it is raised again."""
    try:
        for epoch in range(run.first, run.config.epochs + 1):
            record = _epoch(run, epoch)
            run.history.append(record)
            if not math.isfinite(record["loss"]):
                if on_epoch is not None:
                    on_epoch(record)  # the metrics keep the epoch that diverged (its loss written as null)
                raise TrainingError(f"the loss is {record['loss']} at epoch {epoch}: training diverged; try a lower "
                                    f"--lr (now {run.config.lr}) or check the features for extreme values")
            _keep_best(run, record)
            if checkpoint is not None and (epoch % every == 0 or epoch == run.config.epochs):
                _save(run, checkpoint, epoch)  # before the epoch is reported: a record seen means it is on disk
            if on_epoch is not None:
                on_epoch(record)
    except BaseException as exc:
        if on_stop is not None:  # Ctrl-C, SIGTERM, a failed write: the caller keeps what was trained
            done = run.history[-1]["epoch"] if run.history else run.first - 1
            on_stop(TrainResult(model=run.model, history=run.history, engine=run.plan.engine_cls.name,
                                rejected=run.plan.rejected, best_state=run.best_state,
                                summary={"interrupted": True, "epochs_done": done,
                                         "best_epoch": run.best["epoch"] if run.best is not None else None}), exc)
        raise


def _epoch(run: _Run, epoch: int) -> EpochRecord:
    """One epoch trained and evaluated: its record (the engine's counters, its time without evaluation and the
    checkpoints written within it, the device peak, the host bound under ``--host-memory``)."""
    reset_peak_device_bytes(run.dev)
    t0, written = time.perf_counter(), run.spent["checkpoint_s"]
    stats = run.engine.train_epoch(epoch)
    if rt.is_accelerator(run.dev):
        rt.synchronize(run.dev)  # the epoch's time includes its device work
    epoch_time = time.perf_counter() - t0
    run.spent["training_s"] += epoch_time - (run.spent["checkpoint_s"] - written)  # less checkpoints within it
    with timed("eval_s", run.spent):
        accs = run.engine.evaluate()
    record: EpochRecord = {
        "epoch": epoch,
        "loss": stats.pop("loss"),
        **accs,
        "epoch_time_s": epoch_time,
        "peak_device_bytes": peak_device_bytes(run.dev),
        **stats,
    }
    if run.plan.base is not None:
        run.warned = _host_bound(record, run.plan.base, run.config.host_memory, run.warned)
    return record


def _keep_best(run: _Run, record: EpochRecord) -> None:
    """The epoch becomes the best when its accuracy on ``run.best_by``'s split beats the best so far (the first
    epoch always); its weights are copied to the CPU."""
    val = record[f"{run.best_by}_acc"]
    if run.best is None or (val is not None and val > run.best["_val"]):
        run.best = {"_val": val, "epoch": record["epoch"], "test_acc": record["test_acc"]}
        run.best_state = {k: v.detach().to("cpu", copy=True) for k, v in run.model.state_dict().items()}


def _report(run: _Run) -> TrainResult:
    """Step 5, save and report: the summary record (best epoch, accuracies, the wall time's parts, the engine's
    detail and report, the config) and the result."""
    best, history, own = run.best, run.history, run.plan.own
    assert best is not None
    total_s = time.perf_counter() - run.start
    parts = {"load_s": run.load_s, "prepare_s": run.ready["prepare_s"], **run.spent}
    wall_s = run.load_s + total_s
    parts["other_s"] = max(0.0, wall_s - sum(parts.values()))  # callbacks, best weights, resumed state, summary
    summary: EpochRecord = {
        "summary": True,
        "engine": run.plan.engine_cls.name,
        "device": str(run.dev),
        "model": run.config.model if own is None else run.model.kind,  # a user's: its kind (``stack``: own layers)
        "model_factory": run.config.model_factory if own is not None and run.given is None else None,
        "dataset": run.graph.name,
        "dataset_spec": run.graph.meta.get("spec", run.graph.name),
        "epochs": run.config.epochs,
        "best_val_acc": best["_val"] if run.best_by == "val" else None,
        "best_by": run.best_by,
        "best_epoch": best["epoch"],
        "test_acc_at_best_val": best["test_acc"],
        "final_test_acc": history[-1]["test_acc"],
        "total_time_s": total_s,
        "timings": {**run.ready, "epoch_s": sum(r["epoch_time_s"] for r in history) / len(history), **parts,
                    "wall_s": wall_s},
        "engine_detail": run.engine.describe(),
        "engine_report": run.engine.report(),
        "config": asdict(run.config),
        "resumed_from_epoch": run.first - 1 if run.plan.saved is not None else None,
        "made_up": run.made_up,
    }
    return TrainResult(model=run.model, history=history, summary=summary, engine=run.plan.engine_cls.name,
                       rejected=run.plan.rejected, best_state=run.best_state)
