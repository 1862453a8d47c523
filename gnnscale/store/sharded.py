"""The device tier of XGNN's global memory store as a feature source: hot rows spread over several devices.

Row ``r`` of this source (a vertex's *hotness rank*, ``r < num_rows``) belongs to logical partition ``r % G`` at
local row ``r // G`` (XGNN §4.3's "modulo and division"); the reading device reads partition ``p`` from the device
``read_from[p]`` (itself, or a linked device storing a copy: the placement's row for this device,
:func:`~gnnscale.store.placement.solve_placement`), where it is ``shards[read_from[p]][p]``. A read is ordered by
holder (ascending device index, its partitions in turn) and answered with one request to each holder: the local
rows are sent there once and the rows come back once (:class:`~gnnscale.store.transfer.PeerLink`: two stream
waits per request to another device, no host sync). :class:`~gnnscale.store.global_store.GlobalMemoryStore` puts
one of these in a :class:`~gnnscale.store.cache.DeviceCache` in front of host memory for each reading device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.store.features import FeatureIndexError, FeatureSource
from gnnscale.store.placement import HOST
from gnnscale.store.transfer import PeerLink, host_values, place

__all__ = ["ShardedDeviceSource"]


class ShardedDeviceSource(FeatureSource):
    """One device's view of rows partitioned by rank modulo ``G`` over ``G`` devices (module docstring).

    Args:
        shards: ``shards[h][p]``: the ``[rows of p, dim]`` copy of partition ``p`` stored on device ``h``; looked
            up at every read (a holder's copy may be replaced, as the tests do to poison the copies a reader must
            not touch).
        devices: the ``G`` devices (``shards[h]`` lives on ``devices[h]``).
        read_from: ``[G]``: the device this reader reads each partition from, or
            :data:`~gnnscale.store.placement.HOST` for a partition it does not read from a device (asking for a row
            of one is an error).
        device: where the rows go (the reading device).
        num_rows: rows held (the hot count: ranks ``0 .. num_rows - 1``).
        dim, dtype: of the rows.
        prefix: tier names are ``f"{prefix}{h}"`` per holder ``h``.
        links: the reader's :class:`~gnnscale.store.transfer.PeerLink` to each holder it reads from; ``None``:
            new ones.
    """

    def __init__(self, shards: Sequence[Mapping[int, Tensor]], devices: Sequence[rt.Device],
                 read_from: Sequence[int], device: rt.Device, num_rows: int, dim: int,
                 dtype: torch.dtype = torch.float32, *, prefix: str = "device",
                 links: Mapping[int, PeerLink] | None = None):
        super().__init__(f"{prefix}*")
        self.shards, self.devices, self.read_from = shards, list(devices), list(read_from)
        self._device, self._num_rows, self._dim, self._dtype = device, num_rows, dim, dtype
        self.prefix = prefix
        self.holders = sorted({s for s in self.read_from if s != HOST})
        """Devices this reader reads from, ascending."""
        host_slot = len(self.holders)
        slot = [host_slot if s == HOST else self.holders.index(s) for s in self.read_from]
        self.slot_of_part = torch.tensor(slot, dtype=torch.int64, device=rt.torch_device(device))  # [G] per partition
        self.links: dict[int, PeerLink] = {h: (links[h] if links is not None else PeerLink(device, self.devices[h]))
                                           for h in self.holders}
        """How this reader reaches each holder."""

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> rt.Device:
        return self._device

    def tier_of(self, holder: int) -> str:
        """The tier name reads from device ``holder`` are counted under."""
        return f"{self.prefix}{holder}"

    @property
    def num_keys(self) -> int:
        return (len(self.holders) + 1) * len(self.read_from)

    def route(self, ids: Tensor) -> Tensor:
        """Key ``holder slot * G + partition`` of each row (the last ``G`` keys: partitions read from host memory,
        which this source does not serve)."""
        part = ids % len(self.read_from)  # [n]
        return self.slot_of_part.to(ids.device)[part] * len(self.read_from) + part

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        dev = self._device
        ids = place(ids, dev)
        key = self.route(ids)  # [n]
        order = torch.sort(key * self._num_rows + ids).indices  # [n] by holder, partition, row
        counts = host_values(torch.zeros(self.num_keys, dtype=torch.int64, device=rt.torch_device(dev)).index_add_(
            0, key, torch.ones_like(key)), dev)  # the one sync of a read (bincount would sync to size itself)
        if out is None:
            out = rt.empty((ids.numel(), self._dim), dtype=self._dtype, device=dev)
        self.read_sorted(ids[order], counts, out, order)
        return out

    def read_sorted(self, ids: Tensor, counts: list[int], out: Tensor, pos: Tensor) -> None:
        G = len(self.read_from)
        host = counts[len(self.holders) * G :]
        if sum(host):
            bad = [p for p in range(G) if host[p]]
            raise FeatureIndexError(f"{self._name()}: rows of partitions {bad} are not read from a device here")
        local = ids // G  # [n] row within its partition
        lo = 0
        for s, holder in enumerate(self.holders):
            parts = [(p, counts[s * G + p]) for p in range(G) if counts[s * G + p]]
            hi = lo + sum(c for _, c in parts)
            if hi == lo:
                continue
            shards = self.shards[holder]
            runs = [(partial(_rows_of, shards[p]), c) for p, c in parts]
            rows = self.links[holder].ask(local[lo:hi], runs, self._dim, self._dtype)  # one request, one answer
            out.index_copy_(0, pos[lo:hi], rows)
            self._record(hi - lo, tier=self.tier_of(holder))
            lo = hi


def _rows_of(shard: Tensor, at: Tensor, out: Tensor) -> None:
    torch.index_select(shard, 0, at, out=out)
