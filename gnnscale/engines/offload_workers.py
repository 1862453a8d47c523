"""The offload engine's workers: one per device, each with its partitions, a model replica and its own row mover;
a pass runs on every worker at once, one thread each when there are several."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.engines.mover import RowMover
from gnnscale.nn.model import GNN
from gnnscale.plan.memory import LiveBytesCounter
from gnnscale.store import FeatureSource, ReadStats

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Features:
    """The input features (layer 0's rows), as one feature source per worker: each reads the one table in host
    memory (pinned where the device needs it) onto its worker's device (:meth:`RowMover.source`), so that every
    read of a feature row -- gathered per chunk, staged into the transition buffers, or a chunk's destination
    range -- goes through the feature-source protocol and is counted by its read counters
    (:meth:`read_stats`). Later layers' inputs, their gradients, projections and cached aggregations stay plain
    host tensors: the engine writes them itself during the epoch (its own scratch, not features)."""

    sources: tuple[FeatureSource, ...]
    """Worker ``w``'s source is ``sources[w]``."""

    def on(self, worker: Worker) -> FeatureSource:
        return self.sources[worker.index]

    @property
    def num_rows(self) -> int:
        return self.sources[0].num_rows

    @property
    def width(self) -> int:
        return self.sources[0].dim

    def read_stats(self) -> ReadStats:
        """Rows read by every worker since the last reset, per tier."""
        total = ReadStats()
        for s in self.sources:
            total = total + s.read_stats()
        return total

    def reset_stats(self) -> ReadStats:
        total = self.read_stats()
        for s in self.sources:
            s.reset_stats()
        return total


HostTable = Tensor | Features
"""What a pass reads rows of: a host tensor of the engine's, or the features."""


def width(t: HostTable) -> int:
    """Values per row of ``t``."""
    return t.width if isinstance(t, Features) else int(t.shape[1])


@dataclass(eq=False)
class Worker:
    """One device's share of an epoch: its partitions, a model replica and its own mover (streams, counters)."""

    index: int
    device: rt.Device
    model: GNN
    io: RowMover
    partitions: list[int]
    rows: dict[str, int] = field(default_factory=dict)
    """Row counters of this epoch (``rows_h2d``, ``rows_reused``, ``rows_d2d`` and their ``_bytes``)."""
    counter: LiveBytesCounter | None = None
    """This worker's device bytes (several CPU devices: each worker thread runs its share under its own)."""

    def reads(self, t: HostTable) -> Tensor | FeatureSource:
        """What this worker's mover reads ``t``'s rows from: the tensor, or this worker's feature source."""
        return t.on(self) if isinstance(t, Features) else t

    def count(self, name: str, rows: int, width: int) -> None:
        """Count ``rows`` float32 rows of ``width`` under ``name`` (and their bytes under ``name + "_bytes"``)."""
        self.rows[name] = self.rows.get(name, 0) + rows
        self.rows[name + "_bytes"] = self.rows.get(name + "_bytes", 0) + rows * width * 4


class WorkerGroup:
    """The workers of an engine and the threads that run them.

    :attr:`barrier` (several workers) is where the workers meet between batches (the exchange's transition
    buffers); a worker that fails breaks it, so that the others stop instead of waiting for it.
    """

    def __init__(self, workers: list[Worker]):
        self.workers = workers
        many = len(workers) > 1
        self.pool = ThreadPoolExecutor(len(workers), thread_name_prefix="gnnscale-worker") if many else None
        self.barrier = threading.Barrier(len(workers)) if many else None

    def run(self, fn: Callable[[Worker], T]) -> list[T]:
        """``fn`` on every worker: inline for one, one thread each otherwise (a failure stops the others)."""
        if self.pool is None:
            return [fn(self.workers[0])]
        futures = [self.pool.submit(self._guarded, fn, w) for w in self.workers]
        errors = [f.exception() for f in futures]
        if self.barrier is not None and self.barrier.broken:
            self.barrier.reset()
        real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
        if real or any(errors):
            raise (real or [e for e in errors if e is not None])[0]
        return [f.result() for f in futures]

    def _guarded(self, fn: Callable[[Worker], T], w: Worker) -> T:
        try:
            if w.counter is not None:
                with w.counter:  # dispatch modes are per thread: this worker's allocations only
                    return fn(w)
            return fn(w)
        except BaseException:
            if self.barrier is not None:
                self.barrier.abort()
            raise
