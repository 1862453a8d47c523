"""One pass of the offload engine over its chunk schedule: every worker walks its chunks batch by batch, and each
chunk's inputs (topology, source rows, destination rows) are loaded while the chunk before it computes.

A pass is described by a :class:`LayerPass` (what each chunk reads and where its source rows' gradients go); the
:class:`Sweep` runs a function on every worker (:meth:`Sweep.run`) that computes over the
:class:`ChunkStep` s the sweep hands it, in the worker's schedule order::

    def forward_worker(worker, steps):
        for step in steps:                      # the worker's chunks, batch by batch
            y = layer(step.block, step.source_rows())
            worker.io.store(h_next, step.chunk.lo, y)

    sweep.run(LayerPass(src=h), forward_worker)

With an exchange (``--dedup full/reuse``) a batch's newcomer rows are loaded with its first chunk and written into
the transition buffers before it computes, and the gradients of rows leaving the buffers are flushed after its
last chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.engines.core.chunks import Chunk
from gnnscale.engines.core.mover import record_streams
from gnnscale.engines.offload.exchange import AssemblyOnDevice, Exchange, StagedRows
from gnnscale.engines.offload.workers import HostTable, Worker, WorkerGroup, width
from gnnscale.graph.block import Block
from gnnscale.partition.dedup import ExchangePlan

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class LayerPass:
    """What every chunk of a pass reads besides its compute, and where its source rows' gradients go."""

    src: HostTable | None = None
    """The host tensor whose rows the chunks read (a layer's input or projected rows; layer 0's: the features,
    read through their sources): gathered per chunk, or assembled from the exchange's transition buffers."""
    grad: Tensor | None = None
    """The host gradient the chunks' source rows add into (directly, or through the transition buffers)."""
    slices: tuple[HostTable | None, ...] = ()
    """Host tensors whose destination rows ``[lo:hi]`` each chunk reads (``None``: nothing in that place)."""
    blocks: bool = True
    """The chunks need their topology (else they read destination rows only)."""
    transpose: bool = False
    """... with its transpose (they backpropagate through the adjacency)."""
    in_place: bool = False
    """The chunks may read ``src``'s rows where they are (a plain host tensor, no exchange, a mover that reads in
    place): through :meth:`Chunk.in_place <gnnscale.engines.core.chunks.Chunk.in_place>`, whose products sum what the
    gathered rows' would, in the same order. Only for a pass whose compute reads the source rows through products
    of the block alone (a parameter-free linear AGGREGATE or a propagation), and whose gradient to them, if any,
    goes through the block's transpose (:meth:`~gnnscale.nn.base.BlockLayer.aggregate_vjp_add`), not through
    autograd on the table."""

    @property
    def moves_source_rows(self) -> bool:
        return self.src is not None or self.grad is not None


@dataclass(eq=False)
class ChunkStep:
    """One chunk of a worker's pass with its inputs loaded on the worker's device."""

    worker: Worker
    chunk: Chunk
    batch: int
    last_of_batch: bool
    staged: StagedRows | None
    """The batch's newcomer rows (first chunk of a batch, with an exchange)."""
    assembly: AssemblyOnDevice | None
    """Where the chunk's source rows are in the transition buffers (with an exchange)."""
    block_: Block | None
    gathered: Tensor | None
    """``[R, F]`` the chunk's source rows gathered from host memory (a pass with rows, without an exchange); the
    whole host table when :attr:`in_place` is set."""
    slices: tuple[Tensor | None, ...]
    """``[V, *]`` the pass's destination rows (:attr:`LayerPass.slices`), on the device."""
    exchange: Exchange | None
    grad: Tensor | None
    in_place: Block | None = None
    """The chunk's in-edges from the host table's own rows, when the chunk reads its source rows there
    (:attr:`LayerPass.in_place`): its products take ``gathered``, the whole table; :attr:`block` stays the local
    block (the destinations' ids)."""

    @property
    def block(self) -> Block:
        assert self.block_ is not None
        return self.block_

    def dst_ids(self) -> Tensor:
        """Original ids of the chunk's destinations (dropout keys) on the device: from the block when the pass has
        one, else copied from the host block."""
        if self.block_ is not None:
            return self.block_.row_ids(self.chunk.num_dst)
        assert self.chunk.block.src_ids is not None
        return self.worker.io.index(self.chunk.block.src_ids[: self.chunk.num_dst])

    def source_rows(self) -> Tensor:
        """``[R, F]`` rows of the pass's source tensor, in the chunk's row order."""
        if self.gathered is not None:
            return self.gathered
        assert self.exchange is not None and self.assembly is not None
        return self.exchange.assemble(self.worker, self.chunk.k, self.assembly, self.chunk.rows.numel())

    def push(self, grad: Tensor) -> None:
        """Add ``grad`` (``[R, F]``, the source rows' gradients) into the pass's host gradient, through the exchange
        when there is one."""
        if self.exchange is None:
            assert self.grad is not None
            self.worker.io.accumulate(self.grad, self.chunk.rows, grad)
            return
        assert self.assembly is not None
        self.exchange.push(self.worker, self.assembly, grad)

    def record_stream(self, stream: rt.Stream | None) -> None:
        """The loaded tensors on the worker's device are used on ``stream`` (see
        :func:`~gnnscale.engines.core.mover.record_streams`); slots in other workers' buffers are read on those devices'
        own streams."""
        own = [(pos, slots if d == self.worker.index else None) for d, pos, slots in self.assembly or ()]
        record_streams((self.staged, own, self.block_, self.gathered, self.slices), stream)


