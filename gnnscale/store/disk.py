"""The disk tier: feature rows read from an ``.npy`` file of a converted graph directory by batched positional
reads (DGL GraphBolt's ``DiskBasedFeature``, dgl#7339), behind a bounded host cache of hot rows.

:class:`DiskSource` reads the rows asked for with ``os.preadv`` into one reusable buffer: the ids are made distinct
and sorted, adjacent rows are coalesced into one read, and the rows are scattered back into the order asked (a
row asked for twice in one read is read once). Unlike a memory map it holds no pages of the file: what is resident
is the buffer and the rows returned; the kernel's page cache may still keep the file, and counts as cache, not as
the process's anonymous memory. :func:`host_cached` puts a bounded cache of hot rows in host memory in front of it
(a :class:`~gnnscale.store.cache.DeviceCache` whose "device" is the CPU, tier ``"host-cache"``).

Reads are serialised by a lock (one buffer); a short read, a file that shrank or vanished, or an I/O error is one
:class:`~gnnscale.store.features.FeatureSourceError` line naming the file.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from numpy.lib import format as npformat
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.store.cache import DeviceCache
from gnnscale.store.features import FeatureSource, FeatureSourceError
from gnnscale.store.transfer import place

__all__ = ["BUFFER_BYTES", "DiskSource", "host_cached", "hot_rows_fitting", "mapped_npy", "npy_layout"]

BUFFER_BYTES = 4 << 20
"""Default size of a :class:`DiskSource`'s reusable read buffer (a read of more rows goes in several passes)."""


def npy_layout(path: str | Path) -> tuple[int, tuple[int, ...], np.dtype]:
    """``(data offset, shape, dtype)`` of a C-ordered ``.npy`` file, from its header (nothing else is read).

    Raises:
        FeatureSourceError: the file cannot be read, is no ``.npy`` file, or holds objects or Fortran order.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            version = npformat.read_magic(fh)
            read_header = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
            offset = fh.tell()
    except OSError as exc:
        raise FeatureSourceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise FeatureSourceError(f"{path} is not a .npy file: {exc}") from None
    if dtype.hasobject:
        raise FeatureSourceError(f"{path} holds Python objects ({dtype}), not numbers: refused")
    if fortran and len(shape) > 1:
        raise FeatureSourceError(f"{path} is in Fortran order; the disk tier reads C-ordered rows (rewrite it)")
    return offset, tuple(shape), dtype


class DiskSource(FeatureSource):
    """Rows of a ``[N, F]`` array in an ``.npy`` file, read with positional reads into a reusable buffer.

    A read makes the ids distinct and sorts them, reads every run of adjacent rows with one ``os.preadv`` (at
    most ``buffer_bytes`` per pass), and scatters the rows into the order asked. Counters (:attr:`stats`, tier
    ``"disk"``): the *distinct* rows read and their bytes (a row asked for twice in one read is read and counted
    once), one request per read; :attr:`preads` counts the system calls.

    Args:
        path: the ``.npy`` file (C order, numeric dtype).
        buffer_bytes: the reusable buffer's size (at least one row).
        threads: reads in flight at once (a small thread pool over the runs of one pass); 1: one after another.
    """

    def __init__(self, path: str | Path, *, tier: str = "disk", buffer_bytes: int = BUFFER_BYTES, threads: int = 1):
        super().__init__(tier)
        self.path = Path(path)
        self.offset, shape, dtype = npy_layout(self.path)
        if len(shape) != 2:
            raise FeatureSourceError(f"{self.path} must hold one [rows, dim] array, got shape {shape}")
        try:
            self._dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        except (TypeError, ValueError) as exc:
            raise FeatureSourceError(f"{self.path}: dtype {dtype} cannot be read as a tensor ({exc})") from None
        self.np_dtype = dtype
        self._rows, self._dim = int(shape[0]), int(shape[1])
        need = self.offset + self._rows * self._dim * dtype.itemsize
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
            size = os.fstat(self.fd).st_size
        except OSError as exc:
            raise FeatureSourceError(f"cannot open {self.path}: {exc.strerror or exc}") from None
        if size < need:
            os.close(self.fd)
            raise FeatureSourceError(f"{self.path} is truncated: {size} bytes, its header says {need}")
        rb = max(self.row_bytes, 1)
        self.buffer_rows = max(1, buffer_bytes // rb)
        self.buffer = torch.empty((self.buffer_rows, self._dim), dtype=self._dtype)  # the one reusable buffer
        self._view = memoryview(self.buffer.numpy().view(np.uint8).reshape(-1))  # type: ignore[arg-type]
        self.threads = max(1, threads)
        self._pool = (ThreadPoolExecutor(self.threads, thread_name_prefix="gnnscale-disk") if self.threads > 1
                      else None)
        self._lock = threading.Lock()
        self.preads = 0
        """``os.preadv`` calls made (a run of adjacent rows is one)."""

    @property
    def num_rows(self) -> int:
        return self._rows

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> rt.Device:
        return torch.device("cpu")

    @property
    def buffer_bytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def _read_run(self, view: memoryview, row: int, rows: int, at: int) -> None:
        """Read rows ``row .. row + rows - 1`` into buffer rows ``at ..`` (one ``os.preadv``)."""
        rb = self.row_bytes
        want = rows * rb
        try:
            got = os.preadv(self.fd, [view[at * rb : at * rb + want]], self.offset + row * rb)
        except OSError as exc:
            raise FeatureSourceError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if got != want:
            raise FeatureSourceError(f"{self.path}: short read at row {row} ({got} of {want} bytes): the file "
                                     "shrank or vanished while training read it")

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        ids = place(ids, torch.device("cpu"))
        uniq, inverse = torch.unique(ids, sorted=True, return_inverse=True)  # [u] ascending, [n]
        n, u = ids.numel(), uniq.numel()
        if out is None:
            out = torch.empty((n, self._dim), dtype=self._dtype)
        with self._lock:
            for lo in range(0, u, self.buffer_rows):
                part = uniq[lo : lo + self.buffer_rows]
                rows = part.tolist()
                runs: list[tuple[int, int, int]] = []  # (first row, rows, buffer row)
                start = 0
                for i in range(1, len(rows) + 1):
                    if i == len(rows) or rows[i] != rows[i - 1] + 1:
                        runs.append((rows[start], i - start, start))
                        start = i
                if self._pool is not None and len(runs) > 1:
                    list(self._pool.map(lambda r: self._read_run(self._view, *r), runs))
                else:
                    for r in runs:
                        self._read_run(self._view, *r)
                self.preads += len(runs)
                if u <= self.buffer_rows:  # one pass: every id's row is in the buffer
                    if out.is_contiguous():
                        torch.index_select(self.buffer, 0, inverse, out=out)
                    else:
                        out.copy_(self.buffer.index_select(0, inverse))
                else:
                    pos = ((inverse >= lo) & (inverse < lo + part.numel())).nonzero().view(-1)  # ids of this pass
                    out.index_copy_(0, pos, self.buffer.index_select(0, inverse[pos] - lo))
        self._record(u)
        return out

    def close(self) -> None:
        """Close the file (once); the source must not be read afterwards."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


