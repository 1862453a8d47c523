"""``gnnscale train``: build the config from the flags, load the data, train, print and write the metrics."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from gnnscale import progress
from gnnscale import runtime as rt
from gnnscale.checkpoint import check_checkpoint_args, job_locks
from gnnscale.cli.common import _device_list, _fmt, _MetricsWriter, _num_list
from gnnscale.config import TrainConfig
from gnnscale.distributed.comm import current as current_comm
from gnnscale.distributed.job import launched
from gnnscale.distributed.launch import run_ranks
from gnnscale.engines import requested_mode, resolve_devices
from gnnscale.engines.core.devices import rank_device
from gnnscale.errors import ConfigError
from gnnscale.fsutil import check_output, write_output
from gnnscale.graph.datasets import load_dataset
from gnnscale.partition.plan import PartitionPlan
from gnnscale.plan.rates import rates
from gnnscale.saved_model import save_model
from gnnscale.train import TrainResult, train
from gnnscale.trainable import check_trainable
from gnnscale.units import parse_budget


def _warm_imports() -> None:
    with contextlib.suppress(Exception):
        importlib.import_module("torch._dynamo")


def cmd_train(args: argparse.Namespace) -> int:
    config = _config(args)
    _check_outputs(args)
    status = _start_job(args, config)
    if status is not None:  # this process started the ranks: their exit status
        return status
    device = _device(args, config)
    timings: dict[str, float] = {}
    writer = _MetricsWriter(args.metrics) if args.metrics else None  # holds the file's lock until it is closed
    try:
        with progress.stage("load", timings):
            graph = load_dataset(args.dataset, args.root, seed=args.seed, keep_ids=args.keep_ids)
        check_trainable(graph)
        print(f"dataset {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
              f"{graph.num_features} features, {graph.num_classes} classes")
        result = _run(args, config, device, graph, writer, timings)
        _report(args, config, graph, result, writer)
    finally:
        if writer:
            writer.close()
    comm = current_comm()
    if comm is not None:  # a failed job keeps it: main names the failed rank through it
        comm.close()
    return 0


def _config(args: argparse.Namespace) -> TrainConfig:
    """The run's configuration, read from train's flags."""
    return TrainConfig(
        model=args.model, layers=args.layers, hidden=args.hidden, heads=args.heads, dropout=args.dropout,
        input_dropout=args.input_dropout,
        norm=args.norm, residual=args.residual, jk=args.jk, model_factory=args.model_factory,
        lr=args.lr, weight_decay=args.weight_decay, epochs=args.epochs, seed=args.seed, engine=args.engine,
        mode=args.mode, host_allocator=args.host_allocator,
        memory_budget=None if args.gpu_memory is None else parse_budget(args.gpu_memory),
        host_memory=None if getattr(args, "host_memory", None) is None else parse_budget(args.host_memory),
        partitions=args.partitions, chunks=args.chunks, partition_method=args.partition_method, gather=args.gather,
        plan_dir=args.plan_dir, devices=_device_list(args.devices), dedup=args.dedup, chunker=args.chunker,
        reorganize=args.reorganize, scratch=getattr(args, "scratch", None), batch_size=args.batch_size,
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


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse the checkpoint and model flags before anything is loaded."""
    check_checkpoint_args(args.checkpoint, args.checkpoint_every, args.resume)
    if args.save_model:
        check_output(args.save_model, "--save-model")
    if args.checkpoint_iterations and args.checkpoint is None:
        raise ConfigError("--checkpoint-iterations needs --checkpoint DIR (where to write)")


def _start_job(args: argparse.Namespace, config: TrainConfig) -> int | None:
    """A distributed run outside a job starts its ranks here (their exit status); a rank other than 0 goes quiet.
    ``None``: this process trains."""
    if requested_mode(config) != "distributed":
        return None
    if not launched():
        if args.ranks is None:
            raise ConfigError("--engine distributed runs as a job of ranks: start it with torchrun (torchrun "
                              "--nproc-per-node R -m gnnscale train --engine distributed ...) or give --ranks R "
                              "to start R ranks on this machine")
        rank_device(args.device, args.ranks, 0)  # one GPU per rank: say so before any rank starts
        if args.plan is not None:
            PartitionPlan.load_for_ranks(args.plan, args.ranks)
        with job_locks(metrics=args.metrics, checkpoint=args.checkpoint):  # a bad path fails here, before any
            return run_ranks(args.entry, args.argv, args.ranks)  # rank starts; args.entry: main, run by the ranks
    rank = int(os.environ["RANK"])
    if rank != 0:  # rank 0 reports; the others speak only of their own failures (stderr)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- for the rest of this rank's life
        args.metrics, args.save_model, args.quiet = None, None, True
    return None