class Sweep:
    """The chunk schedule over the workers: each worker's chunks in the planner's order, batch by batch (its
    partitions' chunks at one position of the schedule), and the exchange that deduplicates their rows."""

    def __init__(self, group: WorkerGroup, chunks: list[Chunk], schedule: list[list[int]],
                 exchange: ExchangePlan | None):
        self.group, self.chunks = group, chunks
        n = len(schedule[0])
        self.sequence = {w.index: [(batch, schedule[i][batch]) for batch in range(n) for i in w.partitions]
                         for w in group.workers}
        """Each worker's ``(batch, chunk id)`` in order: batch by batch, its partitions in turn."""
        self.exchange = None if exchange is None else Exchange(exchange, group)
        self.pass_widths: list[int] = []
        """Row widths of the passes that read source rows (since the last clear): the row counters' passes."""
        self.after_chunk: Callable[[], None] | None = None
        """Called after each chunk of a worker's pass (``--host-memory``: the spill files' pages leave the
        process)."""

    def run(self, layer_pass: LayerPass, per_worker: Callable[[Worker, Iterator[ChunkStep]], T]) -> list[T]:
        """``per_worker(worker, steps)`` on every worker, ``steps`` its chunks of ``layer_pass``, with the
        exchange's buffers set up around the pass. ``per_worker`` computes each step inside
        ``worker.io.compute()`` (the device's scope), and takes the next step outside it (loads are no compute)."""
        if layer_pass.src is not None:
            self.pass_widths.append(width(layer_pass.src))
        grad = torch.is_grad_enabled()  # thread-local: the workers' threads run as the caller's (no_grad passes)

        def work(worker: Worker) -> T:
            with torch.set_grad_enabled(grad):
                return per_worker(worker, self.steps(worker, layer_pass))

        if self.exchange is None or not layer_pass.moves_source_rows:
            return self.group.run(work)
        self.exchange.begin_pass(layer_pass.src, layer_pass.grad)
        try:
            return self.group.run(work)
        finally:
            self.exchange.end_pass()

    def steps(self, worker: Worker, layer_pass: LayerPass) -> Iterator[ChunkStep]:
        """The worker's chunks of the pass, each loaded (prefetched) before the one before it computes; a batch's
        newcomer rows enter the buffers before its first chunk and its leaving gradients go after its last."""
        exchange = self.exchange if layer_pass.moves_source_rows else None
        load = partial(self._load, worker, layer_pass, exchange)
        staged = None
        for step in worker.io.prefetched(load, len(self.sequence[worker.index])):
            if exchange is not None and step.staged is not None:
                staged = step.staged
                exchange.begin_batch(worker, step.batch, staged)
            yield step
            if self.after_chunk is not None:
                self.after_chunk()
            if exchange is not None and step.last_of_batch:
                assert staged is not None
                exchange.end_batch(worker, step.batch, staged)
        worker.io.barrier()

    def _load(self, worker: Worker, layer_pass: LayerPass, exchange: Exchange | None, position: int) -> ChunkStep:
        """Issue the loads of the worker's ``position``-th chunk (on the copy stream when prefetched)."""
        sequence = self.sequence[worker.index]
        batch, k = sequence[position]
        chunk = self.chunks[k]
        first_of_batch = position == 0 or sequence[position - 1][0] != batch
        last_of_batch = position + 1 == len(sequence) or sequence[position + 1][0] != batch
        staged = exchange.stage(worker, batch) if exchange is not None and first_of_batch else None
        assembly = exchange.assembly(worker, k) if exchange is not None else None
        block = gathered = in_place = None
        if layer_pass.blocks:
            rows_dev = worker.io.gather_ids(chunk.rows)
            block = worker.io.block(chunk, layer_pass.transpose)
            if layer_pass.src is not None and exchange is None:
                src = worker.reads(layer_pass.src)
                if layer_pass.in_place and worker.io.in_place and isinstance(src, Tensor):
                    gathered, in_place = worker.io.rows_in_place(src, chunk.rows), chunk.in_place(src.shape[0])
                else:
                    gathered = worker.io.rows(src, chunk.rows, rows_dev)
                worker.count("rows_h2d", chunk.rows.numel(), width(layer_pass.src))
        slices = tuple(None if t is None else worker.io.slice(worker.reads(t), chunk.lo, chunk.hi)
                       for t in layer_pass.slices)
        return ChunkStep(worker, chunk, batch, last_of_batch, staged, assembly, block, gathered, slices,
                         exchange, layer_pass.grad, in_place)
