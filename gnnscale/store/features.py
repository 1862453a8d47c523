"""One protocol for reading vertex feature rows, whatever tier holds them.

A :class:`FeatureSource` is a table of ``num_rows`` rows of ``dim`` values of one ``dtype``; ``gather(ids)``
returns the rows ``ids`` on the source's ``device``. Tiers are built by wrapping (DGL GraphBolt's
``GPUCachedFeature(fallback)``): a cache on a device in front of a source in host memory, which may itself front a
memory-mapped file, each of them the same type, so an engine reads through whichever chain it is given and a new
tier (on disk, remote) plugs in without touching the engine.

Every source counts the reads it serves (:class:`ReadStats`: rows, bytes and requests, keyed by *tier name*); a
wrapper serves nothing itself and reports the counters of the sources it wraps (:meth:`FeatureSource.read_stats`),
so a chain says how many rows each tier served. Sources:

* :mod:`gnnscale.store.sources`: host tensor (:class:`~gnnscale.store.sources.InMemorySource`), pinned host
  (:class:`~gnnscale.store.sources.PinnedHostSource`), device-resident
  (:class:`~gnnscale.store.sources.DeviceSource`), memory-mapped ``.npy`` file
  (:class:`~gnnscale.store.sources.MmapSource`);
* :mod:`gnnscale.store.cache`: :class:`~gnnscale.store.cache.DeviceCache`, hot rows in front of a fallback;
* :mod:`gnnscale.store.sharded`: XGNN's hot rows spread over several devices (the global store's device tier);
* :mod:`gnnscale.store.partitioned`: one rank's rows, the others from their owners (distributed).

The public :meth:`FeatureSource.gather` checks its input and explains bad input (PyG's ``FeatureStore.get_tensor``
-> ``_get_tensor``); subclasses implement the hook :meth:`FeatureSource._gather`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.errors import GnnscaleError
from gnnscale.store.transfer import host_values, place

__all__ = ["FeatureIndexError", "FeatureSource", "FeatureSourceError", "ReadStats", "TableSource"]


class FeatureSourceError(GnnscaleError):
    """A feature source was used wrongly: an ``out`` buffer of the wrong shape, dtype or device, a bad file."""


class FeatureIndexError(FeatureSourceError, IndexError):
    """Row ids that are not a 1-D integer tensor, or that lie outside ``[0, num_rows)`` of the source."""


@dataclass
class ReadStats:
    """Reads served since the last reset, per tier name (``"host"``, ``"pinned"``, ``"device"``, ``"disk"``,
    ``"cache"``, ``"local"``, ``"remote"``, ``"device0"``, ... as each source is named)."""

    rows: Counter[str] = field(default_factory=Counter)
    """Rows served by each tier (a repeated id counts each time it is asked for)."""
    bytes: Counter[str] = field(default_factory=Counter)
    """Bytes of the rows served by each tier: ``rows * dim * dtype's item size``."""
    requests: Counter[str] = field(default_factory=Counter)
    """Non-empty reads answered by each tier (one per gather it served rows to; a sharded tier: one per holder)."""

    def record(self, tier: str, rows: int, nbytes: int, requests: int = 1) -> None:
        """Count ``rows`` rows of ``nbytes`` bytes served by ``tier`` in ``requests`` reads (nothing when empty)."""
        if rows:
            self.rows[tier] += rows
            self.bytes[tier] += nbytes
            self.requests[tier] += requests

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def copy(self) -> ReadStats:
        return ReadStats(Counter(self.rows), Counter(self.bytes), Counter(self.requests))

    def __add__(self, other: ReadStats) -> ReadStats:
        return ReadStats(self.rows + other.rows, self.bytes + other.bytes, self.requests + other.requests)

    def __sub__(self, other: ReadStats) -> ReadStats:
        """What was read after ``other`` (a :meth:`copy` taken earlier) up to ``self``; zero counts dropped."""
        return ReadStats(self.rows - other.rows, self.bytes - other.bytes, self.requests - other.requests)


