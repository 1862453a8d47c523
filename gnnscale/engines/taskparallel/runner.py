"""A device of the task-parallel engine: the thread that runs the operations submitted to it, its row mover, and
what it keeps during an epoch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.engines.core.chunks import Chunk
from gnnscale.engines.core.mover import RowMover
from gnnscale.graph.block import Block
from gnnscale.nn.decoupled import DecoupledGNN
from gnnscale.plan.memory import LiveBytesCounter, replica_baseline

T = TypeVar("T")

OPS = ("TF", "TR", "TB", "PF", "PB", "TS", "TG")
"""Operation kinds timed per device: T forward, T recomputation, T backward, P forward, P backward, and BatchNorm's
passes over the T tasks: statistics, gradient sums (:mod:`~gnnscale.engines.taskparallel.norm`)."""


class Runner:
    """One device's thread: runs submitted operations in order, times them by kind and (on the CPU) counts the
    bytes they allocate. On an accelerator (a GPU, the sim device) each runner issues its work on its own stream
    and an operation's future resolves once its work is done on the device (one host sync per operation), so a
    consumer on another stream (or device) reads finished data."""

    def __init__(self, index: int, device: rt.Device, model: DecoupledGNN):
        self.index, self.device, self.model = index, device, model
        self.place = rt.torch_device(device)
        """Where this device's tensors are (host memory for a sim device): what ``Tensor.to`` and factories take."""
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"gnnscale-task{index}")
        self.counter = None if rt.is_accelerator(device) else LiveBytesCounter()
        self.io = RowMover(device, resident=True, own_stream=True)
        """Rows, blocks and hand-offs into this device, bytes counted by kind (``row``: features from host memory,
        ``topology``, ``t2p``, ``p2p``, ``p2t``, ``t2t``); chunk blocks are moved here once and kept (topology is
        read every epoch)."""
        self.uses_host_blocks = not rt.is_accelerator(device) and index == 0
        """The host's blocks serve the first CPU device as they are (and count as its memory)."""
        self.shared_bytes = 0
        """Bytes of host blocks this device uses in place: counted as its memory, not copied."""
        self.busy = dict.fromkeys(OPS, 0.0)
        self.cache: dict[tuple[int, int], Tensor] = {}
        """``(layer, chunk) -> H^layer`` rows of the chunk received this epoch (cross-subgraph reuse)."""
        self.epoch_blocks: dict[int, Block] = {}
        """This epoch's blocks (``skip``: with the later subgraphs' edges dropped)."""
        self.alpha: dict[int, Tensor] = {}
        """dgat: attention weights of the chunks this device propagates."""
        self.saved: dict[tuple[int, int], Tensor] = {}
        """T stage inputs of the recomputation, kept between re-forward and backward."""

    def submit(self, kind: str, fn: Callable[[], T], deps: Iterable[Future[Any]] = ()) -> Future[T]:
        """Run ``fn`` on this device's thread once ``deps`` are done (after the operations submitted before it)."""
        return self.pool.submit(self._run, kind, fn, list(deps))

    def _run(self, kind: str, fn: Callable[[], T], deps: list[Future[Any]]) -> T:
        for d in deps:
            d.result()
        t0 = time.perf_counter()
        try:
            if self.counter is None:
                return self.io.run(fn)  # this thread waits for the device; the other devices' threads go on
            with self.counter:
                return self.io.run(fn)
        finally:
            self.busy[kind] += time.perf_counter() - t0

    def receive(self, t: Tensor, sender: Runner, kind: str) -> Tensor:
        """``t``, made on ``sender``'s device, on this one (the same tensor from this runner: zero bytes)."""
        return self.io.receive(t, sender.io, kind)

    def block(self, chunk: Chunk) -> Block:
        """The chunk's whole block (with its transpose) on this device: moved once and kept, or (the first CPU
        device) the host's block used in place and counted as this device's memory."""
        assert self.io.resident is not None
        if self.uses_host_blocks and chunk.k not in self.io.resident:
            self.io.resident[chunk.k] = chunk.block
            self.shared_bytes += chunk.block.nbytes()
            if self.counter is not None:
                self.counter.baseline += chunk.block.nbytes()
                self.counter.peak = max(self.counter.peak, self.counter.baseline + self.counter.current)
        return self.io.block(chunk, transpose=True)

    def start_epoch(self) -> None:
        """A new window of the device's peak: the counter's baseline is the replica and the blocks used in place."""
        if self.counter is not None:
            self.counter.baseline = replica_baseline(self.model, self.index) + self.shared_bytes
            self.counter.reset_peak()
        else:
            self.io.reset_device_peak()

    def peak(self) -> int | None:
        """The device's peak bytes since :meth:`start_epoch` (``None``: not measured on this device)."""
        return self.counter.peak if self.counter is not None else self.io.device_peak()

    def clear_epoch(self) -> None:
        self.cache.clear()
        self.epoch_blocks.clear()
        self.alpha.clear()
        self.saved.clear()
