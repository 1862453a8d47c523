"""The offload engine's workers: one per device, each with its partitions, a model replica and its own row mover;
a pass runs on every worker at once, one thread each when there are several."""

from __future__ import annotations

import errno
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.engines.core.mover import RowMover
from gnnscale.errors import ConfigError
from gnnscale.graph.mapped import release_pages
from gnnscale.nn.stack import Stack
from gnnscale.plan.memory import LiveBytesCounter
from gnnscale.store import FeatureSource, ReadStats
from gnnscale.units import format_bytes

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


FILE_MIN_BYTES = 1 << 16
"""A tensor smaller than this stays in RAM rather than in a file of its own (:meth:`Spill.copy`)."""


def reserve(fd: int, nbytes: int, folder: str) -> None:
    """Give the file ``fd`` its ``nbytes`` as allocated blocks (``posix_fallocate``), not a sparse hole: a mapped
    file whose pages the disk cannot take ends the process with SIGBUS when they are written back, so a disk that
    fills after the free-space check is one :class:`ConfigError` line here, before any page is mapped. A file system
    that cannot preallocate (``EOPNOTSUPP``/``EINVAL``) gets the plain size."""
    if nbytes == 0:
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ConfigError(f"--scratch {folder}: no room for a spill file of {format_bytes(nbytes)} "
                              f"({exc.strerror}): free space there, choose another --scratch or raise "
                              "--host-memory") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise ConfigError(f"--scratch {folder}: cannot reserve a spill file: {exc.strerror or exc}") from None
        os.ftruncate(fd, nbytes)


class Spill:
    """Host buffers past a RAM allowance (``--host-memory``), as file-backed tensors (``--scratch DIR``).

    Each buffer is a shared memory map of its own file in a private subfolder of ``DIR``: read and written by rows
    exactly as a RAM tensor (the results are bit-exact), its pages written back to the file, not to anonymous
    memory, when the kernel needs the room. A file is unlinked as soon as it is mapped (the mapping keeps it
    alive; its descriptor stays open in :attr:`fds`) and the subfolder is removed once the buffers exist, so
    nothing is left in ``DIR`` after the run, whatever ends it (an error, Ctrl-C, a kill): the kernel frees the
    space when the process unmaps it or exits.

    :meth:`copy` puts a tensor the engine only reads (a chunk's topology) in a file the same way, whatever the
    allowance: the chunks' blocks are then file pages, as the graph directory's topology is.

    Args:
        scratch: the folder (``""``: the system's temporary folder).
        allowance: bytes of buffers kept in RAM (the first ones asked for that fit).
        need: bytes of every buffer: those past ``allowance`` must fit the folder's free space.
        files: bytes that :meth:`copy` will write (they must fit too).
    """

    def __init__(self, scratch: str, allowance: int, need: int, files: int = 0):
        root = scratch or tempfile.gettempdir()
        try:
            os.makedirs(root, exist_ok=True)
            free = shutil.disk_usage(root).free
        except OSError as exc:
            raise ConfigError(f"--scratch {root}: {exc.strerror or exc}") from None
        spill = max(0, need - allowance)
        if spill + files > free:
            what = "the activations to spill" + (" and the chunks' topology" if files else "")
            raise ConfigError(f"--scratch {root}: {what} need about {format_bytes(spill + files)}, the folder's "
                              f"file system has {format_bytes(free)} free: choose another --scratch or raise "
                              "--host-memory")
        self.root, self.allowance = root, allowance
        self.ram_bytes = 0
        """Bytes of the buffers kept in RAM."""
        self.spill_bytes = 0
        """Bytes of the file-backed buffers (their files' sizes)."""
        self.file_bytes = 0
        """Bytes of the file-backed copies (:meth:`copy`)."""
        self.fds: list[int] = []
        self.maps: list[Tensor] = []
        """Every file-backed tensor made (buffers and copies): :meth:`release` drops their resident pages."""
        self.copies = 0
        self.dir: str | None = tempfile.mkdtemp(prefix="gnnscale-spill-", dir=root)

    def fits_ram(self, nbytes: int) -> bool:
        """Whether a buffer of ``nbytes`` stays in RAM (counted if so)."""
        if self.ram_bytes + nbytes > self.allowance:
            return False
        self.ram_bytes += nbytes
        return True

    def _mapped(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, keep_fd: bool) -> Tensor:
        """A zero tensor mapped from a new file ``name`` of the private subfolder, unlinked at once; its descriptor
        kept in :attr:`fds` (``keep_fd``) or closed."""
        assert self.dir is not None, "the spill folder was already finished"
        path = os.path.join(self.dir, name)
        n = math.prod(shape)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            reserve(fd, n * dtype.itemsize, self.root)
            t = torch.from_file(path, shared=True, size=n, dtype=dtype).view(shape)
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.unlink(path)
        if keep_fd:
            self.fds.append(fd)
        else:
            os.close(fd)
        self.maps.append(t)
        return t

    def release(self) -> None:
        """Drop every mapped buffer's resident pages from the process (:func:`~gnnscale.graph.mapped.
        release_pages`; shared maps: nothing is lost, the pages stay in the page cache and their files): called
        after each chunk, so that the spilled buffers' pages a chunk touched do not add up in the process's
        resident set over a pass (``--host-memory`` bounds it)."""
        for t in self.maps:
            release_pages(t)

    def tensor(self, rows: int, width: int) -> Tensor:
        """A zero ``[rows, width]`` float32 tensor mapped from a new file (unlinked at once)."""
        t = self._mapped(f"buffer{len(self.fds)}.f32", (rows, width), torch.float32, keep_fd=True)
        self.spill_bytes += rows * width * 4
        return t

    def copy(self, t: Tensor) -> Tensor:
        """A copy of ``t`` mapped from a new file (unlinked and closed at once), for a tensor that is only read;
        one under :data:`FILE_MIN_BYTES` stays as it is."""
        nbytes = t.numel() * t.element_size()
        if nbytes < FILE_MIN_BYTES:
            return t
        out = self._mapped(f"copy{self.copies}.bin", tuple(t.shape), t.dtype, keep_fd=False)
        self.copies += 1
        out.copy_(t)
        self.file_bytes += nbytes
        return out

    def finish(self) -> None:
        """Remove the (empty) private subfolder: called once the buffers exist, and on any failure before."""
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def close(self) -> None:
        """Close the files' descriptors (the mappings stay valid while their tensors live)."""
        self.finish()
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


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
    model: Stack
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
