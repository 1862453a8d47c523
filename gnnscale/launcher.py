"""``gnnscale.launch(dataset, config, ranks=R)``: a distributed run from Python. R ranks on this machine, started by
the launcher ``gnnscale train --ranks R`` uses (:func:`gnnscale.distributed.launch.run_ranks`: torch's elastic
agent, loopback only); rank 0's :class:`TrainResult` comes back to the caller.

Each rank loads the data itself, as a rank of the command does: ``dataset`` is a spec or a path every rank can
read (what ``load_dataset`` takes), or a :class:`Graph` in memory, which is written once to a temporary converted
directory (:func:`gnnscale.graph.io.save`) that the ranks memory-map (each keeps its own part of the features),
and removed after the run. Rank 0 writes its result (epoch records, summary, weights) into a private temporary
folder, from which this process reads it back (weights only: no pickle crosses).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gnnscale import errors
from gnnscale.checkpoint import job_locks
from gnnscale.config import TrainConfig
from gnnscale.distributed.comm import current as current_comm
from gnnscale.distributed.job import PEER_FAILED, launched
from gnnscale.distributed.launch import run_ranks
from gnnscale.engines import requested_mode
from gnnscale.engines.core.devices import rank_device
from gnnscale.errors import ConfigError, GnnscaleError, RankFailure
from gnnscale.graph import io
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.factory import build_from_factory
from gnnscale.partition.plan import PartitionPlan
from gnnscale.train import TrainResult, train
from gnnscale.trainable import as_graph, check_trainable

_RESULT = "result.pt"
_OUT = "GNNSCALE_LAUNCH_OUT"
"""Set in the ranks of a :func:`launch` job: its result folder (where a rank that calls ``launch`` again, as it
imports an unguarded script, leaves its error for the caller)."""
GUARD = ("put the gnnscale.launch call (and the work before it) under `if __name__ == \"__main__\":` in the script: "
         "the ranks are new Python processes that import the script, and run all of it that is not guarded")


def _refuse_in_a_rank() -> None:
    """``launch`` called in a rank: refused in one line. A rank that re-imports the caller's script (the
    ``spawn`` start method runs the main module again, as ``__mp_main__``) met an unguarded call: it leaves the
    error for the job's caller and ends at once (a traceback there would name neither the cause nor the fix)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # importing the caller's main module
        # (torch's variables, RANK too, are set only after: the file is named by the process id)
        message = f"gnnscale.launch was called again in a rank as it imported the script; {GUARD}"
        out = os.environ.get(_OUT)
        if out and Path(out).is_dir():
            _atomic_write(Path(out) / f"error-{os.getpid()}.json", json.dumps(["ConfigError", message]).encode())
        else:
            print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(2)
    rank = os.environ.get("RANK", "?")
    raise ConfigError(f"gnnscale.launch was called in rank {rank} of a launched job (torchrun or a launch): it starts "
                      "the ranks itself; run the script with python, and train in a rank with gnnscale.train")


@dataclass(frozen=True)
class RankJob:
    """What every rank of a :func:`launch` job runs (sent to the ranks; they import :func:`run_rank` by name)."""

    dataset: str
    root: str | None
    config: TrainConfig
    device: str
    out: str
    """The folder rank 0 writes its result into (and every rank its bad-input error)."""
    checkpoint: str | None = None
    checkpoint_every: int = 1
    checkpoint_iterations: int | None = None
    resume: bool = False


