"""A cache tier in front of a fallback source (DGL GraphBolt's ``GPUCachedFeature(fallback)``), itself a
:class:`~gnnscale.store.features.FeatureSource`, so tiers stack: a device cache over a host cache over a
memory-mapped file, each counting the rows it served.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.store.features import FeatureSource, FeatureSourceError
from gnnscale.store.sources import DeviceSource
from gnnscale.store.transfer import as_device, host_values, place

__all__ = ["DeviceCache", "SortedIndex"]


class SortedIndex:
    """Cache slots of row ids by binary search over the cached ids (``8`` bytes per cached row on the device,
    none per row of the table, which may be far bigger than the cache): ``slot = position in hot_ids`` or -1.

    Args:
        hot_ids: ``[H]`` distinct cached row ids, ascending.
        device: where lookups run (the cache's device).
    """

    def __init__(self, hot_ids: Tensor, device: rt.Device):
        self.hot = place(hot_ids, device)  # [H]

    def __call__(self, ids: Tensor) -> Tensor:
        if self.hot.numel() == 0:
            return torch.full_like(ids, -1)
        pos = torch.searchsorted(self.hot, ids).clamp_(max=self.hot.numel() - 1)  # [n]
        return torch.where(self.hot[pos] == ids, pos, -1)


class DeviceCache(FeatureSource):
    """Rows of ``fallback``, the hot ones served from ``cache``, the rest from ``fallback``.

    A read looks every id up (``lookup``), then asks the cache for the hits and the fallback for the misses, each
    once and in ascending id order (sequential reads for a host or disk fallback), and puts the rows back in the
    order asked. The wrapper serves nothing itself: its counters are its tiers' (:meth:`tiers`: the cache's, then
    the fallback's), so they say how many rows each tier served. Host syncs per read: one, which also checks the
    ids' range; the cache's own split (:meth:`~gnnscale.store.features.FeatureSource.route`, e.g. by holder
    device) is folded into it (the fallback may sync on its own). On an accelerator every step runs on the stream
    current there when :meth:`gather` is called, and the rows are ready for that stream; misses go to the fallback
    as ids on this device when the fallback's rows go to this device too (a host fallback gets host ids).

    Args:
        fallback: the whole table (it defines ``num_rows``, ``dim``, ``dtype``); serves every miss.
        cache: the cached rows, any source of the same ``dim`` and ``dtype`` (typically a
            :class:`~gnnscale.store.sources.DeviceSource`); cache row ``s`` holds the row whose slot is ``s``.
        lookup: ``[n]`` int64 ids on :attr:`device` -> ``[n]`` int64 cache slots, -1 for a miss.
        device: where the rows go; ``None``: the cache's device.

    :meth:`of` builds the usual one: given hot ids copied from the fallback onto a device.
    """

    def __init__(self, fallback: FeatureSource, cache: FeatureSource, lookup: Callable[[Tensor], Tensor], *,
                 device: rt.Device | str | None = None, tier: str = "cache"):
        super().__init__(tier)
        if (cache.dim, cache.dtype) != (fallback.dim, fallback.dtype):
            raise FeatureSourceError(f"a cache of [{cache.dim}] {cache.dtype} rows cannot stand in front of "
                                     f"[{fallback.dim}] {fallback.dtype} rows")
        self.fallback, self.cache, self.lookup = fallback, cache, lookup
        self._device = cache.device if device is None else as_device(device)

    @classmethod
    def of(cls, fallback: FeatureSource, hot_ids: Tensor, device: rt.Device | str, *,
           tier: str = "cache") -> DeviceCache:
        """A cache of the rows ``hot_ids`` (any order, repeats ignored) of ``fallback`` on ``device``.

        The rows are read once through ``fallback`` (counted there: reset the counters after building to count
        only what follows) and kept in a :class:`~gnnscale.store.sources.DeviceSource` named ``tier``.
        """
        hot = torch.unique(place(fallback.check_ids(hot_ids), torch.device("cpu")))  # [H] ascending
        rows = fallback.gather_unchecked(hot)  # [H, dim]
        dev = as_device(device)
        return cls(fallback, DeviceSource(rows, dev, tier=tier), SortedIndex(hot, dev), device=dev, tier=tier)

    @property
    def num_rows(self) -> int:
        return self.fallback.num_rows

    @property
    def dim(self) -> int:
        return self.fallback.dim

    @property
    def dtype(self) -> torch.dtype:
        return self.fallback.dtype

    @property
    def device(self) -> rt.Device:
        return self._device

    def tiers(self) -> list[FeatureSource]:
        return [*self.cache.tiers(), *self.fallback.tiers()]

    checks_range = True  # folded into the read's one sync

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        dev, N, K = self._device, self.num_rows, self.cache.num_keys
        ids = place(ids, dev)
        n = ids.numel()
        if N == 0:
            self.range_error(ids)
        safe = ids.clamp(0, N - 1)  # [n] (an id out of range is reported after the sync, never looked up)
        slot = self.lookup(safe)  # [n] cache row, -1 for a miss
        hit = slot >= 0
        slot = slot.clamp(min=0)
        key = torch.where(hit, self.cache.route(slot), K)  # [n] the cache's keys, then K for the fallback
        # [n] by key, then id: the rows of a batch's new vertices come in ascending ids, so the writes into
        # ``out`` are mostly sequential (by cache slot they scatter: 2-3x slower on the CPU), and the fallback
        # reads its rows in ascending order (sequential reads from host memory or disk)
        order = torch.sort(key * N + safe).indices
        counts = torch.zeros(K + 2, dtype=torch.int64, device=rt.torch_device(dev)).index_add_(
            0, key, torch.ones_like(key))
        counts[K + 1] = (ids != safe).sum()
        got = host_values(counts, dev)  # the one sync of a read: rows per key, and how many ids were out of range
        if got[K + 1]:
            self.range_error(ids)
        n_hit = n - got[K]
        if out is None:
            out = rt.empty((n, self.dim), dtype=self.dtype, device=dev)
        if n_hit:
            pos = order[:n_hit]
            self.cache.read_sorted(slot[pos], got[:K], out, pos)
        if n_hit < n:
            pos = order[n_hit:]  # ascending ids: sequential reads from a host or disk fallback
            miss = safe[pos]
            if self.fallback.device == dev:
                miss = rt.adopt(miss, dev)  # computed on this device (a sim device counts it there)
            out.index_copy_(0, pos, place(self.fallback.gather_unchecked(miss), dev))
        return out