class FeatureSource(ABC):
    """A table of ``num_rows`` feature rows (``[num_rows, dim]``, ``dtype``) read by row id onto ``device``.

    Subclasses implement :meth:`_gather` and count what they serve with :meth:`_record`; wrappers (sources that
    read through other sources) override :meth:`tiers` to list them.

    Attributes:
        tier: the name this source's own reads are counted under (:class:`ReadStats`).
        stats: this source's own reads since the last reset.
    """

    def __init__(self, tier: str):
        self.tier = tier
        self.stats = ReadStats()

    # ------------------------------------------------------------------------------------------------ the table
    @property
    @abstractmethod
    def num_rows(self) -> int:
        """Rows in the table; valid ids are ``0 .. num_rows - 1``."""

    @property
    @abstractmethod
    def dim(self) -> int:
        """Values per row (the feature width)."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The rows' dtype (what :meth:`gather` returns)."""

    @property
    @abstractmethod
    def device(self) -> rt.Device:
        """Where :meth:`gather` puts the rows: a ``torch.device`` or a sim device (:data:`gnnscale.runtime.Device`).
        On an accelerator the rows are ready for the stream that was current there when :meth:`gather` was
        called."""

    @property
    def row_bytes(self) -> int:
        """Bytes of one row: ``dim`` times the dtype's item size."""
        return self.dim * self.dtype.itemsize

    # ------------------------------------------------------------------------------------------------ reads
    checks_range = False
    """Whether :meth:`_gather` checks the ids' range itself (folded into a sync it makes anyway), so that
    :meth:`gather` need not spend one on it."""

    def gather(self, ids: Tensor, out: Tensor | None = None) -> Tensor:
        """The rows ``ids`` (``[n, dim]``, ``dtype``, on :attr:`device`), in the order asked, repeats included.

        Args:
            ids: ``[n]`` integer row ids on any device, each in ``[0, num_rows)``.
            out: ``[>= n, dim]`` buffer of ``dtype`` on :attr:`device` whose rows are contiguous; the rows are
                written to ``out[:n]``, which is returned. ``None``: a new tensor.

        Raises:
            FeatureIndexError: ``ids`` is not a 1-D integer tensor, or an id lies outside ``[0, num_rows)``.
            FeatureSourceError: ``out`` does not fit.
        """
        ids = self.as_ids(ids)
        if out is not None:
            self._check_out(out, ids.numel())
        if not self.checks_range:
            self.check_range(ids)
        return self.gather_unchecked(ids, out)

    def gather_unchecked(self, ids: Tensor, out: Tensor | None = None) -> Tensor:
        """:meth:`gather` without the checks (no reduction over the ids, hence no device sync): for wrappers that
        pass on ids they have checked or computed themselves. ``ids`` must be int64 and in range."""
        n = ids.numel()
        if n == 0:
            empty = rt.empty((0, self.dim), dtype=self.dtype, device=self.device)
            return empty if out is None else out[:0]
        got = self._gather(ids, None if out is None else out[:n])
        if out is not None and got.data_ptr() != out.data_ptr():
            out[:n].copy_(got)
            return out[:n]
        return got

    def gather_range(self, lo: int, hi: int) -> Tensor:
        """The rows ``lo .. hi - 1`` (``0 <= lo <= hi <= num_rows``) as a new ``[hi - lo, dim]`` tensor on
        :attr:`device`: a contiguous read (a table source: one bulk copy, no index), counted like :meth:`gather`.
        By default :meth:`gather_unchecked` of ``arange(lo, hi)``."""
        if not 0 <= lo <= hi <= self.num_rows:
            raise FeatureIndexError(f"{self._name()}: rows [{lo}, {hi}) lie outside [0, {self.num_rows})")
        return self.gather_unchecked(torch.arange(lo, hi))

    def view_range(self, lo: int, hi: int) -> Tensor:
        """The rows ``lo .. hi - 1`` for reading only: where the table already lies on :attr:`device`, contiguous,
        a view of it (no copy: the caller must not write to it, and it changes if the table does); otherwise
        :meth:`gather_range`'s new tensor. Counted like :meth:`gather_range`. By default :meth:`gather_range`."""
        return self.gather_range(lo, hi)

    @abstractmethod
    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        """Return the rows ``ids`` (``[n]`` int64, ``n > 0``, on any device; in range unless :attr:`checks_range`)
        on :attr:`device`, written into ``out`` (exactly ``[n, dim]``) where one is given (or returned as a new
        tensor, which the caller then copies into ``out``); count them with :meth:`_record`."""

    def _record(self, rows: int, tier: str | None = None, requests: int = 1) -> None:
        """Count ``rows`` rows served (under :attr:`tier` unless another name is given)."""
        self.stats.record(self.tier if tier is None else tier, rows, rows * self.row_bytes, requests)

    # ------------------------------------------------------------------------------------------------ routing
    # A read in two halves, so that a wrapper can fold its source's split into its own and keep one host sync per
    # read: route() computes on the device which group ("key") each id belongs to; read_sorted() reads ids already
    # sorted by key, given how many there are of each (host integers). A plain source has one key.
    @property
    def num_keys(self) -> int:
        """Groups :meth:`route` splits ids into."""
        return 1

    def route(self, ids: Tensor) -> Tensor:
        """``[n]`` int64 key in ``[0, num_keys)`` of each (in-range) id, on the ids' device; no host sync."""
        return torch.zeros_like(ids)

    def read_sorted(self, ids: Tensor, counts: list[int], out: Tensor, pos: Tensor) -> None:
        """Write the rows of ``ids`` (in range, sorted by :meth:`route`'s key; ``counts[k]`` of them have key
        ``k``, host integers) into ``out[pos]`` (``out`` on any device); no host sync of its own where the counts
        are all it needs."""
        out.index_copy_(0, pos, place(self.gather_unchecked(ids), rt.device_of(out)))

    # ------------------------------------------------------------------------------------------------ checks
    def as_ids(self, ids: Tensor) -> Tensor:
        """``ids`` as int64 once they are known to be a 1-D integer tensor (no look at the values: no sync)."""
        if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex \
                or ids.dtype == torch.bool:
            what = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
            raise FeatureIndexError(f"{self._name()}: row ids must be a 1-D integer tensor, got {what}")
        return ids.long()

    def check_range(self, ids: Tensor) -> None:
        """Raise :class:`FeatureIndexError` unless every id lies in ``[0, num_rows)`` (one host sync)."""
        if ids.numel():
            lo, hi = host_values(torch.stack(list(torch.aminmax(ids))), rt.device_of(ids))
            if lo < 0 or hi >= self.num_rows:
                self.range_error(ids)

    def range_error(self, ids: Tensor) -> None:
        """Raise the :class:`FeatureIndexError` naming (up to five of) the ids outside ``[0, num_rows)``."""
        bad = ids[(ids < 0) | (ids >= self.num_rows)][:5].tolist()
        raise FeatureIndexError(f"{self._name()}: row ids {bad} lie outside [0, {self.num_rows}) "
                                f"(the table has {self.num_rows} rows)")

    def check_ids(self, ids: Tensor) -> Tensor:
        """``ids`` as int64 once they are known to be a 1-D integer tensor within ``[0, num_rows)``."""
        ids = self.as_ids(ids)
        self.check_range(ids)
        return ids

    def _check_out(self, out: Tensor, n: int) -> None:
        want = f"[>= {n}, {self.dim}] {self.dtype} on {self.device}"
        if (out.dim() != 2 or out.shape[0] < n or out.shape[1] != self.dim or out.dtype != self.dtype
                or rt.device_of(out) != self.device):
            raise FeatureSourceError(f"{self._name()}: out must be {want}, got {tuple(out.shape)} {out.dtype} on "
                                     f"{rt.device_of(out)}")
        if out.shape[1] > 1 and out.stride(1) != 1:
            raise FeatureSourceError(f"{self._name()}: out's rows must be contiguous (stride 1 along dim 1)")

    def _name(self) -> str:
        return f"{type(self).__name__} ({self.tier})"

    # ------------------------------------------------------------------------------------------------ counters
    def tiers(self) -> list[FeatureSource]:
        """The sources that serve this source's reads, this one for a plain source; a wrapper lists the sources
        it reads through (its cache, then its fallback's tiers)."""
        return [self]

    def read_stats(self) -> ReadStats:
        """Reads served by every tier of this source since the last reset, per tier name."""
        total = ReadStats()
        for s in self.tiers():
            total = total + s.stats
        return total

    def reset_stats(self) -> ReadStats:
        """Return :meth:`read_stats` and start every tier's counters anew."""
        total = self.read_stats()
        for s in self.tiers():
            s.stats = ReadStats()
        return total

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(tier={self.tier!r}, rows={self.num_rows}, dim={self.dim}, "
                f"dtype={self.dtype}, device={self.device})")


