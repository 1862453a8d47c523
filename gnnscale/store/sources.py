"""The plain feature sources: rows in host memory, in pinned host memory read by a device, on a device, and in a
memory-mapped ``.npy`` file (:class:`~gnnscale.store.features.FeatureSource` explains the protocol); and
:class:`ReorderedRows`, the rows of another source in another order (an engine's vertex order over a file's rows).

Each reads its rows with one index and counts them under its tier name (``"host"``, ``"pinned"``, ``"device"``,
``"disk"`` unless given another). Put one behind a :class:`~gnnscale.store.cache.DeviceCache` to keep hot rows
nearer the compute.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.store.features import FeatureSource, FeatureSourceError, TableSource
from gnnscale.store.gather import GATHER_METHODS, HostRowReader, default_gather_method
from gnnscale.store.transfer import as_device, place

__all__ = ["DeviceSource", "HostRows", "InMemorySource", "MmapSource", "PinnedHostSource", "ReorderedRows"]


def _host_table(x: Tensor, what: str) -> Tensor:
    if not isinstance(x, Tensor) or x.device.type != "cpu" or rt.is_accelerator(rt.device_of(x)):
        where = rt.device_of(x) if isinstance(x, Tensor) else type(x).__name__
        raise FeatureSourceError(f"{what} needs a CPU tensor, got {where}")
    return x.contiguous()


class InMemorySource(TableSource):
    """Rows of a host tensor, read on the CPU (``x[ids]``; ``x`` is used as it is, not copied, when contiguous)."""

    def __init__(self, x: Tensor, *, tier: str = "host"):
        super().__init__(_host_table(x, "InMemorySource"), tier)


class DeviceSource(TableSource):
    """Rows resident on a device (``x`` moved to ``device``, or kept where it is): read there by one index.
    On an accelerator the move is an asynchronous copy on its current stream (a sim device counts it in its
    pool: :class:`~gnnscale.runtime.DeviceOutOfMemory` when it does not fit)."""

    def __init__(self, x: Tensor, device: rt.Device | str | None = None, *, tier: str = "device"):
        super().__init__(x if device is None else place(x, as_device(device)), tier)


class HostRows(Protocol):
    """What reads rows of a host table onto a device: :class:`~gnnscale.store.gather.HostRowReader`, or a
    :class:`~gnnscale.store.global_store.StoreReader` (which shares one staging buffer over every table)."""

    def host_rows(self, host: Tensor, rows: Tensor) -> Tensor: ...


class PinnedHostSource(TableSource):
    """Rows in host memory, page-locked in place, read by ``device``: on CUDA by the zero-copy UVA gather or a CPU
    gather into a reused pinned staging buffer and an asynchronous copy (:mod:`gnnscale.store.gather`; the sim
    device takes the second way, with plain host memory); on the CPU by an index (or the UVA kernel under
    ``TRITON_INTERPRET=1``). Ascending ids read fastest.

    Args:
        x: ``[N, F]`` CPU tensor; registered with CUDA in place (:func:`gnnscale.runtime.pinned_host`; a pinned
            copy only where registration fails), not copied.
        device: where the rows go.
        method: ``"uva"``, ``"index_select"`` or ``"auto"`` (:func:`~gnnscale.store.gather.default_gather_method`).
        pin: page-lock ``x``; ``None``: when ``device`` needs it (:func:`gnnscale.runtime.needs_pinning`: CUDA).
        reader: reads the rows (``host_rows(host, rows)``); ``None``: a
            :class:`~gnnscale.store.gather.HostRowReader` of its own. (A chunked engine's row mover is one: its
            per-read pinned staging and copy stream.)
        cudart: the CUDA runtime binding's getter (tests give a fake one).
    """

    def __init__(self, x: Tensor, device: rt.Device | str, *, method: str = "auto", pin: bool | None = None,
                 reader: HostRows | None = None, tier: str = "pinned",
                 cudart: Callable[[], Any] | None = None):
        x = _host_table(x, "PinnedHostSource")
        self._device = as_device(device)
        if method == "auto":
            method = default_gather_method(self._device)
        if method not in GATHER_METHODS:
            raise ConfigError(f"unknown gather method {method!r}; expected one of auto, {', '.join(GATHER_METHODS)}")
        self.method = method
        self.region: rt.PinnedRegion | None = None
        """The in-place registration of ``x`` (``None``: not pinned here, or pinned by a copy)."""
        if pin is None:
            pin = rt.needs_pinning(self._device)
        if pin:
            x, self.region = rt.pinned_host(x) if cudart is None else rt.pinned_host(x, cudart=cudart)
        super().__init__(x, tier)
        self.reader: HostRows = HostRowReader(self._device, method) if reader is None else reader

    @property
    def device(self) -> rt.Device:
        return self._device

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        got = self.reader.host_rows(self.table, place(ids, self._device) if self.method == "uva" else ids)
        self._record(ids.numel())
        return got

    def _copy_range(self, part: Tensor) -> Tensor:
        """One bulk copy of the pinned rows to the device (asynchronous on its current stream; no staging)."""
        return rt.to_device(part, self._device) if rt.is_accelerator(self._device) else part.clone()

    def close(self) -> None:
        """Unregister the pinned pages (once); the source must not be read afterwards."""
        if self.region is not None:
            self.region.close()


class MmapSource(FeatureSource):
    """Rows of a ``[N, F]`` array in an ``.npy`` file, memory-mapped read-only and read by index on the CPU: only
    the pages holding the rows asked for are read (the tier for graphs bigger than host memory). The file is
    loaded as data only (``allow_pickle=False``): an object array is refused, never unpickled. Ascending ids read
    fastest (a :class:`~gnnscale.store.cache.DeviceCache` asks its fallback in ascending order).
    """

    def __init__(self, path: str | Path, *, tier: str = "disk"):
        super().__init__(tier)
        self.path = Path(path)
        try:
            array = np.load(self.path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise FeatureSourceError(f"cannot map {self.path} as a .npy feature table: {exc}") from None
        if not isinstance(array, np.ndarray) or array.ndim != 2:
            shape = getattr(array, "shape", type(array).__name__)
            raise FeatureSourceError(f"{self.path} must hold one [rows, dim] array, got {shape}")
        try:
            self._dtype = torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
        except (TypeError, ValueError) as exc:
            raise FeatureSourceError(f"{self.path}: dtype {array.dtype} cannot be read as a tensor ({exc})") from None
        self.array = array
        """The read-only memory map."""

    @property
    def num_rows(self) -> int:
        return int(self.array.shape[0])

    @property
    def dim(self) -> int:
        return int(self.array.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> rt.Device:
        return torch.device("cpu")

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        idx = place(ids, torch.device("cpu")).numpy()
        if out is not None and out.is_contiguous():
            np.take(self.array, idx, axis=0, out=out.numpy(), mode="clip")  # ids are checked: clip never clips
            got = out
        else:
            got = torch.from_numpy(np.ascontiguousarray(np.take(self.array, idx, axis=0, mode="clip")))
        self._record(idx.size)
        return got


class ReorderedRows(FeatureSource):
    """The rows of another source in another order, placed on ``device``: row ``i`` is ``source``'s row
    ``perm[i]`` (``perm`` ``None``: the same order), so no copy of the table is made. An engine that numbers the
    vertices its own way (offload's partition order) reads a converted directory's ``x.npy`` through it; an
    engine on an accelerator reads a host source (the disk tier) onto its device. The reads are ``source``'s and
    counted there (:meth:`tiers`), each read passed on as one read.

    Args:
        source: the table (any source; its rows are asked for unchecked, so ``perm`` must lie in its range).
        perm: ``[n]`` int64 row of ``source`` for each row of this one; ``None``: ``n = source.num_rows``, the
            identity.
        device: where the rows go (``None``: ``source``'s device).
    """

    def __init__(self, source: FeatureSource, perm: Tensor | None = None, device: rt.Device | str | None = None):
        super().__init__(source.tier)
        if perm is not None:
            perm = place(source.check_ids(perm), torch.device("cpu"))
            source.check_range(perm)
        self.source, self.perm = source, perm
        self._device = source.device if device is None else as_device(device)

    @property
    def num_rows(self) -> int:
        return self.source.num_rows if self.perm is None else int(self.perm.numel())

    @property
    def dim(self) -> int:
        return self.source.dim

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    @property
    def device(self) -> rt.Device:
        return self._device

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        if self.perm is not None:
            ids = self.perm.index_select(0, place(ids, torch.device("cpu")))
        rows = self.source.gather_unchecked(ids)
        return place(rows, self._device) if rt.is_accelerator(self._device) else rows

    def tiers(self) -> list[FeatureSource]:
        return self.source.tiers()
