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

bfloat16: the ``x.npy`` of a directory converted with ``--feature-dtype bf16`` holds the ``uint16`` bits of
bfloat16 values; :class:`DiskSource` returns its rows as ``torch.bfloat16`` (2 bytes an element read, counted and
cached), and the model upcasts them where it computes. :class:`Upcast` hands a source's rows on in another dtype
(``float32`` for an engine that keeps float32 features), cast after the source's read and move.
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
from gnnscale.graph.io import stored_feature_dtype
from gnnscale.graph.mapped import mapped_file
from gnnscale.store.cache import DeviceCache
from gnnscale.store.features import FeatureSource, FeatureSourceError
from gnnscale.store.transfer import place

__all__ = ["BUFFER_BYTES", "DiskSource", "Upcast", "host_cached", "hot_rows_fitting", "mapped_npy", "npy_layout"]

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
        dtype: the rows' dtype when it is not the file's own: ``torch.bfloat16`` reads a file of 2-byte integers
            (``uint16`` bits) as bfloat16. ``None``: as :func:`gnnscale.graph.io.open_dir` reads the file
            (bfloat16 for the ``x.npy`` of a bf16 directory, :func:`~gnnscale.graph.io.stored_feature_dtype`),
            else the file's dtype.
    """

    def __init__(self, path: str | Path, *, tier: str = "disk", buffer_bytes: int = BUFFER_BYTES, threads: int = 1,
                 dtype: torch.dtype | None = None):
        super().__init__(tier)
        self.path = Path(path)
        self.offset, shape, np_dtype = npy_layout(self.path)
        if len(shape) != 2:
            raise FeatureSourceError(f"{self.path} must hold one [rows, dim] array, got shape {shape}")
        self._dtype = _rows_dtype(self.path, np_dtype, stored_feature_dtype(self.path) if dtype is None else dtype)
        self.np_dtype = np_dtype
        self._rows, self._dim = int(shape[0]), int(shape[1])
        need = self.offset + self._rows * self._dim * np_dtype.itemsize
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
        self._view = memoryview(self.buffer.view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # bytes
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


def _rows_dtype(path: Path, np_dtype: np.dtype, dtype: torch.dtype | None) -> torch.dtype:
    """The torch dtype a :class:`DiskSource` returns the rows of ``path`` (``np_dtype`` in the file) as: ``dtype``,
    or the file's own when ``None``. bfloat16 is read from 2-byte integers (its bits, as ``gnnscale convert
    --feature-dtype bf16`` stores them)."""
    try:
        own = torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype
    except (TypeError, ValueError) as exc:
        raise FeatureSourceError(f"{path}: dtype {np_dtype} cannot be read as a tensor ({exc})") from None
    if dtype is None or dtype == own:
        return own
    if dtype == torch.bfloat16 and np_dtype.kind in "iu" and np_dtype.itemsize == 2:
        return dtype
    raise FeatureSourceError(f"{path} holds {np_dtype} values, which cannot be read as {dtype} rows")


class Upcast(FeatureSource):
    """``source``'s rows in another ``dtype`` (``float32`` by default): read (and moved) by ``source`` in its own
    dtype, then cast where they are, on ``source``'s device. Serves nothing itself: its counters are ``source``'s
    tiers', in their bytes (a bfloat16 disk read counts 2 bytes an element)."""

    def __init__(self, source: FeatureSource, dtype: torch.dtype = torch.float32):
        super().__init__(source.tier)
        self.source, self._dtype = source, dtype

    @property
    def num_rows(self) -> int:
        return self.source.num_rows

    @property
    def dim(self) -> int:
        return self.source.dim

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> rt.Device:
        return self.source.device

    checks_range = False

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        got = self.source.gather_unchecked(ids)
        if out is None:
            return got.to(self._dtype)
        out.copy_(got)  # the cast, into the caller's buffer
        return out

    def tiers(self) -> list[FeatureSource]:
        return self.source.tiers()


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
    """The ``.npy`` file whose array ``t`` is (all of it: the very tensor :func:`gnnscale.graph.io.open_dir`
    memory-mapped from a converted directory, :func:`gnnscale.graph.mapped.mapped_file`; not a copy, slice or view of
    it), checked against the file's header (offset, shape, dtype: ``uint16`` bits for bfloat16); ``None``
    elsewhere (a tensor in memory). Any OS: nothing is read from ``/proc``."""
    if t.device.type != "cpu" or t.dim() != 2:
        return None
    mapped = mapped_file(t)
    if mapped is None:
        return None
    try:
        offset, shape, dtype = npy_layout(mapped.path)
        same = (offset == mapped.offset and tuple(shape) == tuple(t.shape)
                and _rows_dtype(mapped.path, dtype, t.dtype) == t.dtype == mapped.dtype)
    except FeatureSourceError:
        return None
    return mapped.path if same else None
