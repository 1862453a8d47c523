"""The sparse aggregation's rate on a graph's own rows: what the calibration's random neighbours cannot say.

The rates' aggregation (:attr:`~gnnscale.plan.rates.Rates.aggregate`) is measured over uniformly random in-
neighbours of a 64 MiB table. A real graph reads its own table (smaller or larger than the cache) in its own order:
a web crawl or a social graph in crawl order reads neighbours close together and runs faster; a graph whose table
fits the cache runs at the cached rate. :func:`graph_aggregate_rate` times the library's aggregation
(:func:`~gnnscale.nn.ops.spmm`) over slices of the graph's own destination rows (spread over the vertex order) with
their own neighbours, at the layer's width over a ``[V, width]`` table: edges per second, once per graph and width
(about 10-50 ms), for the full-graph layers on a CPU (:class:`~gnnscale.plan.work.LayerWork`).
"""

from __future__ import annotations

import statistics
import time
import weakref

import torch

from gnnscale.graph.block import Block
from gnnscale.graph.graph import Graph
from gnnscale.nn.ops import spmm

PROBE_EDGES = 1 << 18
"""Edges probed in all, in :data:`SLICES` slices of destination rows spread over the edge order."""
SLICES = 8
MAX_TABLE = 512 << 20
"""Bytes of the probe's ``[V, width]`` source table past which it is not probed (``0``: the calibrated rate)."""

_SEEN: weakref.WeakKeyDictionary[Graph, dict[int, float]] = weakref.WeakKeyDictionary()


def graph_aggregate_rate(graph: Graph, width: int) -> float:
    """Edges/s of the aggregation over ``graph``'s own rows at ``width`` features (``0``: not probed: a graph of
    fewer than :data:`PROBE_EDGES` / 4 edges, or a table over :data:`MAX_TABLE`). Measured once per graph and
    width."""
    seen = _SEEN.setdefault(graph, {})
    if width not in seen:
        V, E = graph.num_nodes, graph.num_edges
        ok = E >= PROBE_EDGES // 4 and 4 * width * V <= MAX_TABLE and width > 0
        seen[width] = _measure(graph, width) if ok else 0.0
    return seen[width]


def _measure(graph: Graph, width: int) -> float:
    """Edges/s over :data:`SLICES` slices of destination rows spread over the vertex order (a graph's locality
    varies along it), :data:`PROBE_EDGES` edges in all, into one ``[V, width]`` table."""
    indptr = graph.indptr
    V, E = graph.num_nodes, int(indptr[-1])
    x = torch.randn(V, width, generator=torch.Generator().manual_seed(0))
    edges, seconds = 0, 0.0
    for k in range(SLICES):
        start = int(torch.searchsorted(indptr, torch.tensor((2 * k + 1) * E // (2 * SLICES))).item())
        start = max(0, min(start, V - 1))
        stop = int(torch.searchsorted(indptr, indptr[start] + PROBE_EDGES // SLICES).item())
        stop = max(start + 1, min(stop, V))
        ptr = (indptr[start:stop + 1] - indptr[start]).to(torch.int64)
        own = graph.indices[int(indptr[start]):int(indptr[stop])].to(torch.int64)
        out = torch.empty(stop - start, width)
        block = Block(indptr=ptr, indices=own, num_src=V)
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            spmm(block, x, out)
            times.append(time.perf_counter() - t0)
        edges += own.numel()
        seconds += statistics.median(times[1:])
    return edges / max(seconds, 1e-9)