def launch(
    dataset: str | os.PathLike[str] | Graph,
    config: TrainConfig,
    ranks: int,
    device: str = "auto",
    *,
    root: str | os.PathLike[str] | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 1,
    checkpoint_iterations: int | None = None,
    resume: bool = False,
) -> TrainResult:
    """Train ``config`` with the distributed engine as ``ranks`` ranks on this machine; rank 0's result.

    The same job as ``gnnscale train --dataset DATASET --engine distributed --ranks R`` (same launcher, same
    losses), from Python. Call it under ``if __name__ == "__main__":`` in a script: the ranks are new Python
    processes (spawned), which import the script's main module; an unguarded call, met again by the ranks as
    they import it, is refused with one :class:`ConfigError` saying so (the work above it has run in each rank).

    Args:
        dataset: a dataset spec or path (``load_dataset``'s, read by every rank with ``root`` and ``config.seed``),
            or a :class:`Graph` (or PyG ``Data``), saved to a temporary converted directory for the ranks.
        config: ``engine`` ``distributed`` or ``auto``; ``config.ranks`` is set to ``ranks``.
        ranks: processes to start (gloo ranks on CPU; with ``device="cuda"`` one GPU each).
        device: each rank's: ``auto``, ``cpu`` or ``cuda`` (rank ``r`` takes ``cuda:r``).
        checkpoint, checkpoint_every, checkpoint_iterations, resume: as :func:`gnnscale.train`'s (rank 0 writes).

    Returns:
        Rank 0's :class:`TrainResult` (the ranks hold the same model): the model with the last epoch's weights,
        the epoch records (counters summed over ranks) and the summary; ``rejected`` is empty.

    Raises:
        GnnscaleError: bad input, found here or by the ranks (rank 0's error, as the command prints it).
        RankFailure: a rank died or failed; the message is the launcher's line naming it.
    """
    if launched() or getattr(multiprocessing.current_process(), "_inheriting", False):
        _refuse_in_a_rank()
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be a number of processes >= 1, got {ranks!r}")
    config = replace(config, ranks=ranks)
    if requested_mode(config) != "distributed":
        raise ConfigError(f"launch runs the distributed engine (engine='distributed' or 'auto'), not {config.engine}:"
                          " call gnnscale.train for the others")
    rank_device(device, ranks, 0)  # one GPU per rank: said before any rank starts
    if config.plan is not None:
        PartitionPlan.load_for_ranks(config.plan, ranks)
    with tempfile.TemporaryDirectory(prefix="gnnscale-launch-") as tmp:
        if isinstance(dataset, (str, os.PathLike)):
            spec = os.fspath(dataset)
        else:
            graph = as_graph(dataset)
            check_trainable(graph)
            record = {**graph.meta, "spec": graph.meta.get("spec", graph.name), "transient": True}  # not a convert
            spec = str(io.save(replace(graph, meta=record), Path(tmp) / "graph"))
        job = RankJob(spec, None if root is None else os.fspath(root), config, str(device), tmp,
                      None if checkpoint is None else os.fspath(checkpoint), checkpoint_every, checkpoint_iterations,
                      resume)
        said: list[str] = []
        before = os.environ.get(_OUT)
        os.environ[_OUT] = tmp  # the ranks inherit it
        try:
            with job_locks(checkpoint=checkpoint):
                code = run_ranks(run_rank, job, ranks, say=said.append)
        finally:
            if before is None:
                os.environ.pop(_OUT, None)
            else:
                os.environ[_OUT] = before
        if code == 0:
            return _read_result(Path(tmp) / _RESULT, config)
        if code == 130:
            raise KeyboardInterrupt
        if code > 128:
            raise SystemExit(code)  # the agent was told to end (SIGTERM): so does this process
        error = _first_error(Path(tmp))
        if error is not None:
            kind, message = error
            cls = getattr(errors, kind, GnnscaleError)
            raise (cls if isinstance(cls, type) and issubclass(cls, GnnscaleError) else GnnscaleError)(message)
        raise RankFailure(" ".join(line.removeprefix("error: ") for line in said) or f"the job of {ranks} ranks "
                          f"failed (exit status {code})")


def run_rank(job: RankJob) -> int:
    """One rank of a :func:`launch` job: load the data, train, and on rank 0 write the result; the exit status
    (the CLI's: 2 bad input, :data:`PEER_FAILED` when a peer failed)."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        graph = load_dataset(job.dataset, job.root, seed=job.config.seed)
        result = train(graph, job.config, job.device, checkpoint=job.checkpoint,
                       checkpoint_every=job.checkpoint_every, checkpoint_iterations=job.checkpoint_iterations,
                       resume=job.resume)
    except GnnscaleError as exc:
        message = " ".join(str(exc).split())
        comm = current_comm()
        if comm is not None:  # where its peers look for it when it is gone
            comm.record_error(message)
        _atomic_write(Path(job.out) / f"error-{rank}.json", json.dumps([type(exc).__name__, message]).encode())
        return 2
    except RankFailure as exc:
        print(f"error: {exc}", flush=True, file=sys.stderr)
        return PEER_FAILED
    if rank == 0:
        records = {"history": result.history, "summary": result.summary, "engine": result.engine,
                   "num_features": graph.num_features, "num_classes": graph.num_classes}
        path = Path(job.out) / _RESULT
        torch.save({"records": json.dumps(records), "model": result.model.state_dict(),
                    "best_state": result.best_state}, path.with_suffix(".part"))
        os.replace(path.with_suffix(".part"), path)
    comm = current_comm()
    if comm is not None:
        comm.close()
    return 0


def _read_result(path: Path, config: TrainConfig) -> TrainResult:
    saved = torch.load(path, weights_only=True)
    records = json.loads(saved["records"])
    if config.model_factory is not None:  # the ranks trained the factory's model: rebuilt here, then its weights
        model = build_from_factory(config.model_factory, records["num_features"], records["num_classes"],
                                   config.seed)
    else:
        model = build_model(config.model, records["num_features"], config.hidden, records["num_classes"],
                            **config.model_kwargs())
    model.load_state_dict(saved["model"])
    return TrainResult(model=model, history=records["history"], summary=records["summary"],
                       engine=records["engine"], best_state=saved["best_state"])


def _first_error(folder: Path) -> tuple[str, str] | None:
    """The bad-input error of the lowest rank that wrote one (rank 0's, when every rank found it)."""
    found = sorted(folder.glob("error-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if not found:
        return None
    kind, message = json.loads(found[0].read_text())
    return str(kind), str(message)


def _atomic_write(path: Path, data: bytes) -> None:
    part = path.with_suffix(".part")
    part.write_bytes(data)
    os.replace(part, path)

