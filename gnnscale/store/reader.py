"""One device's reader of XGNN's global memory store (:class:`StoreReader`): feature rows through a chain of
feature sources, neighbour lists by a two-phase request routed over the devices and host memory.

Features: each reader reads through its own :class:`~gnnscale.store.cache.DeviceCache` whose cache is the store's
device tier as this reader reaches it (:class:`~gnnscale.store.sharded.ShardedDeviceSource`: every logical
partition from where the placement says) and whose fallback is host memory
(:class:`~gnnscale.store.sources.PinnedHostSource`, read through the reader's :meth:`StoreReader.host_rows`). The
sources' per-tier counters become the reader's :class:`~gnnscale.store.stats.StoreStats`.

Topology: a request is routed on the reader's device (the rank directory), ordered by source -- each holder
device, then host memory -- and by vertex id within a source, and answered with one read per source.

Streams: a reader works on the stream current on its device when it is called (the trainer's sampling stream, say;
``None`` on the CPU), and what it returns is ready for that stream. A request to another device goes through the
reader's :class:`~gnnscale.store.transfer.PeerLink` to it (two stream waits, one on each device; no host sync). A
read from host memory on an accelerator goes through the reader's
:class:`~gnnscale.store.gather.HostRowReader`: one sync to read the row ids on the host, and one before its
staging buffer is reused (from the reader's second host read on). Each of :meth:`StoreReader.features`,
:meth:`StoreReader.request` and :meth:`_StoreRequest.take` makes one more sync of its own (the per-source
counts). On the CPU the host reads are plain indexing, and only those per-source syncs are counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.graph.csr import csr_rows
from gnnscale.sample.neighbor import NeighborRequest, full_lists
from gnnscale.store.cache import DeviceCache
from gnnscale.store.features import FeatureSource
from gnnscale.store.gather import HostRowReader
from gnnscale.store.placement import HOST, Placement
from gnnscale.store.sharded import ShardedDeviceSource
from gnnscale.store.sources import PinnedHostSource
from gnnscale.store.stats import StoreStats
from gnnscale.store.transfer import host_values, place

__all__ = ["StoreReader", "StoreTables"]


class StoreTables(Protocol):
    """What a reader reads: the tables of a :class:`~gnnscale.store.global_store.GlobalMemoryStore`."""

    devices: list[rt.Device]
    num_nodes: int
    feature_width: int
    hot_graph: int
    hot_features: int
    gather: str
    """Host-row path on CUDA: ``uva`` or ``index_select``."""
    placement: Placement
    directory: dict[rt.Device, Tensor]
    """The rank of every vertex, on each device."""
    dev_x: list[dict[int, Tensor]]
    """``dev_x[h][p]``: device ``h``'s copy of partition ``p``'s hot feature rows."""
    dev_csr: list[dict[int, tuple[Tensor, Tensor, Tensor | None]]]
    host_x: Tensor
    host_source: FeatureSource | None
    """The host tier's rows when they are not ``host_x`` (the disk tier behind its host cache)."""
    host_csr: tuple[Tensor, Tensor, Tensor | None]


@dataclass(eq=False)
class _Route:
    """A request's rows ordered by source: each holder (ascending device index, its partitions in turn), then host
    memory; ascending vertex id within each. ``segments`` lists ``(source, partition, rows, key)`` in that order
    (partition ``-1`` for host memory; ``key`` indexes ``bounds``)."""

    order: Tensor  # [n] request row at each sorted position
    ids: Tensor  # [n] vertex ids, sorted
    local: Tensor  # [n] row within the vertex's logical partition, sorted
    segments: list[tuple[int, int, int, int]]  # (source, partition, rows, key) of each non-empty segment
    bounds: Tensor  # [K + 1] row offset of every key's segment (empty ones included), on the reader's device


