"""XGNN's global GNN memory store (§4): one address space for topology and features over the GPUs and host memory.

Vertices are ranked by *hotness* (out-degree by default: an in-neighbour sampler reaches a vertex once per
out-edge; or access counts from a pre-sampling pass). The hottest ``gpu_graph_ratio`` of the vertices keep their
in-neighbour lists, and the hottest ``gpu_feature_ratio`` their feature rows, on the GPUs, split by rank modulo
the number of GPUs (§4.3: logical partition ``p`` holds ranks ``r`` with ``r % G == p``, at local row ``r // G``);
everything else stays in host memory (page-locked in place on CUDA, :func:`gnnscale.runtime.pinned_host`), which GPUs
read directly (the UVA gather of :mod:`gnnscale.store.gather`) or through a CPU gather into a reused pinned
buffer and an asynchronous copy. Which device stores which logical partition, and where each device reads each
partition from (itself, a linked device, or host memory), is the placement solver's plan
(:func:`gnnscale.store.placement.solve_placement`, §4.2) for the devices' link matrix.

Each device reads through its own :class:`StoreReader` (one per trainer, :meth:`GlobalMemoryStore.reader`), which
follows its row of the placement. A request is routed *on the reader's device* (XGNN's "modulo and division": a
rank directory held on every device), ordered by source -- each holder device, then host memory -- and by vertex id
within a source, and answered with one read per source: one request to each remote holder, one sorted gather from
host memory. Topology requests are two-phase (:class:`~gnnscale.sample.NeighborRequest`): the degrees of a
frontier, then only the entries the sampler picked. Host syncs per request are a constant, none per vertex,
partition or holder: a topology read has one for the per-source counts and one for the entry counts; a feature
read one (the ids' range check, the device hits and the per-holder counts together); on an accelerator each read
from host memory adds one for its row ids and one before its staging buffer is reused, and each request to
another device is one stream wait on either side (:mod:`gnnscale.store.reader`).

The feature part is a composition of feature sources (:mod:`gnnscale.store.features`): each reader reads through
a :class:`~gnnscale.store.cache.DeviceCache` whose cache is the device tier as that reader reaches it
(:class:`~gnnscale.store.sharded.ShardedDeviceSource`) and whose fallback is host memory
(:class:`~gnnscale.store.sources.PinnedHostSource`); :meth:`GlobalMemoryStore.feature_source` hands it out. The
topology part (neighbour lists) is routed by :class:`~gnnscale.store.reader.StoreReader` itself.

Every read is counted per reader and per source (:class:`StoreStats`), in bytes too, on CPU "devices" as on GPUs,
so tests can check that each row came from the tier the placement says. With ``devices`` on the CPU the same code
runs with "GPU" partitions in ordinary memory (the tests do this); with sim devices
(:class:`~gnnscale.runtime.SimDevice`) the partitions sit in their bounded pools and every copy between the devices
and host memory is deferred until waited for, as on GPUs.

All device work goes through :mod:`gnnscale.runtime`. The partitions and rank directories are copied to the devices
on their current streams while the store is built, and the build ends with one sync per device, so that any
reader's stream may read them. Reads: :mod:`gnnscale.store.reader`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, sampling_csr
from gnnscale.graph.csr import csr_slices
from gnnscale.graph.graph import Graph
from gnnscale.sample.neighbor import NeighborRequest, full_lists
from gnnscale.store.disk import host_cached
from gnnscale.store.features import FeatureSource
from gnnscale.store.gather import default_gather_method, gather_rows
from gnnscale.store.placement import Placement, solve_placement
from gnnscale.store.reader import StoreReader
from gnnscale.store.stats import StoreStats
from gnnscale.units import format_bytes, format_bytes_up

__all__ = ["GlobalMemoryStore", "StoreReader", "StoreStats", "default_links", "directory_reason", "fit_hot_counts"]


def default_links(devices: Sequence[rt.Device]) -> list[list[float]]:
    """Link matrix of ``devices``: peer access (1 where a device reads another's memory directly,
    :func:`gnnscale.runtime.can_access_peer`: GPUs as the driver says, sim devices all linked); CPU test devices
    share one memory, so they count as fully linked."""
    G = len(devices)
    if not rt.is_accelerator(devices[0]):
        return [[0.0 if i == j else 1.0 for j in range(G)] for i in range(G)]
    return [[0.0 if i == j or devices[i] == devices[j] or not rt.can_access_peer(devices[i], devices[j])
             else 1.0 for j in range(G)] for i in range(G)]


DIRECTORY_BYTES = 8
"""Device bytes a vertex costs in the store's directory (its rank), on every device."""


