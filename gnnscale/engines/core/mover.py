"""The row mover of the chunked engines (offload, task-parallel): one device's traffic, counted by kind.

A :class:`RowMover` belongs to one device and is driven by that device's thread. It moves

* host -> device: vertex rows gathered by id (:meth:`~RowMover.rows`), contiguous row ranges
  (:meth:`~RowMover.slice`), small index tensors (:meth:`~RowMover.index`) and chunk blocks, once when they stay
  resident (:meth:`~RowMover.block`); loads can be issued ahead on a copy stream (:meth:`~RowMover.prefetched`);
* device -> host: row ranges stored (:meth:`~RowMover.store`) or added into host rows (:meth:`~RowMover.accumulate`,
  on a worker thread on an accelerator), all landed at :meth:`~RowMover.barrier`;
* device -> device: a tensor another device's mover produced (:meth:`~RowMover.receive`): nothing moves, and no
  byte is counted, when the sender is this mover.

Rows are read from a host tensor, or through a feature source (:mod:`gnnscale.store.features`; :meth:`RowMover.source`
makes one over a host table that reads with this mover's copies, so that an engine's feature reads are counted by
the source's read counters as well). Every byte is counted in :attr:`RowMover.moved` under the kind the caller names
(the engines' metric names).
Every device operation goes through :mod:`gnnscale.runtime`, so one code path serves three kinds of device: on
an accelerator the copies are asynchronous (pinned host memory, a copy stream, events); on the runtime's sim
device the same copies read as NaN until they are waited for, so a missing wait fails a test on a CPU; on the CPU
the calls are synchronous and every gather, block and result is still a new tensor (a device's byte counter sees
it), while contiguous reads (:meth:`~RowMover.slice`) are views of the host rows; a CPU mover made ``in_place``
(the offload engine's, without a device or host budget) also lets a reader take gathered rows where they are
(:meth:`~RowMover.rows_in_place`), a producer write the rows it stores where they land (:meth:`~RowMover.output`)
and add rows into host memory as it makes them (:meth:`~RowMover.accumulate_in_place`); every byte is counted all
the same.

The waits, and what each orders (an accelerator's; none on the CPU):

* :meth:`~RowMover.prefetched`: before a chunk's loads the copy stream waits for the compute stream (the loads come
  after the compute issued so far: a buffer freed by an earlier chunk is not refilled while it is read), and
  before the chunk is handed out the compute stream waits for the loads' event: two waits per chunk;
* :meth:`~RowMover.accumulate`: the worker thread waits (host) for the event recorded after the copy of the rows
  into host memory before adding them: one sync per accumulation, off the device's thread;
* :meth:`~RowMover.barrier`: the host waits for the device: one sync per pass;
* :meth:`~RowMover.run`: the host waits for the work stream after each operation: one sync per operation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.engines.core.chunks import Chunk
from gnnscale.graph.block import Block
from gnnscale.store import FeatureSource, InMemorySource, PinnedHostSource, gather_rows, scatter_add_rows

T = TypeVar("T")


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def record_streams(item: object, stream: rt.Stream | None) -> None:
    """Mark every tensor of ``item`` (a tensor, a block, a tuple/list of them, or an object with its own
    ``record_stream(stream)``) as used on ``stream`` (:func:`gnnscale.runtime.record_stream`): made on another
    stream, its memory is then kept until ``stream``'s work on it is done. Nothing for a ``None`` stream (the
    CPU)."""
    if stream is None:
        return
    if isinstance(item, tuple | list):
        for x in item:
            record_streams(x, stream)
    elif isinstance(item, Block):
        for t in item.tensors():
            rt.record_stream(t, stream)
    elif isinstance(item, Tensor):
        rt.record_stream(item, stream)
    elif item is not None and hasattr(item, "record_stream"):
        item.record_stream(stream)


class RowMover:
    """Host <-> device and device <-> device traffic of one device, with byte counters by kind.

    Args:
        device: the device rows go to (a ``torch.device`` or a sim device).
        gather: how rows are gathered onto a GPU: ``"index_select"`` (a CPU gather into pinned staging and a copy)
            or ``"uva"`` (a kernel reading pinned host memory, which needs the row ids on the device).
        host_lock: taken around additions into host memory that other devices' movers add into too.
        resident: keep chunk blocks on the device after their first move (else each pass moves them again).
        own_stream: run the device's work on a stream of its own (:meth:`run`; the task-parallel runners).
    """

    def __init__(self, device: rt.Device, *, gather: str = "index_select",
                 host_lock: threading.Lock | None = None, resident: bool = False, own_stream: bool = False,
                 in_place: bool = False):
        self.device, self.gather, self.host_lock = device, gather, host_lock
        self.accelerator = rt.is_accelerator(device)
        """Copies are asynchronous, on streams (a real accelerator, or the sim device)."""
        self.in_place = in_place and not self.accelerator
        """Host rows may be read where they are (:meth:`rows_in_place`): a CPU that is not rehearsing an
        accelerator's copies (the engine asks for it where neither a device nor a host budget is set)."""
        self.stream = rt.new_stream(device) if self.accelerator else None
        """The copy stream prefetched loads are issued on."""
        self.work_stream = rt.new_stream(device) if self.accelerator and own_stream else None
        """The stream :meth:`run` issues the device's work on (``own_stream``)."""
        self.pool = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnnscale-accumulate")
                     if self.accelerator else None)
        self.pending: list[Future[None]] = []
        self._queued: list[tuple[Tensor, Tensor, Tensor]] = []
        """Accumulations asked for inside :meth:`compute`, issued when it ends."""
        self._computing = 0
        self.moved: dict[str, int] = {}
        """Bytes moved by kind, since :meth:`reset_counters` (a kind appears once something was counted)."""
        self.resident: dict[int, Block] | None = {} if resident else None
        """Chunk blocks kept on the device after their first use, by chunk id (``None``: topology is resent every
        pass)."""

    def count(self, kind: str, n: int) -> None:
        self.moved[kind] = self.moved.get(kind, 0) + n

    def reset_counters(self) -> None:
        self.moved = {}

    @contextmanager
    def compute(self) -> Iterator[None]:
        """A block of this device's compute (:func:`gnnscale.runtime.on_device`). Additions into host memory asked
        for inside (:meth:`accumulate`) are issued when it ends, on the same stream: their host staging buffers are
        made outside the device's scope (inside a sim device's scope a new tensor counts as its memory)."""
        with rt.on_device(self.device):
            self._computing += 1
            try:
                yield
            finally:
                self._computing -= 1
        if not self._computing:
            self._issue_accumulations()

    # -------------------------------------------------------------------------------------------- host -> device
    def source(self, x: Tensor) -> FeatureSource:
        """A feature source over the host table ``x`` (pinned by the caller where this device needs it) that reads
        onto this device the way :meth:`rows` reads a host tensor: :class:`~gnnscale.store.InMemorySource` on the
        CPU, else a :class:`~gnnscale.store.PinnedHostSource` with this mover as its reader (:meth:`host_rows`:
        the same copies, staging and waits as a host tensor's rows; ``--gather uva`` the same kernel)."""
        if not self.accelerator:
            return InMemorySource(x)  # tier "host"
        return PinnedHostSource(x, self.device, method=self.gather, pin=False, reader=self)  # tier "pinned"

    def rows(self, host: Tensor | FeatureSource, rows: Tensor, rows_dev: Tensor | None = None,
             kind: str = "row") -> Tensor:
        """``host[rows]`` on the device: ``[R, F]`` (``rows_dev``: the same ids on the device, for the UVA gather,
        see :meth:`gather_ids`), counted as ``kind``. A :class:`~gnnscale.store.FeatureSource` (one of
        :meth:`source`'s, reading onto this device) is read through its ``gather``: the rows are counted by its
        read counters too; ``rows`` must lie in its range (checked once by the caller, not per read)."""
        uva = self.accelerator and self.gather == "uva"
        if uva:
            assert rows_dev is not None
        ids = rows_dev if uva else rows
        assert ids is not None
        if isinstance(host, FeatureSource):
            self.count(kind, rows.numel() * host.row_bytes)
            return host.gather_unchecked(ids)
        self.count(kind, rows.numel() * host.shape[1] * host.element_size())
        return self.host_rows(host, ids)

    def rows_in_place(self, host: Tensor, rows: Tensor, kind: str = "row") -> Tensor:
        """``host`` itself, for a reader that takes its ``rows`` where they are (:attr:`in_place`), counted as
        :meth:`rows` counts them: they are read all the same, without the gathered copy."""
        assert self.in_place
        self.count(kind, rows.numel() * host.shape[1] * host.element_size())
        return host

    def view_in_place(self, host: Tensor, lo: int, hi: int) -> Tensor:
        """``host[lo:hi]`` as it is, for a reader on a CPU that reads in place (:attr:`in_place`) something a device
        would not read (it recomputes it instead: the offload backward's next-layer input); not counted, since the
        counters say what a device moves."""
        assert self.in_place
        return host[lo:hi]

    def host_rows(self, host: Tensor, rows: Tensor) -> Tensor:
        """``host[rows]`` read onto this device (``rows`` on the device for the UVA gather, else on the CPU); not
        counted (:meth:`rows` counts). This mover is the reader of its :meth:`source` s
        (:class:`~gnnscale.store.sources.HostRows`)."""
        if not self.accelerator:
            return host.index_select(0, rows)  # a new tensor, like the device copy it stands for
        if self.gather == "uva":
            out = rt.empty((rows.numel(), host.shape[1]), dtype=host.dtype, device=self.device)
            return gather_rows(host, rows, out, method="uva")
        return rt.to_device(self._gathered(host, rows), self.device)

    def _gathered(self, host: Tensor, rows: Tensor) -> Tensor:
        """``host[rows]`` gathered by the CPU into host memory a copy can read asynchronously: pinned staging where
        the device needs it (the caching host allocator keeps it until the copy is done), else a plain gather (no
        factory op: made inside a sim device's scope, a new tensor would count as the device's memory)."""
        if not rt.needs_pinning(self.device):
            return host.index_select(0, rows)
        staging = rt.pinned_empty((rows.numel(), host.shape[1]), dtype=host.dtype, device=self.device)
        return torch.index_select(host, 0, rows, out=staging)

    def gather_ids(self, rows: Tensor) -> Tensor | None:
        """``rows`` on the device when the UVA gather reads them there (counted as index bytes), else ``None``."""
        return self.index(rows) if self.accelerator and self.gather == "uva" else None

    def index(self, t: Tensor, device: rt.Device | None = None, kind: str = "index") -> Tensor:
        """A small host tensor (pinned for a GPU) on ``device`` (default: this mover's), counted as ``kind``. On
        the CPU it is used in place (counted all the same, so tests see the traffic)."""
        device = self.device if device is None else device
        self.count(kind, nbytes(t))
        if not rt.is_accelerator(device):
            return t
        return rt.to_device(t, device)

    def slice(self, host: Tensor | FeatureSource, lo: int, hi: int) -> Tensor:
        """``host[lo:hi]`` on the device for reading only (a contiguous bulk copy), counted as row bytes; a feature
        source (one of :meth:`source`'s) is read through its ``view_range`` (the same copy, counted by its read
        counters too). On the CPU the rows are already where they are read: a view, no copy (counted all the
        same); the caller must not write to it."""
        if isinstance(host, FeatureSource):
            self.count("row", (hi - lo) * host.row_bytes)
            return host.view_range(lo, hi)
        part = host[lo:hi]
        self.count("row", nbytes(part))
        return rt.to_device(part, self.device) if self.accelerator else part

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
        if not self.accelerator:  # copies, as on a GPU: measured as device bytes, and they die with the chunk
            return b.map(torch.clone, transpose)
        return b.map(lambda t: rt.to_device(t, self.device), transpose)

    def prefetched(self, load: Callable[[int], T], count: int) -> Iterator[T]:
        """``load(i)`` for ``i < count``, in order; ``load(i + 1)`` is issued before item ``i`` is handed out.

        On an accelerator loads run on the copy stream, after the compute stream's work so far, and the compute
        stream waits on an event recorded after each before its item is handed out; the loaded tensors are
        recorded as used there (:func:`record_streams`). On the CPU this is a plain loop that holds two loads.
        """
        ahead = self._issue(load, 0) if count else None
        for i in range(count):
            assert ahead is not None
            item, loaded = ahead
            ahead = self._issue(load, i + 1) if i + 1 < count else None
            if loaded is not None:
                compute = rt.current_stream(self.device)
                rt.wait_event(loaded, compute)  # item i has landed
                record_streams(item, compute)
            yield item

    def _issue(self, load: Callable[[int], T], i: int) -> tuple[T, rt.Event | None]:
        """``load(i)`` on the copy stream after the compute stream's work so far, and the event that marks it
        done (``None`` without a copy stream)."""
        if self.stream is None:
            return load(i), None
        rt.wait_stream(self.stream, rt.current_stream(self.device))  # after the compute issued so far
        with rt.use_stream(self.stream):
            item = load(i)
        return item, rt.record_event(self.stream)

    # -------------------------------------------------------------------------------------------- device -> host
    def output(self, host: Tensor, lo: int, hi: int) -> Tensor | None:
        """Where a producer may write the rows it will :meth:`store` at ``host[lo:hi]``: on a mover that reads in
        place (:attr:`in_place`), those host rows themselves, which :meth:`store` then counts without a copy;
        else ``None`` (the producer makes its own tensor on the device, and :meth:`store` copies it)."""
        return host[lo:hi] if self.in_place and host.is_contiguous() else None

    def store(self, host: Tensor, lo: int, value: Tensor) -> None:
        """``host[lo:lo+len(value)] = value`` (asynchronous into pinned memory on an accelerator: landed at
        :meth:`barrier`), counted as ``d2h``; nothing is copied for a ``value`` made in those rows
        (:meth:`output`)."""
        self.count("d2h", nbytes(value))
        dst = host[lo : lo + value.shape[0]]
        if self.in_place and value.data_ptr() == dst.data_ptr() and value.stride() == dst.stride():
            return  # written where it lands
        rt.copy_async(dst, value.detach())

    def accumulate(self, host: Tensor, rows: Tensor, value: Tensor) -> None:
        """``host[rows] += value``, counted as ``d2h``; on an accelerator the copy is asynchronous and the addition
        runs on a worker thread, in submission order (chunks' source rows overlap). Inside :meth:`compute` the copy
        is issued when the block ends."""
        self.count("d2h", nbytes(value))
        if self.pool is None:
            self._add(host, rows, value)
            return
        self._queued.append((host, rows, value.detach()))
        if not self._computing:
            self._issue_accumulations()

    def accumulate_in_place(self, host: Tensor, rows: Tensor, width: int, add: Callable[[Tensor], None]) -> None:
        """``add(host)`` adds values into ``host[rows]`` itself (``width`` columns each), for a producer that
        writes its rows as it makes them (:attr:`in_place`), counted as :meth:`accumulate` counts them; under the
        host lock when several devices share the host rows."""
        assert self.in_place
        self.count("d2h", rows.numel() * width * host.element_size())
        if self.host_lock is None:
            add(host)
            return
        with self.host_lock:
            add(host)

    def _issue_accumulations(self) -> None:
        """Copy each queued value into host staging on the compute stream; the worker thread adds it once the
        event recorded after its copy is done."""
        queued, self._queued = self._queued, []
        for host, rows, value in queued:
            pool = self.pool
            assert pool is not None
            staging = rt.pinned_empty(value.shape, dtype=value.dtype, device=self.device)
            rt.copy_async(staging, value)
            copied = rt.record_event(rt.current_stream(self.device))
            self.pending.append(pool.submit(self._add_when_copied, copied, host, rows, staging))

    def _add_when_copied(self, copied: rt.Event | None, host: Tensor, rows: Tensor, staging: Tensor) -> None:
        rt.synchronize(copied)  # the rows have landed in host memory
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
        self._queued.clear()  # asked for by a compute block that failed: never issued
        if self.accelerator:
            rt.synchronize(self.device)
        errors = [e for e in (f.exception() for f in self.pending) if e is not None]
        self.pending.clear()
        if errors and raise_errors:
            raise errors[0]

    # -------------------------------------------------------------------------------------------- device -> device
    def receive(self, t: Tensor, sender: RowMover | None, kind: str) -> Tensor:
        """``t`` (made on ``sender``'s device; ``None``: host memory) on this device, counted as ``kind``: the same
        tensor when the sender is this mover (a hand-off on one device: nothing moves, zero bytes), else a copy
        (on the CPU too, so that this device's byte counter sees it) on the current stream."""
        if sender is self:
            return t
        self.count(kind, nbytes(t))
        if not self.accelerator:
            return t.clone()
        out = rt.to_device(t, self.device)
        if out is t and self.work_stream is not None:
            rt.record_stream(out, self.work_stream)  # two movers on one device share it: kept until ours is done
        return out

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` with its work on this device's work stream (:meth:`compute`), finished on the device when this
        returns (the calling thread waits; other devices' threads go on); a plain call without a work stream."""
        if self.work_stream is None:
            return fn()
        with rt.use_stream(self.work_stream), self.compute():
            out = fn()
        rt.synchronize(self.work_stream)  # its results are complete for any device or stream that reads them
        return out

    # -------------------------------------------------------------------------------------------- memory
    def reset_device_peak(self) -> None:
        """Start a new window of the device's allocation peak (accelerators; CPU devices count with a live-bytes
        counter)."""
        if self.accelerator:
            rt.reset_peak(self.device)

    def device_peak(self) -> int | None:
        """The device's peak bytes since :meth:`reset_device_peak`; ``None`` on the CPU."""
        return rt.peak_bytes(self.device) if self.accelerator else None
