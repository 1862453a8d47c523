"""XGNN's global GNN memory store (§4): one address space for topology and features over the GPUs and host memory.

Vertices are ranked by *hotness* (out-degree by default: an in-neighbour sampler reaches a vertex once per
out-edge; or access counts from a pre-sampling pass). The hottest ``gpu_graph_ratio`` of the vertices keep their
in-neighbour lists, and the hottest ``gpu_feature_ratio`` their feature rows, on the GPUs, split by rank modulo
the number of GPUs (§4.3: logical partition ``p`` holds ranks ``r`` with ``r % G == p``, at local row ``r // G``);
everything else stays in (pinned) host memory, which GPUs read directly (the UVA gather of
:mod:`gnnscale.store.gather`) or through a CPU gather and an asynchronous copy. Which device stores which logical
partition, and where each device reads each partition from (itself, a linked device, or host memory), is the
placement solver's plan (:func:`gnnscale.store.placement.solve_placement`, §4.2) for the devices' link matrix.

The API is what a sampler and a feature extractor call (:class:`gnnscale.sample.Topology` for the first):
``num_neighbors(ids)``, ``neighbors(ids)`` (the concatenated in-neighbour CSR slices, with edge weights) and
``features(ids)``, all in *original* vertex ids, answered on the requesting device. Requests are counted: GPU hits
against host reads, for topology and features, and the bytes read from host memory.

With ``devices`` on the CPU the same code runs with "GPU" partitions in ordinary memory (the tests do this).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, normalized_csr
from gnnscale.graph.graph import Graph, csr_slices
from gnnscale.plan.memory import format_bytes
from gnnscale.store.gather import default_gather_method, gather_rows
from gnnscale.store.placement import HOST, Placement, solve_placement


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
    """Request counters since the last :meth:`GlobalMemoryStore.reset_stats`."""

    graph_requests: int = 0
    graph_hits: int = 0
    feature_requests: int = 0
    feature_hits: int = 0
    h2d_bytes: int = 0

    def hit_rates(self) -> dict[str, float]:
        return {"graph_hit_rate": self.graph_hits / max(self.graph_requests, 1),
                "feature_hit_rate": self.feature_hits / max(self.feature_requests, 1)}


class GlobalMemoryStore:
    """Topology and features of ``graph`` over ``devices`` and host memory, hottest on the devices (XGNN GGMS).

    Args:
        graph: the graph; its features become ``float32``.
        devices: the "GPUs" (CUDA devices, or CPU devices for testing); one logical partition each.
        adjacency: the model's adjacency (self-loops, GCN normalisation) whose CSR the store serves.
        gpu_graph_ratio: fraction of the vertices (the hottest) whose in-neighbour lists live on the devices.
        gpu_feature_ratio: fraction of the vertices (the hottest) whose feature rows live on the devices.
        hotness: ``[N]`` scores (higher = hotter), or ``None`` for out-degree.
        memory_budget: bytes each device may hold for its share; ``None``: no check.
        gather: host-row path on CUDA: ``uva``, ``index_select`` or ``auto``.
        links: ``[G, G]`` link bandwidths between the devices for the placement solver (0 = no link); ``None``:
            :func:`default_links`.
    """

    def __init__(self, graph: Graph, devices: list[torch.device], *, adjacency: AdjacencySpec | None = None,
                 gpu_graph_ratio: float = 0.0, gpu_feature_ratio: float = 0.0, hotness: Tensor | None = None,
                 memory_budget: int | None = None, gather: str = "auto", links: object | None = None):
        for name, ratio in (("--gpu-graph-ratio", gpu_graph_ratio), ("--gpu-feature-ratio", gpu_feature_ratio)):
            if not 0.0 <= ratio <= 1.0:
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
        self.hot_graph = int(round(gpu_graph_ratio * n))
        self.hot_features = int(round(gpu_feature_ratio * n))
        indptr, indices, weight = normalized_csr(graph, adjacency or AdjacencySpec())
        x = graph.x.float()
        self.feature_width = x.shape[1]
        cuda = self.devices[0].type == "cuda"
        self.gather = gather if cuda and gather != "auto" else "index_select"

        def hot_rows(limit: int, p: int) -> Tensor:
            return order[p:limit:G]  # vertices of logical partition p (ranks p, p + G, ...), local row = rank // G

        # the devices' shares: logical partition p on every device the placement stores it on
        self.placement: Placement = solve_placement(default_links(self.devices) if links is None else links)
        self.dev_x: list[dict[int, Tensor]] = []
        self.dev_csr: list[dict[int, tuple[Tensor, Tensor, Tensor | None]]] = []
        parts = [(hot_rows(self.hot_features, p), csr_slices(indptr, hot_rows(self.hot_graph, p))) for p in range(G)]
        edge_bytes = 8 + (4 if weight is not None else 0)
        for g, dev in enumerate(self.devices):
            stored = self.placement.stored[g]
            need = sum(parts[p][0].numel() * self.feature_width * 4 + parts[p][1][0].numel() * 8
                       + parts[p][1][1].numel() * edge_bytes for p in stored)
            if memory_budget is not None and need > memory_budget:
                raise ConfigError(f"the memory store puts {format_bytes(need)} on device {g} at --gpu-graph-ratio "
                                  f"{gpu_graph_ratio} and --gpu-feature-ratio {gpu_feature_ratio}, more than the "
                                  f"budget ({format_bytes(memory_budget)}); lower the ratios")
            self.dev_x.append({p: x.index_select(0, parts[p][0]).to(dev) for p in stored})
            self.dev_csr.append({p: (parts[p][1][0].to(dev), indices.index_select(0, parts[p][1][1]).to(dev),
                                     None if weight is None else weight.index_select(0, parts[p][1][1]).to(dev))
                                 for p in stored})
        # host memory keeps everything (cold rows are read from it; hot ones never are)
        pin = cuda
        self.host_x = x.pin_memory() if pin else x.contiguous()
        self.host_csr = (indptr, indices.pin_memory() if pin else indices,
                         None if weight is None else (weight.pin_memory() if pin else weight))
        self.stats = StoreStats()
        if cuda and gather == "auto" and default_gather_method(self.devices[0]) == "uva":
            self.gather = self._faster_gather()

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

    # ------------------------------------------------------------------------------------------------ placement
    def _route(self, ids: Tensor, hot: int, reader: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(from_a_device [n] bool, partition [n], local row [n])`` of original ids (CPU tensors) for device
        ``reader``: hot rows of partitions it reads from host memory count as host reads."""
        r = self.rank[ids.cpu()]
        G = len(self.devices)
        part = r % G
        on = r < hot
        for p, src in enumerate(self.placement.source[reader]):
            if src == HOST:
                on &= part != p
        return on, part, r // G

    def _holder(self, reader: int, p: int) -> int:
        """The device ``reader`` reads partition ``p`` from."""
        return self.placement.source[reader][p]

    def reset_stats(self) -> StoreStats:
        """Return the counters so far and start new ones."""
        stats, self.stats = self.stats, StoreStats()
        return stats

    # ------------------------------------------------------------------------------------------------ topology
    def num_neighbors(self, ids: Tensor) -> Tensor:
        """``[n]`` in-degree of each id (in the served adjacency), on ``ids``' device."""
        indptr = self.host_csr[0]
        c = ids.cpu()
        return (indptr[c + 1] - indptr[c]).to(ids.device)

    def neighbors(self, ids: Tensor, reader: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
        """The in-neighbour lists of ``ids``, concatenated: ``(indptr [n+1], indices, weights or None)`` on ``ids``'
        device; device-resident lists are read where device ``reader`` finds them, the rest from host memory."""
        dev = ids.device
        on, part, local = self._route(ids, self.hot_graph, reader)
        out_ptr = torch.zeros(ids.numel() + 1, dtype=torch.int64)
        torch.cumsum(self.num_neighbors(ids).cpu(), 0, out=out_ptr[1:])
        total = int(out_ptr[-1])
        indices = torch.empty(total, dtype=torch.int64, device=dev)
        weighted = self.host_csr[2] is not None
        weights = torch.empty(total, device=dev) if weighted else None

        def place(sel: Tensor, src_ptr: Tensor, src_idx: Tensor, src_w: Tensor | None, rows: Tensor) -> int:
            """Copy the lists of the selected requests (rows of one CSR) into their output positions."""
            if sel.numel() == 0:
                return 0
            ptr, pos = csr_slices(src_ptr, rows.to(src_ptr.device))
            dst_ptr, dst_pos = csr_slices(out_ptr, sel)  # the same lists' places in the output
            assert int(ptr[-1]) == dst_pos.numel()
            dst_pos = dst_pos.to(dev)
            indices[dst_pos] = src_idx[pos].to(dev)
            if weights is not None and src_w is not None:
                weights[dst_pos] = src_w[pos].to(dev)
            return dst_pos.numel()

        hits = 0
        for p in range(len(self.devices)):
            sel = torch.nonzero(on & (part == p)).view(-1)
            if sel.numel():
                hits += place(sel, *self.dev_csr[self._holder(reader, p)][p], local[sel])
        cold = torch.nonzero(~on).view(-1)
        read = place(cold, *self.host_csr, ids.cpu()[cold])
        self.stats.graph_requests += ids.numel()
        self.stats.graph_hits += ids.numel() - cold.numel()
        self.stats.h2d_bytes += read * (8 + (4 if weighted else 0)) if dev.type != "cpu" else 0
        return out_ptr.to(dev), indices, weights

    # ------------------------------------------------------------------------------------------------ features
    def features(self, ids: Tensor, reader: int = 0) -> Tensor:
        """``[n, F]`` feature rows of ``ids`` on ``ids``' device: device-resident rows from where device ``reader``
        finds their partition, the rest read from host memory (UVA or CPU gather + copy on CUDA)."""
        dev = ids.device
        on, part, local = self._route(ids, self.hot_features, reader)
        out = torch.empty(ids.numel(), self.feature_width, device=dev)
        for p in range(len(self.devices)):
            sel = torch.nonzero(on & (part == p)).view(-1)
            if sel.numel():
                held = self.dev_x[self._holder(reader, p)][p]
                out[sel.to(dev)] = held.index_select(0, local[sel].to(held.device)).to(dev)
        cold = torch.nonzero(~on).view(-1)
        if cold.numel():
            rows = ids.cpu()[cold]
            if dev.type == "cpu":
                out[cold] = self.host_x.index_select(0, rows)
            else:
                buf = torch.empty(cold.numel(), self.feature_width, device=dev)
                if self.gather == "uva":
                    gather_rows(self.host_x, rows.to(dev), buf, method="uva")
                else:
                    staging = torch.empty(cold.numel(), self.feature_width, pin_memory=True)
                    gather_rows(self.host_x, rows, buf, method="index_select", staging=staging)
                out[cold.to(dev)] = buf
                self.stats.h2d_bytes += cold.numel() * self.feature_width * 4
        self.stats.feature_requests += ids.numel()
        self.stats.feature_hits += ids.numel() - cold.numel()
        return out

    def device_bytes(self) -> list[int]:
        """Bytes each device holds for the store."""
        out = []
        for xs, csrs in zip(self.dev_x, self.dev_csr, strict=True):
            ts = [*xs.values(), *(t for csr in csrs.values() for t in csr if t is not None)]
            out.append(sum(t.numel() * t.element_size() for t in ts))
        return out