def directory_reason(num_nodes: int, budget: int, share: float) -> str | None:
    """Why a store given ``share`` of the device budget ``budget`` (``--gpu-memory``) cannot hold its vertex
    directory, the one part it places on every device whatever the ratios (the store refuses it when built); ``None``
    when it can. The engines' planners ask this, so ``gnnscale plan`` and ``train`` agree."""
    need = DIRECTORY_BYTES * num_nodes
    if need <= int(share * budget):
        return None
    least = math.ceil(need / share)
    while int(share * least) < need:
        least += 1
    return (f"the memory store needs {format_bytes(need)} on each device for its vertex directory alone "
            f"({DIRECTORY_BYTES} bytes per vertex), more than its share of the device budget "
            f"({format_bytes(int(share * budget))} of {format_bytes(budget)}): give --gpu-memory at least "
            f"{format_bytes_up(least)}")


def _check_ratios(gpu_graph_ratio: float | None, gpu_feature_ratio: float | None) -> None:
    """Refuse a ratio given outside [0, 1]."""
    for name, ratio in (("--gpu-graph-ratio", gpu_graph_ratio), ("--gpu-feature-ratio", gpu_feature_ratio)):
        if ratio is not None and not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"{name} must be in [0, 1], got {ratio}")


def _refuse_share(g: int, need: int, memory_budget: int, ratios: tuple[float | None, float | None]) -> None:
    """Refuse device ``g``'s share of ``need`` bytes, over ``memory_budget``."""
    gpu_graph_ratio, gpu_feature_ratio = ratios
    if gpu_graph_ratio is None or gpu_feature_ratio is None:  # fitted: only the directory overflows
        raise ConfigError(f"the memory store needs {format_bytes(need)} on device {g} for its vertex "
                          f"directory alone (8 bytes per vertex), more than its share of the budget "
                          f"({format_bytes(memory_budget)}); raise --gpu-memory")
    raise ConfigError(f"the memory store puts {format_bytes(need)} on device {g} at --gpu-graph-ratio "
                      f"{gpu_graph_ratio} and --gpu-feature-ratio {gpu_feature_ratio}, more than the "
                      f"budget ({format_bytes(memory_budget)}); lower the ratios")