class StoreReader:
    """One device's view of a :class:`~gnnscale.store.global_store.GlobalMemoryStore`: routes on that device,
    reads every logical partition from where the placement's row for this device says, and counts its own reads
    (:attr:`stats`). Readers of different devices can run in different threads.

    Attributes:
        feature_source: this reader's feature rows as one :class:`~gnnscale.store.features.FeatureSource`: the
            store's device tier as this device reaches it, cached in front of host memory.
    """

    def __init__(self, store: StoreTables, index: int):
        self.store, self.index, self.device = store, index, store.devices[index]
        G = len(store.devices)
        source = store.placement.source[index]
        self.holders = sorted({s for s in source if s != HOST})
        self.host_slot = len(self.holders)
        slot = [self.host_slot if s == HOST else self.holders.index(s) for s in source]
        self.slot_of_part = torch.tensor(slot, dtype=torch.int64, device=rt.torch_device(self.device))  # [G]
        self.rank = store.directory[self.device]
        self.stats = StoreStats()
        self._host = HostRowReader(self.device, "index_select")  # one staging buffer for every host table
        self._num_keys = (self.host_slot + 1) * G
        x = store.host_x
        hot = ShardedDeviceSource(store.dev_x, store.devices, source, self.device, store.hot_features,
                                  store.feature_width, x.dtype)
        self.links = hot.links  # topology requests to a holder go the same way as feature requests
        host: FeatureSource = (PinnedHostSource(x, self.device, method="index_select", pin=False, reader=self,
                                                tier="host")
                               if store.host_source is None else store.host_source)
        self.feature_source: FeatureSource = DeviceCache(host, hot, self._hot_slots, device=self.device,
                                                         tier="devices")
        self._tier_source = {**{t.tier: HOST for t in host.tiers()}, **{hot.tier_of(h): h for h in self.holders}}

    # ------------------------------------------------------------------------------------------------ routing
    def _route(self, ids: Tensor, hot: int) -> _Route:
        store, G = self.store, len(self.store.devices)
        ids = place(ids, self.device).long()
        r = self.rank[ids]  # [n]
        part, local = r % G, r // G
        on = r < hot
        slot = torch.where(on, self.slot_of_part[part], self.host_slot)
        seg = slot * G + torch.where(slot == self.host_slot, 0, part)  # [n] (source slot, partition)
        order = torch.sort(seg * store.num_nodes + ids).indices  # [n]
        dev = rt.torch_device(self.device)
        counts = torch.zeros(self._num_keys, dtype=torch.int64, device=dev).index_add_(
            0, seg, torch.ones_like(seg))  # [slots * G] (bincount would sync on CUDA to find the largest key)
        bounds = torch.zeros(self._num_keys + 1, dtype=torch.int64, device=dev)
        torch.cumsum(counts, 0, out=bounds[1:])
        segments: list[tuple[int, int, int, int]] = []
        for key, c in enumerate(host_values(counts, self.device)):  # the one sync of a route
            if c:
                s, p = divmod(key, G)
                segments.append((HOST, -1, c, key) if s == self.host_slot else (self.holders[s], p, c, key))
        return _Route(order, ids[order], local[order], segments, bounds)

    def _by_holder(self, route: _Route) -> list[tuple[int, list[tuple[int, int, int]], int, int]]:
        """``(source, [(partition, rows, key)], lo, hi)`` per source, rows ``[lo, hi)`` of the sorted order."""
        out: list[tuple[int, list[tuple[int, int, int]], int, int]] = []
        lo = 0
        for src, p, c, key in route.segments:
            if out and out[-1][0] == src:
                out[-1][1].append((p, c, key))
                out[-1] = (src, out[-1][1], out[-1][2], lo + c)
            else:
                out.append((src, [(p, c, key)], lo, lo + c))
            lo += c
        return out

    def _remote(self, src: int, idx: Tensor, parts: list[tuple[int, int]], width: int,
                read: Callable[[int, Tensor, Tensor], None]) -> Tensor:
        """One request to device ``src``: positions ``idx`` (``parts``: consecutive ``(partition, count)`` runs)
        answered there by ``read(partition, positions, out)`` into ``[count, width]`` int64 rows, the answers
        returned on this reader's device, ready for its stream (one transfer each way,
        :class:`~gnnscale.store.transfer.PeerLink`)."""
        runs = [(partial(read, p), c) for p, c in parts]
        got = self.links[src].ask(idx, runs, width, torch.int64)
        if src != self.index:
            self.stats.remote_requests += 1
        return got

    # ------------------------------------------------------------------------------------------------ host reads
    def host_rows(self, host: Tensor, rows: Tensor) -> Tensor:
        """``host[rows]`` (``[R, w]`` host table, ``rows`` ascending, computed on this device) on this device: an
        index on the CPU; on an accelerator the UVA gather (CUDA), or a CPU gather into the reader's reused staging
        buffer and a copy (:class:`~gnnscale.store.gather.HostRowReader`, one buffer for every table)."""
        allocs = self._host.staging_allocs
        rows = rt.adopt(rows, self.device)  # computed on this reader's device (a sim device counts it there)
        got = self._host.read(host, rows, self.store.gather)
        self.stats.staging_allocs += self._host.staging_allocs - allocs
        return got

    # ------------------------------------------------------------------------------------------------ features
    def _hot_slots(self, ids: Tensor) -> Tensor:
        """``[n]`` the rank of each id where its row is read from a device, else -1 (read from host memory)."""
        r = self.rank[ids]  # [n]
        on = (r < self.store.hot_features) & (self.slot_of_part[r % len(self.store.devices)] != self.host_slot)
        return torch.where(on, r, -1)

    def features(self, ids: Tensor) -> Tensor:
        """``[n, F]`` feature rows of ``ids`` (repeats allowed) on this reader's device, read through
        :attr:`feature_source`; its tiers' counts are added to :attr:`stats`.

        Raises:
            FeatureIndexError: an id is not a vertex of the graph.
        """
        src = self.feature_source
        before = src.read_stats()
        out = src.gather(ids)
        read, st = src.read_stats() - before, self.stats
        for tier, rows in read.rows.items():
            holder = self._tier_source[tier]
            st.rows_from[holder] += rows
            if holder == HOST:
                st.h2d_feature_bytes += read.bytes[tier]
                if tier == "host-cache":
                    st.host_cache_hits += rows
                elif tier == "disk":
                    st.disk_rows += rows
                    st.disk_read_bytes += read.bytes[tier]
                continue
            st.feature_hits += rows
            if holder != self.index:
                st.d2d_bytes += read.bytes[tier]
                st.remote_requests += read.requests[tier]
        st.feature_requests += out.shape[0]
        return out

    # ------------------------------------------------------------------------------------------------ topology
    def request(self, ids: Tensor) -> NeighborRequest:
        """Open a neighbour request for ``ids`` (distinct): routes them and reads their degrees."""
        return _StoreRequest(self, ids)

    def num_neighbors(self, ids: Tensor) -> Tensor:
        return self.request(ids).degrees

    def neighbors(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        return full_lists(self.request(ids))


class _StoreRequest:
    """:class:`~gnnscale.sample.NeighborRequest` of a :class:`StoreReader`: the route and each list's start in its
    source's entry table are kept for :meth:`take`."""

    def __init__(self, reader: StoreReader, ids: Tensor):
        self.reader = reader
        store, st, dev = reader.store, reader.stats, reader.device
        self.route = route = reader._route(ids, store.hot_graph)
        n = route.order.numel()
        start, deg = rt.empty((n,), dtype=torch.int64, device=dev), rt.empty((n,), dtype=torch.int64, device=dev)
        self.sources = reader._by_holder(route)
        for src, parts, lo, hi in self.sources:
            if src == HOST:
                ptr = store.host_csr[0]
                v = route.ids[lo:hi]
                s, e = reader.host_rows(ptr, v).view(-1), reader.host_rows(ptr, v + 1).view(-1)
                st.h2d_topology_bytes += (hi - lo) * 16
            else:
                csrs = store.dev_csr[src]

                def bounds(p: int, i: Tensor, o: Tensor,
                           csrs: dict[int, tuple[Tensor, Tensor, Tensor | None]] = csrs) -> None:
                    ptr = csrs[p][0]
                    torch.stack([ptr[i], ptr[i + 1]], 1, out=o)  # [c, 2] start and end of each list

                se = reader._remote(src, route.local[lo:hi], [(p, c) for p, c, _ in parts], 2, bounds)
                s, e = se[:, 0], se[:, 1]
                st.graph_hits += hi - lo
                if src != reader.index:
                    st.d2d_bytes += (hi - lo) * 16
            st.lists_from[src] += hi - lo
            start[lo:hi], deg[lo:hi] = s, e - s
        st.graph_requests += n
        self.start = start  # [n] in sorted order
        self.degrees = torch.empty_like(deg).index_copy_(0, route.order, deg)  # [n] in request order

    def take(self, indptr: Tensor, pos: Tensor) -> tuple[Tensor, Tensor | None]:
        reader, route = self.reader, self.route
        store, st, dev = reader.store, reader.stats, reader.device
        indptr, pos = place(indptr, dev), place(pos, dev)
        E = pos.numel()
        tdev = rt.torch_device(dev)
        # the picked entries regrouped by source, in the route's row order (so host positions come ascending)
        take = indptr[1:] - indptr[:-1]  # [n]
        counts = take[route.order]  # [n]
        ptr_s = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=tdev)
        torch.cumsum(counts, 0, out=ptr_s[1:])
        rows_s = csr_rows(ptr_s, E)  # [E] sorted row of each entry
        epos = indptr[route.order][rows_s] + (torch.arange(E, device=tdev) - ptr_s[rows_s])  # [E] request entry
        q = self.start[rows_s] + pos[epos]  # [E] position in the source's entry table
        ebounds = host_values(ptr_s[route.bounds], dev)  # entry offset of every key's segment: the one sync of a take
        weighted = store.host_csr[2] is not None
        out = rt.empty((E,), dtype=torch.int64, device=dev)
        out_w = rt.empty((E,), device=dev) if weighted else None
        entry_bytes = 8 + (4 if weighted else 0)
        for src, parts, _, _ in self.sources:
            a, b = ebounds[parts[0][2]], ebounds[parts[-1][2] + 1]  # a source's segments are consecutive keys
            if a == b:
                continue
            if src == HOST:
                idx = reader.host_rows(store.host_csr[1], q[a:b]).view(-1)
                w = None if out_w is None else reader.host_rows(store.host_csr[2], q[a:b]).view(-1)  # type: ignore[arg-type]
                st.h2d_topology_bytes += (b - a) * entry_bytes
            else:
                csrs = store.dev_csr[src]
                sized = [(p, ebounds[key + 1] - ebounds[key]) for p, _, key in parts]

                def entries(p: int, i: Tensor, o: Tensor,
                            csrs: dict[int, tuple[Tensor, Tensor, Tensor | None]] = csrs) -> None:
                    _, ind, wt = csrs[p]
                    o[:, 0] = ind[i]  # weights travel in the same answer, their bits in a second column
                    if wt is not None:
                        o[:, 1] = wt[i].view(torch.int32).long()

                both = reader._remote(src, q[a:b], sized, 2 if weighted else 1, entries)
                idx = both[:, 0]
                w = None if out_w is None else both[:, 1].int().view(torch.float32)
                if src != reader.index:
                    st.d2d_bytes += (b - a) * entry_bytes
            st.entries_from[src] += b - a
            out.index_copy_(0, epos[a:b], idx)
            if out_w is not None and w is not None:
                out_w.index_copy_(0, epos[a:b], w)
        st.fetched_neighbor_entries += E
        return out, out_w
