"""The offload engine's workers: one per device, each with its partitions, a model replica and its own row mover;
a pass runs on every worker at once, one thread each when there are several."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from gnnscale import runtime as rt
from gnnscale.engines.mover import RowMover
from gnnscale.nn.model import GNN
from gnnscale.plan.memory import LiveBytesCounter

T = TypeVar("T")


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