def hot_rows_fitting(budget: int, row_bytes: int) -> int:
    """Rows a host cache of ``budget`` bytes holds: each costs its bytes and 8 for its id in the lookup."""
    return max(0, budget) // (row_bytes + 8)


def host_cached(fallback: FeatureSource, ranked: Tensor, budget: int, *, tier: str = "host-cache") -> FeatureSource:
    """``fallback`` behind a host cache of its hottest rows: the first rows of ``ranked`` (vertex ids, hottest
    first) that ``budget`` bytes hold (:func:`hot_rows_fitting`), read once through ``fallback`` (its counters
    are reset afterwards) and kept in host memory. No room for a row: ``fallback`` itself."""
    hot = min(hot_rows_fitting(budget, fallback.row_bytes), fallback.num_rows)
    if hot == 0:
        return fallback
    cache = DeviceCache.of(fallback, ranked[:hot], "cpu", tier=tier)
    fallback.reset_stats()
    return cache


def mapped_npy(t: Tensor) -> Path | None:
    """The ``.npy`` file whose array ``t`` is (all of it: a memory map of the whole array, as
    :func:`gnnscale.graph.io.open_dir` loads a converted directory), found in ``/proc/self/maps`` and checked
    against the file's header (offset, shape, dtype); ``None`` elsewhere (a tensor in memory, another OS)."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 2:
        return None
    ptr = t.data_ptr()
    try:
        with open("/proc/self/maps") as fh:
            lines = fh.readlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].strip().endswith(".npy"):
            continue
        lo, hi = (int(a, 16) for a in parts[0].split("-"))
        if not lo <= ptr < hi:
            continue
        path = Path(parts[5].strip())
        try:
            offset, shape, dtype = npy_layout(path)
        except FeatureSourceError:
            return None
        same = (ptr - lo + int(parts[2], 16) == offset and tuple(shape) == tuple(t.shape)
                and torch.from_numpy(np.empty(0, dtype=dtype)).dtype == t.dtype)
        return path if same else None
    return None
