"""XGNN's global GNN memory store (§4): one address space for topology and features over the GPUs and host memory.

Vertices are ranked by *hotness* (out-degree by default: an in-neighbour sampler reaches a vertex once per
out-edge; or access counts from a pre-sampling pass). The hottest ``gpu_graph_ratio`` of the vertices keep their
in-neighbour lists, and the hottest ``gpu_feature_ratio`` their feature rows, on the GPUs, split by rank modulo
the number of GPUs (§4.3: logical partition ``p`` holds ranks ``r`` with ``r % G == p``, at local row ``r // G``);
everything else stays in host memory (page-locked in place on CUDA, :mod:`gnnscale.store.pinning`), which GPUs
read directly (the UVA gather of :mod:`gnnscale.store.gather`) or through a CPU gather into a reused pinned
buffer and an asynchronous copy. Which device stores which logical partition, and where each device reads each
partition from (itself, a linked device, or host memory), is the placement solver's plan
(:func:`gnnscale.store.placement.solve_placement`, §4.2) for the devices' link matrix.

Each device reads through its own :class:`StoreReader` (one per trainer, :meth:`GlobalMemoryStore.reader`), which
follows its row of the placement. A request is routed *on the reader's device* (XGNN's "modulo and division": a
rank directory held on every device), ordered by source -- each holder device, then host memory -- and by vertex id
within a source, and answered with one read per source: one request to each remote holder, one sorted gather from
host memory. Topology requests are two-phase (:class:`~gnnscale.sample.NeighborRequest`): the degrees of a
frontier, then only the entries the sampler picked. Host syncs per request are a constant: one for the per-source
counts, one for the entry counts of a topology read, none per vertex, partition or holder.

Every read is counted per reader and per source (:class:`StoreStats`), in bytes too, on CPU "devices" as on GPUs,
so tests can check that each row came from the tier the placement says. With ``devices`` on the CPU the same code
runs with "GPU" partitions in ordinary memory (the tests do this).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, sampling_csr
from gnnscale.graph.graph import Graph, csr_rows, csr_slices
from gnnscale.sample.neighbor import NeighborRequest, full_lists
from gnnscale.store.gather import default_gather_method, gather_rows
from gnnscale.store.pinning import PinnedRegion, pinned_host
from gnnscale.store.placement import HOST, Placement, solve_placement
from gnnscale.units import format_bytes


def default_links(devices: list[torch.device]) -> list[list[float]]:
    """Link matrix of ``devices``: CUDA peer access (1 where a device reads another's memory directly); CPU test
    devices share one memory, so they count as fully linked."""
    G = len(devices)
    if devices[0].type != "cuda":
        return [[0.0 if i == j else 1.0 for j in range(G)] for i in range(G)]
    return [[0.0 if i == j or devices[i] == devices[j] or not torch.cuda.can_device_access_peer(devices[i], devices[j])
             else 1.0 for j in range(G)] for i in range(G)]


@dataclass
class StoreStats:
    """Request counters of one reader (or summed over readers) since the last reset.

    ``*_from`` map a source -- a device index, or :data:`~gnnscale.store.placement.HOST` (-1) for host memory --
    to what was read from it: feature rows, neighbour lists (degree lookups) and neighbour entries.
    """

    graph_requests: int = 0
    """Vertices whose neighbour lists were looked up."""
    graph_hits: int = 0
    """Of those, lists held on a device (the reader's own or a linked one)."""
    fetched_neighbor_entries: int = 0
    """Neighbour entries read, every source together (the sampler reads only the entries it keeps)."""
    feature_requests: int = 0
    feature_hits: int = 0
    h2d_feature_bytes: int = 0
    """Feature bytes read from host memory."""
    h2d_topology_bytes: int = 0
    """Topology bytes read from host memory: two row pointers per list, then the entries (and weights)."""
    d2d_bytes: int = 0
    """Bytes read from another device: feature rows, row pointers, entries."""
    remote_requests: int = 0
    """Reads sent to another device (one per holder per request)."""
    staging_allocs: int = 0
    """Pinned staging buffers allocated (the CPU-gather path on CUDA; reused, so this stays small)."""
    rows_from: Counter[int] = field(default_factory=Counter)
    lists_from: Counter[int] = field(default_factory=Counter)
    entries_from: Counter[int] = field(default_factory=Counter)

    @property
    def h2d_bytes(self) -> int:
        return self.h2d_feature_bytes + self.h2d_topology_bytes

    def hit_rates(self) -> dict[str, float]:
        return {"graph_hit_rate": self.graph_hits / max(self.graph_requests, 1),
                "feature_hit_rate": self.feature_hits / max(self.feature_requests, 1)}

    def __add__(self, other: StoreStats) -> StoreStats:
        return StoreStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def metrics(self) -> dict[str, float]:
        """The counters a training record carries."""
        return {"fetched_neighbor_entries": self.fetched_neighbor_entries, "h2d_bytes": self.h2d_bytes,
                "h2d_feature_bytes": self.h2d_feature_bytes, "h2d_topology_bytes": self.h2d_topology_bytes,
                "d2d_bytes": self.d2d_bytes, **self.hit_rates()}


class GlobalMemoryStore:
    """Topology and features of ``graph`` over ``devices`` and host memory, hottest on the devices (XGNN GGMS).

    Args:
        graph: the graph; its features become ``float32``.
        devices: the "GPUs" (CUDA devices, or CPU devices for testing); one logical partition each.
        adjacency: the model's adjacency: the store serves what a sampler for it draws from
            (:func:`~gnnscale.graph.block.sampling_csr`: raw weights for GCN, no self-loops when the layers add
            them; :class:`~gnnscale.sample.SampledAdjacency` adds and normalises them per block).
        gpu_graph_ratio: fraction of the vertices (the hottest) whose in-neighbour lists live on the devices;
            ``None``: as many as ``memory_budget`` holds (topology first, XGNN §4.3: its reads are random and
            small, where a feature row is one sequential read).
        gpu_feature_ratio: fraction of the vertices (the hottest) whose feature rows live on the devices;
            ``None``: as many as the budget left after the topology holds.
        hotness: ``[N]`` scores (higher = hotter), or ``None`` for out-degree.
        memory_budget: bytes each device may hold for its share (rank directory included); ``None``: no check.
        gather: host-row path on CUDA: ``uva``, ``index_select`` or ``auto``.
        links: ``[G, G]`` link bandwidths between the devices for the placement solver (0 = no link); ``None``:
            :func:`default_links`.
    """

    def __init__(self, graph: Graph, devices: list[torch.device], *, adjacency: AdjacencySpec | None = None,
                 gpu_graph_ratio: float | None = 0.0, gpu_feature_ratio: float | None = 0.0,
                 hotness: Tensor | None = None,
                 memory_budget: int | None = None, gather: str = "auto", links: object | None = None):
        for name, ratio in (("--gpu-graph-ratio", gpu_graph_ratio), ("--gpu-feature-ratio", gpu_feature_ratio)):
            if ratio is not None and not 0.0 <= ratio <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {ratio}")
        if not devices:
            raise ConfigError("the memory store needs at least one device")
        if graph.x is None:
            raise ConfigError(f"graph {graph.name} has no features to store")
        n = graph.num_nodes
        self.devices, self.num_nodes = list(devices), n
        G = len(self.devices)
        scores = graph.out_degree().double() if hotness is None else hotness.double()
        if scores.shape != (n,):
            raise ConfigError(f"hotness must have one score per vertex ({n}), got shape {tuple(scores.shape)}")
        order = torch.sort(-scores, stable=True).indices  # rank -> vertex, hottest first (ties: lower id)
        self.rank = torch.empty(n, dtype=torch.int64)
        self.rank[order] = torch.arange(n)
        indptr, indices, weight = sampling_csr(graph, adjacency or AdjacencySpec())[:3]
        x = graph.x.float()
        self.feature_width = x.shape[1]
        cuda = self.devices[0].type == "cuda"
        self.gather = gather if cuda and gather != "auto" else "index_select"
        # the devices' shares: logical partition p on every device the placement stores it on
        self.placement: Placement = solve_placement(default_links(self.devices) if links is None else links)
        edge_bytes = 8 + (4 if weight is not None else 0)
        directory = n * 8  # the rank of every vertex, on every device: requests are routed where they are made
        if gpu_graph_ratio is None or gpu_feature_ratio is None:
            if memory_budget is None:
                raise ConfigError("the memory store fills the device budget only when it has one: give "
                                  "--gpu-memory, or both --gpu-graph-ratio and --gpu-feature-ratio")
            list_bytes = 8 + (indptr[1:] - indptr[:-1])[order] * edge_bytes  # [N] by rank: pointer + entries
            fit = fit_hot_counts(list_bytes, self.feature_width * 4, self.placement.stored, memory_budget - directory,
                                 None if gpu_graph_ratio is None else int(round(gpu_graph_ratio * n)),
                                 None if gpu_feature_ratio is None else int(round(gpu_feature_ratio * n)))
            self.hot_graph, self.hot_features = fit
        else:
            self.hot_graph = int(round(gpu_graph_ratio * n))
            self.hot_features = int(round(gpu_feature_ratio * n))

        def hot_rows(limit: int, p: int) -> Tensor:
            return order[p:limit:G]  # vertices of logical partition p (ranks p, p + G, ...), local row = rank // G

        self.dev_x: list[dict[int, Tensor]] = []
        self.dev_csr: list[dict[int, tuple[Tensor, Tensor, Tensor | None]]] = []
        parts = [(hot_rows(self.hot_features, p), csr_slices(indptr, hot_rows(self.hot_graph, p))) for p in range(G)]
        for g, dev in enumerate(self.devices):
            stored = self.placement.stored[g]
            need = directory + sum(parts[p][0].numel() * self.feature_width * 4 + parts[p][1][0].numel() * 8
                                   + parts[p][1][1].numel() * edge_bytes for p in stored)
            if memory_budget is not None and need > memory_budget:
                if gpu_graph_ratio is None or gpu_feature_ratio is None:  # fitted: only the directory overflows
                    raise ConfigError(f"the memory store needs {format_bytes(need)} on device {g} for its vertex "
                                      f"directory alone (8 bytes per vertex), more than its share of the budget "
                                      f"({format_bytes(memory_budget)}); raise --gpu-memory")
                raise ConfigError(f"the memory store puts {format_bytes(need)} on device {g} at --gpu-graph-ratio "
                                  f"{gpu_graph_ratio} and --gpu-feature-ratio {gpu_feature_ratio}, more than the "
                                  f"budget ({format_bytes(memory_budget)}); lower the ratios")
            self.dev_x.append({p: x.index_select(0, parts[p][0]).to(dev) for p in stored})
            self.dev_csr.append({p: (parts[p][1][0].to(dev), indices.index_select(0, parts[p][1][1]).to(dev),
                                     None if weight is None else weight.index_select(0, parts[p][1][1]).to(dev))
                                 for p in stored})
        self.directory: dict[torch.device, Tensor] = {}
        for dev in self.devices:
            if dev not in self.directory:
                self.directory[dev] = self.rank.to(dev)
        # host memory keeps everything (cold rows are read from it; hot ones never are), as [rows, width] tables
        # the gathers read: row pointers, entries, weights, features
        # On CUDA they are page-locked in place (cudaHostRegister; a pinned copy only where that fails).
        self.pinned: list[PinnedRegion] = []

        def host(t: Tensor) -> Tensor:
            t = t.contiguous()
            if not cuda:
                return t
            t, region = pinned_host(t)
            if region is not None:
                self.pinned.append(region)
            return t

        self.host_x = host(x)
        self.host_csr = (host(indptr).view(-1, 1), host(indices).view(-1, 1),
                         None if weight is None else host(weight).view(-1, 1))
        if cuda and gather == "auto" and default_gather_method(self.devices[0]) == "uva":
            self.gather = self._faster_gather()
        self.readers = [StoreReader(self, g) for g in range(G)]

    def _faster_gather(self, rows: int = 1 << 14, repeats: int = 3) -> str:
        """``uva`` or ``index_select``, whichever reads random host feature rows onto the first device faster."""
        import time

        dev = self.devices[0]
        ids = torch.randint(0, self.num_nodes, (min(rows, self.num_nodes),), generator=torch.Generator().manual_seed(0))
        ids = torch.sort(ids).values
        out = torch.empty(ids.numel(), self.feature_width, device=dev)
        staging = torch.empty(ids.numel(), self.feature_width, pin_memory=True)
        ids_dev = ids.to(dev)
        best: dict[str, float] = {}
        for method in ("uva", "index_select"):
            for _ in range(repeats + 1):  # the first run warms up (compiles the kernel)
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                gather_rows(self.host_x, ids_dev if method == "uva" else ids, out, method=method, staging=staging)
                torch.cuda.synchronize(dev)
                best[method] = min(best.get(method, float("inf")), time.perf_counter() - t0)
        return min(best, key=lambda m: best[m])

    # ------------------------------------------------------------------------------------------------ readers
    def reader(self, g: int) -> StoreReader:
        """Device ``g``'s view of the store (what trainer ``g`` samples and extracts through)."""
        return self.readers[g]

    @property
    def stats(self) -> StoreStats:
        """Counters summed over the readers."""
        total = StoreStats()
        for r in self.readers:
            total = total + r.stats
        return total

    def reset_stats(self) -> StoreStats:
        """Return the counters so far (summed over readers) and start new ones."""
        total = self.stats
        for r in self.readers:
            r.stats = StoreStats()
        return total

    def request(self, ids: Tensor, reader: int = 0) -> NeighborRequest:
        return self.readers[reader].request(ids)

    def num_neighbors(self, ids: Tensor, reader: int = 0) -> Tensor:
        """``[n]`` in-degree of each id (in the served adjacency), on ``ids``' device."""
        return self.readers[reader].request(ids).degrees

    def neighbors(self, ids: Tensor, reader: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
        """Whole in-neighbour lists of ``ids``, concatenated: ``(indptr [n+1], indices, weights or None)``."""
        return full_lists(self.readers[reader].request(ids))

    def features(self, ids: Tensor, reader: int = 0) -> Tensor:
        return self.readers[reader].features(ids)

    def device_bytes(self) -> list[int]:
        """Bytes each device holds for the store (its partitions and its rank directory)."""
        out = []
        for dev, xs, csrs in zip(self.devices, self.dev_x, self.dev_csr, strict=True):
            ts = [*xs.values(), *(t for csr in csrs.values() for t in csr if t is not None), self.directory[dev]]
            out.append(sum(t.numel() * t.element_size() for t in ts))
        return out


def fit_hot_counts(list_bytes: Tensor, row_bytes: int, stored: tuple[tuple[int, ...], ...], budget: int,
                   hot_graph: int | None = None, hot_features: int | None = None) -> tuple[int, int]:
    """The most hot vertices whose neighbour lists, then feature rows, fit ``budget`` bytes on every device.

    Topology first (XGNN §4.3): the largest ``hot_graph`` whose lists fit, then the largest ``hot_features`` whose
    rows fit beside them. Device ``g`` holds the logical partitions ``stored[g]``; partition ``p`` holds ranks
    ``p, p + G, ...`` below the hot count, so a device's bytes grow with the count and each fit is a bisection.
    A count given (not ``None``) is kept as it is.

    Args:
        list_bytes: ``[N]`` bytes of each vertex's list on a device (row pointer and entries), by rank.
        row_bytes: bytes of one feature row.
        stored: the placement's partitions per device.
        budget: bytes per device for the hot data.
    """
    n, G = list_bytes.numel(), len(stored)
    csum = [torch.cat([list_bytes.new_zeros(1), torch.cumsum(list_bytes[p::G], 0)]).tolist() for p in range(G)]

    def per_part(h: int) -> list[int]:  # ranks of partition p below h
        return [max(0, (h - p + G - 1) // G) for p in range(G)]

    def topo_bytes(h: int) -> list[int]:
        k = per_part(h)
        return [sum(csum[p][k[p]] + 8 for p in parts) for parts in stored]  # + the closing row pointer

    def feat_bytes(h: int) -> list[int]:
        k = per_part(h)
        return [sum(k[p] for p in parts) * row_bytes for parts in stored]

    def largest(fits: Callable[[int], bool]) -> int:
        lo, hi = 0, n  # fits(lo) holds (or lo == 0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo

    if hot_graph is None:
        hot_graph = largest(lambda h: max(topo_bytes(h)) <= budget)
    left = [budget - t for t in topo_bytes(hot_graph)]
    if hot_features is None:
        hot_features = largest(lambda h: all(f <= room for f, room in zip(feat_bytes(h), left, strict=True)))
    return hot_graph, hot_features


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
    """One device's view of a :class:`GlobalMemoryStore`: routes on that device, reads every logical partition
    from where the placement's row for this device says, and counts its own reads (:attr:`stats`). Readers of
    different devices can run in different threads."""

    def __init__(self, store: GlobalMemoryStore, index: int):
        self.store, self.index, self.device = store, index, store.devices[index]
        G = len(store.devices)
        source = store.placement.source[index]
        self.holders = sorted({s for s in source if s != HOST})
        self.host_slot = len(self.holders)
        slot = [self.host_slot if s == HOST else self.holders.index(s) for s in source]
        self.slot_of_part = torch.tensor(slot, dtype=torch.int64).to(self.device)  # [G]
        self.rank = store.directory[self.device]
        self.stats = StoreStats()
        self._staging: Tensor | None = None
        self._staging_done: torch.cuda.Event | None = None
        self._num_keys = (self.host_slot + 1) * G

    # ------------------------------------------------------------------------------------------------ routing
    def _route(self, ids: Tensor, hot: int) -> _Route:
        store, G = self.store, len(self.store.devices)
        ids = ids.to(self.device).long()
        r = self.rank[ids]  # [n]
        part, local = r % G, r // G
        on = r < hot
        slot = torch.where(on, self.slot_of_part[part], self.host_slot)
        seg = slot * G + torch.where(slot == self.host_slot, 0, part)  # [n] (source slot, partition)
        order = torch.sort(seg * store.num_nodes + ids).indices  # [n]
        counts = torch.zeros(self._num_keys, dtype=torch.int64, device=self.device).index_add_(
            0, seg, torch.ones_like(seg))  # [slots * G] (bincount would sync on CUDA to find the largest key)
        bounds = torch.zeros(self._num_keys + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(counts, 0, out=bounds[1:])
        segments: list[tuple[int, int, int, int]] = []
        for key, c in enumerate(counts.tolist()):  # the one sync of a route
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

    def _remote(self, src: int, idx: Tensor, parts: list[tuple[int, int]],
                read: Callable[[int, Tensor], Tensor]) -> Tensor:
        """One request to device ``src``: positions ``idx`` (``parts``: consecutive ``(partition, count)`` runs)
        read there by ``read(partition, positions)``, the answers concatenated and returned on this reader's
        device (one transfer each way)."""
        dev = self.store.devices[src]
        at = idx.to(dev)  # one transfer of the request to the holder
        pieces, lo = [], 0
        for p, c in parts:
            pieces.append(read(p, at[lo : lo + c]))
            lo += c
        got = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if src != self.index:
            self.stats.remote_requests += 1
        return got.to(self.device)  # one transfer of the answer back

    # ------------------------------------------------------------------------------------------------ host reads
    def host_rows(self, host: Tensor, rows: Tensor) -> Tensor:
        """``host[rows]`` (``[R, w]`` host table, ``rows`` ascending on this device) on this device: an index on
        the CPU; on CUDA the UVA gather, or a CPU gather into the reader's reused pinned buffer and a copy."""
        if self.device.type == "cpu":
            return host.index_select(0, rows)
        n, w = rows.numel(), host.shape[1]
        out = torch.empty(n, w, dtype=host.dtype, device=self.device)
        if self.store.gather == "uva":
            return gather_rows(host, rows, out, method="uva")
        need = n * w * host.element_size()
        if self._staging_done is not None:
            self._staging_done.synchronize()  # the previous copy out of the buffer has landed
        if self._staging is None or self._staging.numel() < need:
            self._staging = torch.empty(max(need, 1 << 20), dtype=torch.uint8, pin_memory=True)
            self.stats.staging_allocs += 1
        staging = self._staging[:need].view(host.dtype).view(n, w)
        gather_rows(host, rows.cpu(), out, method="index_select", staging=staging)
        if self._staging_done is None:
            self._staging_done = torch.cuda.Event()
        self._staging_done.record(torch.cuda.current_stream(self.device))
        return out

    # ------------------------------------------------------------------------------------------------ features
    def features(self, ids: Tensor) -> Tensor:
        """``[n, F]`` feature rows of ``ids`` (repeats allowed) on this reader's device."""
        store, st = self.store, self.stats
        F = store.feature_width
        route = self._route(ids, store.hot_features)
        out = torch.empty(route.order.numel(), F, device=self.device)
        for src, parts, lo, hi in self._by_holder(route):
            if src == HOST:
                vals = self.host_rows(store.host_x, route.ids[lo:hi])
                st.h2d_feature_bytes += (hi - lo) * F * 4
            else:
                xs = store.dev_x[src]

                def rows(p: int, i: Tensor, xs: dict[int, Tensor] = xs) -> Tensor:
                    return xs[p].index_select(0, i)

                vals = self._remote(src, route.local[lo:hi], [(p, c) for p, c, _ in parts], rows)
                st.feature_hits += hi - lo
                if src != self.index:
                    st.d2d_bytes += (hi - lo) * F * 4
            st.rows_from[src] += hi - lo
            out.index_copy_(0, route.order[lo:hi], vals)
        st.feature_requests += route.order.numel()
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
        start, deg = torch.empty(n, dtype=torch.int64, device=dev), torch.empty(n, dtype=torch.int64, device=dev)
        self.sources = reader._by_holder(route)
        for src, parts, lo, hi in self.sources:
            if src == HOST:
                ptr = store.host_csr[0]
                v = route.ids[lo:hi]
                s, e = reader.host_rows(ptr, v).view(-1), reader.host_rows(ptr, v + 1).view(-1)
                st.h2d_topology_bytes += (hi - lo) * 16
            else:
                csrs = store.dev_csr[src]

                def bounds(p: int, i: Tensor, csrs: dict[int, tuple[Tensor, Tensor, Tensor | None]] = csrs) -> Tensor:
                    ptr = csrs[p][0]
                    return torch.stack([ptr[i], ptr[i + 1]], 1)  # [c, 2] start and end of each list

                se = reader._remote(src, route.local[lo:hi], [(p, c) for p, c, _ in parts], bounds)
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
        indptr, pos = indptr.to(dev), pos.to(dev)
        E = pos.numel()
        # the picked entries regrouped by source, in the route's row order (so host positions come ascending)
        take = indptr[1:] - indptr[:-1]  # [n]
        counts = take[route.order]  # [n]
        ptr_s = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=dev)
        torch.cumsum(counts, 0, out=ptr_s[1:])
        rows_s = csr_rows(ptr_s, E)  # [E] sorted row of each entry
        epos = indptr[route.order][rows_s] + (torch.arange(E, device=dev) - ptr_s[rows_s])  # [E] request entry
        q = self.start[rows_s] + pos[epos]  # [E] position in the source's entry table
        ebounds = ptr_s[route.bounds].tolist()  # entry offset of every key's segment: the one sync of a take
        weighted = store.host_csr[2] is not None
        out = torch.empty(E, dtype=torch.int64, device=dev)
        out_w = torch.empty(E, device=dev) if weighted else None
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

                def entries(p: int, i: Tensor, csrs: dict[int, tuple[Tensor, Tensor, Tensor | None]] = csrs) -> Tensor:
                    _, ind, wt = csrs[p]
                    got = ind[i].view(-1, 1)  # weights travel in the same answer, their bits in a second column
                    return got if wt is None else torch.cat([got, wt[i].view(torch.int32).long().view(-1, 1)], 1)

                both = reader._remote(src, q[a:b], sized, entries)
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