def _device(args: argparse.Namespace, config: TrainConfig) -> torch.device:
    """The training device (said when auto finds no CUDA), the progress display, and torch's slow imports begun."""
    device = resolve_devices(config, args.device)
    if args.device == "auto" and not config.devices and device.type == "cpu":
        print("no CUDA device found: training on CPU (--device cpu says so and silences this)")
    progress.enable(not args.quiet and sys.stderr.isatty())
    # torch's optimisers import torch._dynamo (seconds) when the engine is built: import it while the data loads
    threading.Thread(target=_warm_imports, daemon=True, name="gnnscale-imports").start()
    return device


def _run(args: argparse.Namespace, config: TrainConfig, device: torch.device, graph: Any,
         writer: _MetricsWriter | None, timings: dict[str, float]) -> TrainResult:
    """Train, with the progress bar, the per-epoch lines and metrics, and the resume and stop hooks."""
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
                       f"test {_fmt(rec['test_acc'])}  training {rec['epoch_time_s']:.3f}s", file=sys.stdout)

    def on_resume(history: list[dict[str, Any]]) -> None:
        print(f"resuming from {args.checkpoint} after epoch {history[-1]['epoch'] if history else 0}")
        bar.update(len(history))
        for rec in history:  # the metrics file continues the old run's (rewritten from the checkpoint)
            if writer:
                writer.write(rec)

    def on_stop(partial: TrainResult, exc: BaseException) -> None:
        _keep_stopped_model(args, partial, exc, config, graph)

    if args.recalibrate:  # the predicted epoch times (--engine auto's choice) priced with fresh rates
        rates(rt.torch_device(device), recalibrate=True)
    result = train(graph, config, device, on_epoch=on_epoch, on_start=_on_start, timings=timings,
                   checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
                   checkpoint_iterations=args.checkpoint_iterations, resume=args.resume, on_resume=on_resume,
                   on_stop=on_stop)
    bar.close()
    return result


def _on_start(engine: Any, rejected: dict[str, list[str]], ready: dict[str, float]) -> None:
    """The engines rejected and why auto chose, the engine's own lines, and where the time before training went."""
    for name, reasons in rejected.items():
        print(f"engine {name} rejected: {'; '.join(reasons)}")
    if getattr(rejected, "why", ""):  # --engine auto's choice by predicted epoch time
        print(rejected.why)  # type: ignore[attr-defined]
    detail = engine.describe()
    if detail:
        print(detail)
    print(_ready_line(ready, engine.timings), flush=True)


def _report(args: argparse.Namespace, config: TrainConfig, graph: Any, result: TrainResult,
            writer: _MetricsWriter | None) -> None:
    """The summary lines, the summary record of the metrics file, and the saved model."""
    s = result.summary
    factory = f" (--model-factory {s['model_factory']})" if s["model_factory"] else ""
    print(f"engine {result.engine} on {s['device']}, model {s['model']}{factory}, {config.epochs} "
          f"epoch{'s' * (config.epochs != 1)} in {_wall_line(s, args.checkpoint is not None)}")
    caveat = "; made-up labels (random): this accuracy is not a result" if "labels" in s["made_up"] else ""
    if s["best_by"] == "val":
        print(f"test accuracy {_fmt(s['test_acc_at_best_val'])} at best val {_fmt(s['best_val_acc'])} "
              f"(epoch {s['best_epoch']}); final test accuracy {_fmt(s['final_test_acc'])}{caveat}")
    else:
        print(f"no validation vertices: best epoch {s['best_epoch']} by training accuracy, test accuracy "
              f"{_fmt(s['test_acc_at_best_val'])} there; final test accuracy {_fmt(s['final_test_acc'])}{caveat}")
    last = result.history[-1]
    if "predicted_t_s" in last:
        print(f"task forward times, last epoch (summed over devices): T tasks {last['t_forward_s']:.3f}s "
              f"measured vs {last['predicted_t_s']:.3g}s predicted by Eq. 5; P tasks {last['p_forward_s']:.3f}s "
              f"vs {last['predicted_p_s']:.3g}s by Eq. 6 (with recomputation and backward: T "
              f"{last['t_busy_s']:.3f}s, P {last['p_busy_s']:.3f}s)")
    if s.get("engine_report"):
        _print_stage_table(s["engine_report"])
    if writer:
        writer.write(s)
    if args.save_model:
        saved = write_output(args.save_model, lambda p: save_model(p, result.model, config, graph,
                                                                   result.best_state),
                             flag="--save-model", what="model")
        again = f" (predict builds it again with --model-factory {config.model_factory})" if factory else ""
        print(f"saved the epoch-{s['best_epoch']} model to {saved}{again}")