class TableSource(FeatureSource):
    """A source whose rows are one ``[num_rows, dim]`` tensor on :attr:`device`, read by one index."""

    def __init__(self, table: Tensor, tier: str):
        super().__init__(tier)
        if table.dim() != 2:
            raise FeatureSourceError(f"a feature table must be [rows, dim], got shape {tuple(table.shape)}")
        self.table = table
        self._table_device = rt.device_of(table)

    @property
    def num_rows(self) -> int:
        return int(self.table.shape[0])

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def device(self) -> rt.Device:
        return self._table_device

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        ids = place(ids, self.device)
        got = self.table.index_select(0, ids) if out is None else torch.index_select(self.table, 0, ids, out=out)
        self._record(ids.numel())
        return got

    def gather_range(self, lo: int, hi: int) -> Tensor:
        if not 0 <= lo <= hi <= self.num_rows:
            raise FeatureIndexError(f"{self._name()}: rows [{lo}, {hi}) lie outside [0, {self.num_rows})")
        got = self._copy_range(self.table[lo:hi])
        self._record(hi - lo)
        return got

    def view_range(self, lo: int, hi: int) -> Tensor:
        if self._table_device != self.device:  # read onto another device: a copy
            return self.gather_range(lo, hi)
        if not 0 <= lo <= hi <= self.num_rows:
            raise FeatureIndexError(f"{self._name()}: rows [{lo}, {hi}) lie outside [0, {self.num_rows})")
        self._record(hi - lo)
        return self.table[lo:hi]

    def _copy_range(self, part: Tensor) -> Tensor:
        """``part`` (a slice of the table) as a new tensor on :attr:`device`."""
        return part.clone()
