"""The offload engine's transition buffers (HongTu Algorithms 2-3 and §6): each batch's source rows loaded to the
devices once, chunks' rows assembled from them, source-row gradients gathered in the same slots.

The plan (which rows each worker loads per batch, into which slots, which leave, how each chunk assembles its
rows) is :class:`~gnnscale.partition.dedup.ExchangePlan`; this module carries it out, one pass at a time.

A worker reads another worker's buffer on that device's current stream (the default stream, which both workers'
threads share), after the group's barrier: no stream wait is needed between them.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.engines.offload.workers import HostTable, Worker, WorkerGroup, width
from gnnscale.partition.dedup import ExchangePlan

AssemblyOnDevice = list[tuple[int, Tensor | None, Tensor]]
"""A chunk's assembly map on its worker's device: per source worker, the positions in the chunk's rows (``None``:
all, in order) and the slots in that worker's buffer (on that worker's device)."""


class StagedRows(NamedTuple):
    """What one worker loads for a batch before its first chunk (prefetched with that chunk)."""

    rows: Tensor | None
    """``[n, F]`` the batch's newcomer rows on the device (a pass that reads rows)."""
    slots: Tensor | None
    """``[n]`` their slots in the worker's buffer."""
    leaving: Tensor | None
    """The slots whose gradients leave after the batch (a pass that adds gradients)."""


class Exchange:
    """The transition buffers of one pass over every worker.

    ``buf[w]`` holds worker ``w``'s share of the current batch's rows (forward), ``gbuf[w]`` their accumulated
    gradients (backward). With several workers, batches start and end at the group's barrier: a worker's newcomers
    are written, and its leaving gradients flushed, only when no other worker reads or adds to its buffer.
    """

    def __init__(self, plan: ExchangePlan, group: WorkerGroup):
        self.plan, self.workers = plan, group.workers
        self.barrier = group.barrier
        self.locks = [threading.Lock() for _ in self.workers]
        self.buf: list[Tensor | None] = [None] * len(self.workers)
        self.gbuf: list[Tensor | None] = [None] * len(self.workers)
        self.src: HostTable | None = None
        self.grad: Tensor | None = None

    def begin_pass(self, src: HostTable | None, grad: Tensor | None) -> None:
        """Allocate buffers for gathering rows of host ``src`` (the features: through each worker's source) and/or
        accumulating gradients into host ``grad``."""
        self.src, self.grad = src, grad
        for w in self.workers:
            cap = self.plan.capacity[w.index]
            self.buf[w.index] = None if src is None else rt.empty((cap, width(src)), device=w.device)
            self.gbuf[w.index] = None if grad is None else rt.zeros((cap, grad.shape[1]), device=w.device)

    def end_pass(self) -> None:
        self.buf = [None] * len(self.workers)
        self.gbuf = [None] * len(self.workers)
        self.src = self.grad = None

    def stage(self, w: Worker, batch: int) -> StagedRows:
        """The batch's newcomer rows of worker ``w`` loaded to its device, their slots, and the slots whose
        gradients leave after the batch."""
        mv = self.plan.moves[w.index][batch]
        rows = slots = leaving = None
        if self.src is not None:
            rows = w.io.rows(w.reads(self.src), mv.new_rows, w.io.gather_ids(mv.new_rows))
            slots = w.io.index(mv.new_slots)
        if self.grad is not None:
            leaving = w.io.index(mv.leave_slots)
        return StagedRows(rows, slots, leaving)

    def assembly(self, w: Worker, k: int) -> AssemblyOnDevice:
        """Chunk ``k``'s assembly map, positions on ``w``'s device and slots on each source worker's."""
        return [(d, None if pos is None else w.io.index(pos), w.io.index(slots, self.workers[d].device))
                for d, pos, slots in self.plan.assembly[k].parts]

    def begin_batch(self, w: Worker, batch: int, staged: StagedRows) -> None:
        """Write the newcomers into their slots; rows kept from the previous batch stay where they are."""
        buf = self.buf[w.index]
        if buf is not None and staged.rows is not None and staged.slots is not None:
            with w.io.compute():
                buf.index_copy_(0, staged.slots, staged.rows)
            mv = self.plan.moves[w.index][batch]
            w.count("rows_h2d", mv.new_rows.numel(), buf.shape[1])
            w.count("rows_reused", mv.kept, buf.shape[1])
        if self.barrier is not None:
            self.barrier.wait()

    def assemble(self, w: Worker, k: int, asm: AssemblyOnDevice, num_rows: int) -> Tensor:
        """Chunk ``k``'s rows gathered from the buffers (pulled from other workers' devices, Algorithm 2)."""
        remote = self.plan.assembly[k].remote_rows
        parts = [(d, pos, self.buf[d].index_select(0, slots)) for d, pos, slots in asm]  # type: ignore[union-attr]
        width = parts[0][2].shape[1]
        w.count("rows_d2d", remote, width)
        if len(parts) == 1 and parts[0][1] is None:
            return rt.to_device(parts[0][2], w.device)
        out = rt.empty((num_rows, width), device=w.device)
        for _, pos, rows in parts:
            assert pos is not None
            out.index_copy_(0, pos, rt.to_device(rows, w.device))
        return out

    def push(self, w: Worker, asm: AssemblyOnDevice, grad: Tensor) -> None:
        """Add a chunk's source-row gradients into the owners' gradient buffers (Algorithm 3, lines 1-3)."""
        for d, pos, slots in asm:
            g = grad if pos is None else grad.index_select(0, pos)
            gbuf = self.gbuf[d]
            assert gbuf is not None
            with self.locks[d]:
                gbuf.index_add_(0, slots, rt.to_device(g, self.workers[d].device))

    def end_batch(self, w: Worker, batch: int, staged: StagedRows) -> None:
        """Flush the gradients of rows whose slots the next batch replaces to host memory (Algorithm 3, lines
        5-7), compacted on the device; the kept rows' gradients stay."""
        if self.barrier is not None:
            self.barrier.wait()
        gbuf, leaving = self.gbuf[w.index], staged.leaving
        if gbuf is None or leaving is None or leaving.numel() == 0:
            return
        assert self.grad is not None
        with w.io.compute():
            w.io.accumulate(self.grad, self.plan.moves[w.index][batch].leave_rows, gbuf.index_select(0, leaving))
            gbuf.index_fill_(0, leaving, 0.0)
