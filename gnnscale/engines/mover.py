"""The row mover of the chunked engines (offload, task-parallel): one device's traffic, counted by kind.

A :class:`RowMover` belongs to one device and is driven by that device's thread. It moves

* host -> device: vertex rows gathered by id (:meth:`~RowMover.rows`), contiguous row ranges
  (:meth:`~RowMover.slice`), small index tensors (:meth:`~RowMover.index`) and chunk blocks, once when they stay
  resident (:meth:`~RowMover.block`); loads can be issued ahead on a copy stream (:meth:`~RowMover.prefetched`);
* device -> host: row ranges stored (:meth:`~RowMover.store`) or added into host rows (:meth:`~RowMover.accumulate`,
  on a worker thread on CUDA), all landed at :meth:`~RowMover.barrier`;
* device -> device: a tensor another device's mover produced (:meth:`~RowMover.receive`): nothing moves, and no
  byte is counted, when the sender is this mover.

Every byte is counted in :attr:`RowMover.moved` under the kind the caller names (the engines' metric names).
On CUDA the copies are asynchronous (pinned host memory, a copy stream, events); on CPU the same calls are
synchronous and every copy is still made (a new tensor, so that a device's byte counter sees it) and counted.
This module is where the chunked engines name ``torch.cuda``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch
from torch import Tensor

from gnnscale.engines.chunks import Chunk
from gnnscale.graph.block import Block
from gnnscale.store import gather_rows, scatter_add_rows

T = TypeVar("T")


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def record_streams(item: object, stream: Any) -> None:
    """Mark every tensor of ``item`` (a tensor, a block, anything with ``record_stream``, or a tuple/list of them)
    as used on ``stream``: made on another stream, the caching allocator then keeps its memory until ``stream``'s
    work on it is done."""
    if isinstance(item, tuple | list):
        for x in item:
            record_streams(x, stream)
    elif item is not None and hasattr(item, "record_stream"):
        item.record_stream(stream)


class RowMover:
    """Host <-> device and device <-> device traffic of one device, with byte counters by kind.

    Args:
        device: the device rows go to.
        gather: how rows are gathered onto a GPU: ``"index_select"`` (a CPU gather into pinned staging and a copy)
            or ``"uva"`` (a kernel reading pinned host memory, which needs the row ids on the device).
        host_lock: taken around additions into host memory that other devices' movers add into too.
        resident: keep chunk blocks on the device after their first move (else each pass moves them again).
        own_stream: run the device's work on a stream of its own (:meth:`run`; the task-parallel runners).
    """

    def __init__(self, device: torch.device, *, gather: str = "index_select", host_lock: threading.Lock | None = None,
                 resident: bool = False, own_stream: bool = False):
        self.device, self.gather, self.host_lock = device, gather, host_lock
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        """The copy stream prefetched loads are issued on (CUDA)."""
        self.work_stream = torch.cuda.Stream(device) if self.cuda and own_stream else None
        """The stream :meth:`run` issues the device's work on (CUDA, ``own_stream``)."""
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnnscale-accumulate") if self.cuda else None
        self.pending: list[Future[None]] = []
        self.moved: dict[str, int] = {}
        """Bytes moved by kind, since :meth:`reset_counters` (a kind appears once something was counted)."""
        self.resident: dict[int, Block] | None = {} if resident else None
        """Chunk blocks kept on the device after their first use, by chunk id (``None``: topology is resent every
        pass)."""

    def count(self, kind: str, n: int) -> None:
        self.moved[kind] = self.moved.get(kind, 0) + n

    def reset_counters(self) -> None:
        self.moved = {}

    # -------------------------------------------------------------------------------------------- host -> device
    def rows(self, host: Tensor, rows: Tensor, rows_dev: Tensor | None = None, kind: str = "row") -> Tensor:
        """``host[rows]`` on the device: ``[R, F]`` (``rows_dev``: the same ids on the device, for the UVA gather,
        see :meth:`gather_ids`), counted as ``kind``."""
        R, F = rows.numel(), host.shape[1]
        self.count(kind, R * F * host.element_size())
        if not self.cuda:
            return host.index_select(0, rows)  # a new tensor, like the device copy it stands for
        out = torch.empty(R, F, dtype=host.dtype, device=self.device)
        if self.gather == "uva":
            assert rows_dev is not None
            return gather_rows(host, rows_dev, out, method="uva")
        staging = torch.empty(R, F, dtype=host.dtype, pin_memory=True)  # caching host allocator: event-guarded
        return gather_rows(host, rows, out, method="index_select", staging=staging)

    def gather_ids(self, rows: Tensor) -> Tensor | None:
        """``rows`` on the device when the UVA gather reads them there (counted as index bytes), else ``None``."""
        return self.index(rows) if self.cuda and self.gather == "uva" else None

    def index(self, t: Tensor, device: torch.device | None = None, kind: str = "index") -> Tensor:
        """A small host tensor (pinned on CUDA) on ``device`` (default: this mover's), counted as ``kind``. On CPU
        it is used in place (counted all the same, so tests see the traffic)."""
        device = device or self.device
        self.count(kind, nbytes(t))
        if device.type == "cpu":
            return t
        return t.to(device, non_blocking=True)

    def slice(self, host: Tensor, lo: int, hi: int) -> Tensor:
        """``host[lo:hi]`` on the device (a contiguous bulk copy), counted as row bytes."""
        part = host[lo:hi]
        self.count("row", nbytes(part))
        return part.to(self.device, non_blocking=True) if self.cuda else part.clone()

    def block(self, chunk: Chunk, transpose: bool) -> Block:
        """The chunk's block on the device (its transpose too when ``transpose``). Resident blocks are moved once,
        whole, and reused."""
        if self.resident is None:
            return self._move_block(chunk.block, transpose)
        b = self.resident.get(chunk.k)
        if b is None:
            b = self.resident[chunk.k] = self._move_block(chunk.block, True)
        return b

    def _move_block(self, b: Block, transpose: bool) -> Block:
        self.count("topology", b.nbytes(transpose))
        if not self.cuda:  # copies, as on a GPU: measured as device bytes, and they die with the chunk
            return b.map(torch.clone, transpose)
        return b.to(self.device, non_blocking=True, transpose=transpose)

    def prefetched(self, load: Callable[[int], T], count: int) -> Iterator[T]:
        """``load(i)`` for ``i < count``, in order; ``load(i + 1)`` is issued before item ``i`` is handed out.

        On CUDA loads run on the copy stream and the compute stream waits on an event recorded after each; the
        caching allocator is told the loaded tensors are used there (:func:`record_streams`). On CPU this is a
        plain loop that holds two loads.
        """
        ahead = self._issue(load, 0) if count else None
        for i in range(count):
            assert ahead is not None
            item, loaded = ahead
            ahead = self._issue(load, i + 1) if i + 1 < count else None
            if loaded is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(loaded)
                record_streams(item, stream)
            yield item

    def _issue(self, load: Callable[[int], T], i: int) -> tuple[T, Any]:
        """``load(i)``, on the copy stream after the work queued so far (CUDA), and the event that marks it done."""
        if self.stream is None:
            return load(i), None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            item = load(i)
            loaded = torch.cuda.Event()
            loaded.record(self.stream)
        return item, loaded

    # -------------------------------------------------------------------------------------------- device -> host
    def store(self, host: Tensor, lo: int, value: Tensor) -> None:
        """``host[lo:lo+len(value)] = value`` (asynchronous into pinned memory on CUDA), counted as ``d2h``."""
        self.count("d2h", nbytes(value))
        host[lo : lo + value.shape[0]].copy_(value.detach(), non_blocking=self.cuda)

    def accumulate(self, host: Tensor, rows: Tensor, value: Tensor) -> None:
        """``host[rows] += value``, counted as ``d2h``; on CUDA the copy is asynchronous and the addition runs on a
        worker thread, in submission order (chunks' source rows overlap)."""
        self.count("d2h", nbytes(value))
        if self.pool is None:
            self._add(host, rows, value)
            return
        staging = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        staging.copy_(value, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))
        self.pending.append(self.pool.submit(self._add_when_copied, copied, host, rows, staging))

    def _add_when_copied(self, copied: Any, host: Tensor, rows: Tensor, staging: Tensor) -> None:
        copied.synchronize()
        self._add(host, rows, staging)

    def _add(self, host: Tensor, rows: Tensor, value: Tensor) -> None:
        if self.host_lock is None:
            scatter_add_rows(host, rows, value)
            return
        with self.host_lock:  # several devices' rows may overlap
            scatter_add_rows(host, rows, value)

    def barrier(self, raise_errors: bool = True) -> None:
        """Wait until every copy and accumulation into host memory has landed (between layers; after a failed
        pass, with ``raise_errors=False``, so that none lands later)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        errors = [e for e in (f.exception() for f in self.pending) if e is not None]
        self.pending.clear()
        if errors and raise_errors:
            raise errors[0]

    # -------------------------------------------------------------------------------------------- device -> device
    def receive(self, t: Tensor, sender: RowMover | None, kind: str) -> Tensor:
        """``t`` (made on ``sender``'s device; ``None``: host memory) on this device, counted as ``kind``: the same
        tensor when the sender is this mover (a hand-off on one device: nothing moves, zero bytes), else a copy
        (on CPU too, so that this device's byte counter sees it)."""
        if sender is self:
            return t
        self.count(kind, nbytes(t))
        if not self.cuda:
            return t.clone()
        out = t.to(self.device, non_blocking=True)
        if self.work_stream is not None and out.device == t.device:
            out.record_stream(self.work_stream)  # two movers on one GPU share the tensor: keep it until ours is done
        return out

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` with its kernels on this device's work stream, finished on the device when this returns (the
        calling thread waits; other devices' threads go on); a plain call without a work stream."""
        if self.work_stream is None:
            return fn()
        with torch.cuda.stream(self.work_stream):
            out = fn()
        self.work_stream.synchronize()
        return out

    # -------------------------------------------------------------------------------------------- memory
    def reset_device_peak(self) -> None:
        """Start a new window of the device's allocator peak (CUDA; CPU devices count with a live-bytes counter)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def device_peak(self) -> int | None:
        """The CUDA allocator's peak bytes since :meth:`reset_device_peak`; ``None`` on other devices."""
        return int(torch.cuda.max_memory_allocated(self.device)) if self.cuda else None
