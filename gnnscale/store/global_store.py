"""XGNN's global GNN memory store (§4): one address space for topology and features over the GPUs and host memory.

Vertices are ranked by *hotness* (out-degree by default: an in-neighbour sampler reaches a vertex once per
out-edge; or access counts from a pre-sampling pass). The hottest ``gpu_graph_ratio`` of the vertices keep their
in-neighbour lists, and the hottest ``gpu_feature_ratio`` their feature rows, on the GPUs, split by rank modulo
the number of GPUs (§4.3: logical partition ``p`` holds ranks ``r`` with ``r % G == p``, at local row ``r // G``);
everything else stays in (pinned) host memory, which GPUs read directly (the UVA gather of
:mod:`gnnscale.store.gather`) or through a CPU gather and an asynchronous copy.

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
from gnnscale.graph.graph import Graph
from gnnscale.plan.memory import format_bytes
from gnnscale.store.gather import default_gather_method, gather_rows


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


def csr_slices(indptr: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """``(out_ptr, positions)``: the local row pointers of the concatenated CSR rows ``rows`` and the edge positions
    (into ``indices``) that make them up, vectorised (no loop per row)."""
    start, end = indptr[rows], indptr[rows + 1]
    deg = end - start
    out_ptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(deg, 0, out=out_ptr[1:])
    total = int(out_ptr[-1])
    offset = torch.arange(total, device=rows.device) - torch.repeat_interleave(out_ptr[:-1], deg, output_size=total)
    return out_ptr, torch.repeat_interleave(start, deg, output_size=total) + offset


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
    """

    def __init__(self, graph: Graph, devices: list[torch.device], *, adjacency: AdjacencySpec | None = None,
                 gpu_graph_ratio: float = 0.0, gpu_feature_ratio: float = 0.0, hotness: Tensor | None = None,
                 memory_budget: int | None = None, gather: str = "auto"):
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
        self.gather = (default_gather_method(self.devices[0]) if gather == "auto" else gather) if cuda else \
            "index_select"

        def hot_rows(limit: int, p: int) -> Tensor:
            return order[p:limit:G]  # vertices of logical partition p (ranks p, p + G, ...), local row = rank // G

        # the devices' shares
        self.dev_x: list[Tensor] = []
        self.dev_csr: list[tuple[Tensor, Tensor, Tensor | None]] = []
        for p, dev in enumerate(self.devices):
            vf, vg = hot_rows(self.hot_features, p), hot_rows(self.hot_graph, p)
            ptr, pos = csr_slices(indptr, vg)
            edge_bytes = 8 + (4 if weight is not None else 0)
            need = vf.numel() * self.feature_width * 4 + ptr.numel() * 8 + pos.numel() * edge_bytes
            if memory_budget is not None and need > memory_budget:
                raise ConfigError(f"the memory store puts {format_bytes(need)} on each device at --gpu-graph-ratio "
                                  f"{gpu_graph_ratio} and --gpu-feature-ratio {gpu_feature_ratio}, more than the "
                                  f"budget ({format_bytes(memory_budget)}); lower the ratios")
            self.dev_x.append(x.index_select(0, vf).to(dev))
            self.dev_csr.append((ptr.to(dev), indices.index_select(0, pos).to(dev),
                                 None if weight is None else weight.index_select(0, pos).to(dev)))
        # host memory keeps everything (cold rows are read from it; hot ones never are)
        pin = cuda
        self.host_x = x.pin_memory() if pin else x.contiguous()
        self.host_csr = (indptr, indices.pin_memory() if pin else indices,
                         None if weight is None else (weight.pin_memory() if pin else weight))
        self.stats = StoreStats()

    # ------------------------------------------------------------------------------------------------ placement
    def _route(self, ids: Tensor, hot: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(on_device [n] bool, partition [n], local row [n])`` of original ids (CPU tensors)."""
        r = self.rank[ids.cpu()]
        G = len(self.devices)
        return r < hot, r % G, r // G

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

    def neighbors(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The in-neighbour lists of ``ids``, concatenated: ``(indptr [n+1], indices, weights or None)`` on ``ids``'
        device; device-resident lists are read there, the rest from host memory."""
        dev = ids.device
        on, part, local = self._route(ids, self.hot_graph)
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
            hits += place(sel, *self.dev_csr[p], local[sel])
        cold = torch.nonzero(~on).view(-1)
        read = place(cold, *self.host_csr, ids.cpu()[cold])
        self.stats.graph_requests += ids.numel()
        self.stats.graph_hits += ids.numel() - cold.numel()
        self.stats.h2d_bytes += read * (8 + (4 if weighted else 0)) if dev.type != "cpu" else 0
        return out_ptr.to(dev), indices, weights

    # ------------------------------------------------------------------------------------------------ features
    def features(self, ids: Tensor) -> Tensor:
        """``[n, F]`` feature rows of ``ids`` on ``ids``' device: device-resident rows from their partition, the rest
        read from host memory (UVA or CPU gather + copy on CUDA)."""
        dev = ids.device
        on, part, local = self._route(ids, self.hot_features)
        out = torch.empty(ids.numel(), self.feature_width, device=dev)
        for p in range(len(self.devices)):
            sel = torch.nonzero(on & (part == p)).view(-1)
            if sel.numel():
                rows = self.dev_x[p].index_select(0, local[sel].to(self.dev_x[p].device))
                out[sel.to(dev)] = rows.to(dev)
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
        for x, (ptr, idx, w) in zip(self.dev_x, self.dev_csr, strict=True):
            out.append(sum(t.numel() * t.element_size() for t in (x, ptr, idx, w) if t is not None))
        return out