class GlobalMemoryStore:
    """Topology and features of ``graph`` over ``devices`` and host memory, hottest on the devices (XGNN GGMS).

    Args:
        graph: the graph; its features stay in their dtype (``bfloat16`` ones at 2 bytes an element, in host
            memory, on the devices and on the bus: the model upcasts them on the device, ``GNN.layer_input``).
        devices: the "GPUs" (accelerator devices, sim devices, or CPU devices for testing); one logical partition
            each.
        adjacency: the model's adjacency: the store serves what a sampler for it draws from
            (:func:`~gnnscale.graph.block.sampling_csr`: raw weights for GCN, no self-loops when the layers add
            them; :class:`~gnnscale.sample.SampledAdjacency` adds and normalises them per block).
        gpu_graph_ratio: fraction of the vertices (the hottest) whose in-neighbour lists live on the devices;
            ``None``: as many as ``memory_budget`` holds (topology first, XGNN §4.3: its reads are random and
            small, where a feature row is one sequential read).
        gpu_feature_ratio: fraction of the vertices (the hottest) whose feature rows live on the devices;
            ``None``: as many as the budget left after the topology holds.
        hotness: ``[N]`` scores (higher = hotter), or ``None`` for out-degree.
        memory_budget: bytes each device may hold for its share (rank directory included); ``None``: no check
            (a device that cannot hold its share raises :class:`~gnnscale.runtime.DeviceOutOfMemory`).
        gather: host-row path on CUDA: ``uva``, ``index_select`` or ``auto``.
        links: ``[G, G]`` link bandwidths between the devices for the placement solver (0 = no link); ``None``:
            :func:`default_links`.
        host_source: the host tier's feature rows when they are not to be held in host memory (the disk tier: a
            :class:`~gnnscale.store.disk.DiskSource` of the graph's ``x.npy``, in ``graph.x``'s dtype); ``graph.x``
            is then never
            read. ``None``: ``graph.x`` in host memory.
        host_cache_bytes: with ``host_source``, bytes of a host cache in front of it holding the hottest rows
            below the device tier's (:func:`~gnnscale.store.disk.host_cached`); its hits and the source's reads
            are counted per tier (``"host-cache"``, ``"disk"``).
    """

    def __init__(self, graph: Graph, devices: Sequence[rt.Device], *, adjacency: AdjacencySpec | None = None,
                 gpu_graph_ratio: float | None = 0.0, gpu_feature_ratio: float | None = 0.0,
                 hotness: Tensor | None = None,
                 memory_budget: int | None = None, gather: str = "auto", links: object | None = None,
                 host_source: FeatureSource | None = None, host_cache_bytes: int = 0):
        _check_ratios(gpu_graph_ratio, gpu_feature_ratio)
        if not devices:
            raise ConfigError("the memory store needs at least one device")
        if graph.x is None:
            raise ConfigError(f"graph {graph.name} has no features to store")
        n = graph.num_nodes
        self.devices, self.num_nodes = list(devices), n
        order = self._rank_vertices(graph, hotness)
        indptr, indices, weight = sampling_csr(graph, adjacency or AdjacencySpec())[:3]
        x = graph.x  # kept in its dtype (bfloat16: half the bytes); the disk tier: x (a memory map) is never read
        if host_source is not None and (host_source.dtype != x.dtype or host_source.num_rows != n):
            raise ConfigError(f"the disk tier reads {n} {x.dtype} feature rows; {host_source} holds "
                              f"{host_source.num_rows} {host_source.dtype} rows")
        self.feature_width = x.shape[1]
        self.feature_row_bytes = self.feature_width * x.element_size()
        """Bytes of one feature row as stored (2 an element for bfloat16), wherever it is held or moved."""
        pin = rt.needs_pinning(self.devices[0])  # CUDA: host tables page-locked, read by the UVA gather or a copy
        self.gather = gather if pin and gather != "auto" else "index_select"
        # the devices' shares: logical partition p on every device the placement stores it on
        self.placement: Placement = solve_placement(default_links(self.devices) if links is None else links)
        edge_bytes = 8 + (4 if weight is not None else 0)
        directory = n * 8  # the rank of every vertex, on every device: requests are routed where they are made
        ratios = (gpu_graph_ratio, gpu_feature_ratio)
        self.hot_graph, self.hot_features = self._hot_counts(order, indptr, edge_bytes, directory, memory_budget,
                                                             ratios)
        self._place_partitions(order, (indptr, indices, weight), x, host_source, edge_bytes, directory,
                               memory_budget, ratios)
        self._place_directory()
        self._place_host(order, (indptr, indices, weight), x, pin, host_source, host_cache_bytes)
        if pin and gather == "auto" and host_source is None and default_gather_method(self.devices[0]) == "uva":
            self.gather = self._faster_gather()
        self.readers = [StoreReader(self, g) for g in range(len(self.devices))]
        for dev in self.directory:  # every copy made above has landed: any reader's stream may read it
            rt.synchronize(dev)

    def _rank_vertices(self, graph: Graph, hotness: Tensor | None) -> Tensor:
        """Set :attr:`rank` (vertex -> rank, hottest first) and return its inverse ``order`` (rank -> vertex)."""
        n = self.num_nodes
        scores = graph.out_degree().double() if hotness is None else hotness.double()
        if scores.shape != (n,):
            raise ConfigError(f"hotness must have one score per vertex ({n}), got shape {tuple(scores.shape)}")
        order = torch.sort(-scores, stable=True).indices  # rank -> vertex, hottest first (ties: lower id)
        self.rank = torch.empty(n, dtype=torch.int64)
        self.rank[order] = torch.arange(n)
        return order

    def _hot_counts(self, order: Tensor, indptr: Tensor, edge_bytes: int, directory: int, memory_budget: int | None,
                    ratios: tuple[float | None, float | None]) -> tuple[int, int]:
        """``(hot_graph, hot_features)``: the ratios' counts, or (a ratio ``None``) the most the budget holds."""
        n = self.num_nodes
        gpu_graph_ratio, gpu_feature_ratio = ratios
        if gpu_graph_ratio is None or gpu_feature_ratio is None:
            if memory_budget is None:
                raise ConfigError("the memory store fills the device budget only when it has one: give "
                                  "--gpu-memory, or both --gpu-graph-ratio and --gpu-feature-ratio")
            list_bytes = 8 + (indptr[1:] - indptr[:-1])[order] * edge_bytes  # [N] by rank: pointer + entries
            return fit_hot_counts(list_bytes, self.feature_row_bytes, self.placement.stored, memory_budget - directory,
                                  None if gpu_graph_ratio is None else int(round(gpu_graph_ratio * n)),
                                  None if gpu_feature_ratio is None else int(round(gpu_feature_ratio * n)))
        return int(round(gpu_graph_ratio * n)), int(round(gpu_feature_ratio * n))

    def _place_partitions(self, order: Tensor, csr: tuple[Tensor, Tensor, Tensor | None], x: Tensor,
                          host_source: FeatureSource | None, edge_bytes: int, directory: int,
                          memory_budget: int | None, ratios: tuple[float | None, float | None]) -> None:
        """Copy each device's logical partitions (hot feature rows, hot in-neighbour lists) to it: :attr:`dev_x`,
        :attr:`dev_csr`; a device whose share is over ``memory_budget`` is refused."""
        indptr, indices, weight = csr
        G = len(self.devices)

        def hot_rows(limit: int, p: int) -> Tensor:
            return order[p:limit:G]  # vertices of logical partition p (ranks p, p + G, ...), local row = rank // G

        self.dev_x: list[dict[int, Tensor]] = []
        self.dev_csr: list[dict[int, tuple[Tensor, Tensor, Tensor | None]]] = []
        parts = [(hot_rows(self.hot_features, p), csr_slices(indptr, hot_rows(self.hot_graph, p))) for p in range(G)]
        for g, dev in enumerate(self.devices):
            stored = self.placement.stored[g]
            need = directory + sum(parts[p][0].numel() * self.feature_row_bytes + parts[p][1][0].numel() * 8
                                   + parts[p][1][1].numel() * edge_bytes for p in stored)
            if memory_budget is not None and need > memory_budget:
                _refuse_share(g, need, memory_budget, ratios)
            self.dev_x.append({p: rt.to_device(x.index_select(0, parts[p][0]) if host_source is None
                                               else host_source.gather_unchecked(parts[p][0]), dev)
                               for p in stored})
            self.dev_csr.append({p: (rt.to_device(parts[p][1][0], dev),
                                     rt.to_device(indices.index_select(0, parts[p][1][1]), dev),
                                     None if weight is None else rt.to_device(weight.index_select(0, parts[p][1][1]),
                                                                              dev))
                                 for p in stored})

    def _place_directory(self) -> None:
        """Copy the rank directory to every device (once a device): :attr:`directory`."""
        self.directory: dict[rt.Device, Tensor] = {}
        for dev in self.devices:
            if dev not in self.directory:
                self.directory[dev] = rt.to_device(self.rank, dev)

    def _place_host(self, order: Tensor, csr: tuple[Tensor, Tensor, Tensor | None], x: Tensor, pin: bool,
                    host_source: FeatureSource | None, host_cache_bytes: int) -> None:
        """The host tier: :attr:`host_x` (or :attr:`host_source`) and :attr:`host_csr`, pinned where ``pin``."""
        indptr, indices, weight = csr
        # host memory keeps everything (cold rows are read from it; hot ones never are), as [rows, width] tables
        # the gathers read: row pointers, entries, weights, features
        # On CUDA they are page-locked in place (cudaHostRegister; a pinned copy only where that fails).
        self.pinned: list[rt.PinnedRegion] = []
        self.host_x = self._host(x, pin) if host_source is None else x
        self.host_source: FeatureSource | None = None
        """The host tier's rows when not in host memory: the disk tier behind its host cache (``None``: host_x)."""
        if host_source is not None:
            host_source.reset_stats()  # the device tier's rows read above are not the training's reads
            self.host_source = host_cached(host_source, order[self.hot_features:], host_cache_bytes)
        self.host_csr = (self._host(indptr, pin).view(-1, 1), self._host(indices, pin).view(-1, 1),
                         None if weight is None else self._host(weight, pin).view(-1, 1))

    def _host(self, t: Tensor, pin: bool) -> Tensor:
        """``t`` as a host table the gathers read: contiguous, and page-locked where ``pin`` (its region kept in
        :attr:`pinned`)."""
        t = t.contiguous()
        if not pin:
            return t
        t, region = rt.pinned_host(t, device=self.devices[0])
        if region is not None:
            self.pinned.append(region)
        return t

    def _faster_gather(self, rows: int = 1 << 14, repeats: int = 3) -> str:
        """``uva`` or ``index_select``, whichever reads random host feature rows onto the first device faster (a
        timing on a real GPU; the syncs bracket each timed gather)."""
        dev = self.devices[0]
        ids = torch.randint(0, self.num_nodes, (min(rows, self.num_nodes),), generator=torch.Generator().manual_seed(0))
        ids = torch.sort(ids).values
        out = rt.empty((ids.numel(), self.feature_width), dtype=self.host_x.dtype, device=dev)
        staging = rt.pinned_empty((ids.numel(), self.feature_width), dtype=self.host_x.dtype, device=dev)
        ids_dev = rt.to_device(ids, dev)
        best: dict[str, float] = {}
        for method in ("uva", "index_select"):
            for _ in range(repeats + 1):  # the first run warms up (compiles the kernel)
                rt.synchronize(dev)
                t0 = time.perf_counter()
                gather_rows(self.host_x, ids_dev if method == "uva" else ids, out, method=method, staging=staging)
                rt.synchronize(dev)
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
            r.feature_source.reset_stats()
        return total

    def feature_source(self, reader: int = 0) -> FeatureSource:
        """Device ``reader``'s feature rows as one :class:`~gnnscale.store.features.FeatureSource` (its device tier
        cached in front of host memory; its counters are per tier: ``"host"``, ``"device<h>"``)."""
        return self.readers[reader].feature_source

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