def _ready_line(ready: dict[str, float], engine_steps: dict[str, float]) -> str:
    """Where the time before the first epoch went: the load, then train()'s preparation (checks, engine choice,
    model, the engine's set-up), with the set-up and the engine's own steps (partition, plan, ...) inside it: made
    while the engine was chosen (the offload planner's chunks) or while it was set up."""
    steps = ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in engine_steps.items())
    within = f" (engine set-up {ready['setup_s']:.1f}s{'; ' + steps if steps else ''})"
    return (f"ready to train in {ready['ready_s']:.1f}s: load {ready.get('load_s', 0.0):.1f}s, preparation "
            f"{ready['prepare_s']:.1f}s{within}")


def _wall_line(summary: dict[str, Any], checkpoints: bool) -> str:
    """The run's wall time and its parts, which sum to it (docs/metrics.md, the summary's timings)."""
    t = summary["timings"]
    done = summary["epochs"] - (summary["resumed_from_epoch"] or 0)
    parts = [f"load {t['load_s']:.1f}s", f"preparation {t['prepare_s']:.1f}s",
             f"training {t['training_s']:.1f}s ({done} epoch{'s' * (done != 1)})", f"evaluation {t['eval_s']:.1f}s"]
    if checkpoints:
        parts.append(f"checkpoints {t['checkpoint_s']:.1f}s")
    parts.append(f"other {t['other_s']:.1f}s")
    return f"{t['wall_s']:.1f}s wall: {', '.join(parts)}"


def interrupted_model_path(save_model_path: str | None, checkpoint: str | None) -> Path | None:
    """Where an interrupted run leaves its model: beside ``--save-model PATH`` as ``<stem>.interrupted<suffix>``
    (a finished run's PATH is never overwritten by a partial model), else ``--checkpoint DIR/model.interrupted.pt``;
    ``None`` when the run was asked to save neither."""
    if save_model_path:
        p = Path(save_model_path)
        return p.with_name(f"{p.stem}.interrupted{p.suffix or '.pt'}")
    if checkpoint:
        return Path(checkpoint) / "model.interrupted.pt"
    return None


def _keep_stopped_model(args: argparse.Namespace, partial: TrainResult, exc: BaseException, config: TrainConfig,
                        graph: Any) -> None:
    """A run stopped by Ctrl-C or SIGTERM, or by a checkpoint it could not write, saves its model as it stands
    (the best epoch's weights so far, or the current ones before the first epoch ends), marked ``interrupted``,
    and says where: on stderr for a signal, in the error line for a failed write. Other errors (a diverged loss,
    bad input) save nothing."""
    failed_write = isinstance(exc.__cause__, OSError) and isinstance(exc, ConfigError)
    target = interrupted_model_path(args.save_model, args.checkpoint)
    if target is None or not (failed_write or not isinstance(exc, Exception)):
        return
    s = partial.summary
    meta = {"interrupted": True, "epochs_done": s["epochs_done"], "epoch": s["best_epoch"]}
    blocked = (signal.SIGINT, signal.SIGTERM)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)  # a second Ctrl-C does not stop the save half-way
    try:
        try:
            saved = write_output(target, lambda p: save_model(p, partial.model, config, graph,
                                                              partial.best_state or None, **meta),
                                 flag="--save-model" if args.save_model else "--checkpoint", what="model")
        except ConfigError as fallback:  # its fallback copy: the line names where it is
            saved = None
            note = str(fallback)
        else:
            note = f"the model is at {saved}"
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    best = f"epoch {s['best_epoch']}'s weights" if s["best_epoch"] else "the weights as they stood"
    if failed_write:
        raise ConfigError(f"{exc}; {note} ({best}, after {s['epochs_done']} epochs)") from exc
    where = f"saved the model as it stood ({best}, {s['epochs_done']} epochs done) to {saved}" if saved else note
    print(f"interrupted after epoch {s['epochs_done']}: {where}", file=sys.stderr, flush=True)


def _print_stage_table(report: dict[str, Any]) -> None:
    """The hybrid engine's predicted and measured seconds per iteration, stage by stage (last epoch)."""
    pred, meas = report["predicted"], report["measured"]
    print(f"per-stage seconds per iteration, last epoch (split {', '.join(f'{x:.3f}' for x in report['split'])}, "
          f"threads {','.join(map(str, report['threads']))}):")
    print(f"  {'stage':<8}{'predicted':>11}{'measured':>11}")
    for k in ("SC", "SA", "Load", "Tran", "TC", "TA", "sync"):
        print(f"  {k:<8}{pred.get(k, 0.0):>11.4f}{meas.get(k, 0.0):>11.4f}")
    print(f"  {'epoch':<8}{pred['epoch_s']:>11.3f}{meas['epoch_s']:>11.3f}")
