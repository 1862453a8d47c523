"""The measurements HyScale-GNN's performance model reads (Lin et al., §V: sampling is measured, not modelled):
sampling-time tables of a graph and the devices' gather, aggregation, multiply-accumulate and link rates (cached
once per machine beside the other throughputs)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.plan.hybrid_model import BatchShape, DeviceRates, SamplingTable
from gnnscale.plan.throughput import _name, _rate, cached, throughput
from gnnscale.sample import sample_blocks

if TYPE_CHECKING:
    from gnnscale.graph.block import Block
    from gnnscale.sample.adjacency import SampledAdjacency
    from gnnscale.sample.neighbor import Topology

SAMPLE_REPEATS = 3
"""Runs per table entry (the median is kept)."""


def batch_shape(blocks: list[Block], dims: tuple[int, ...]) -> BatchShape:
    """The counts of Eqs. 5-12 of one sampled batch (``blocks[0]`` the input layer)."""
    return BatchShape(dims=dims, edges=tuple(b.num_edges for b in blocks),
                      vertices=tuple(b.num_dst for b in blocks), input_vertices=blocks[0].num_src)


def measure_sampling(topo: Topology, ids: Tensor, fanouts: tuple[int, ...], dims: tuple[int, ...],
                     batch: int, max_threads: int, key: int = 0,
                     adjacency: SampledAdjacency | None = None) -> SamplingTable:
    """The sampling-time table: a batch of each of ``batch / 4``, ``batch / 2`` and ``batch`` seeds (drawn from
    ``ids`` on ``ids``' device), cut into ``k`` shares sampled at once on ``k`` threads, for ``k`` in 1, 2, 4, ...
    up to ``max_threads``; the median of :data:`SAMPLE_REPEATS` runs after a warm-up. ``adjacency``: the blocks
    made the layers' (loops, GCN weights), as training samples them."""
    n = ids.numel()
    sizes = tuple(sorted({max(1, min(n, s)) for s in (batch // 4, batch // 2, batch)}))
    threads = tuple(k for k in (1, 2, 4, 8, 16, 32) if k <= max(1, max_threads))
    gen = torch.Generator().manual_seed(key)
    order = torch.randperm(n, generator=gen).to(ids.device)
    seconds = []
    shapes: dict[int, list[BatchShape]] = {s: [] for s in sizes}
    accelerator = rt.is_accelerator(ids.device)
    for k in threads:
        row = []
        with ThreadPoolExecutor(k) as pool:
            for s in sizes:
                runs = []
                for r in range(SAMPLE_REPEATS + 1):
                    seeds = ids[order[(r * s) % max(1, n - s + 1):][:s]]
                    parts = [p for p in torch.tensor_split(seeds, k) if p.numel()]
                    if accelerator:
                        rt.synchronize(ids.device)
                    t0 = time.perf_counter()
                    out = list(pool.map(lambda p: sample_blocks(topo, p, fanouts, key, adjacency), parts))
                    if accelerator:
                        rt.synchronize(ids.device)
                    if r:
                        runs.append(time.perf_counter() - t0)
                    if k == 1 and r:
                        shapes[s].append(batch_shape(out[0], dims))
                row.append(sorted(runs)[len(runs) // 2])
        seconds.append(tuple(row))

    def mean(bs: list[BatchShape]) -> BatchShape:
        L = len(dims) - 1
        return BatchShape(dims=dims, input_vertices=round(sum(b.input_vertices for b in bs) / len(bs)),
                          edges=tuple(round(sum(b.edges[l] for b in bs) / len(bs)) for l in range(L)),
                          vertices=tuple(round(sum(b.vertices[l] for b in bs) / len(bs)) for l in range(L)))

    return SamplingTable(sizes, threads, tuple(seconds), tuple(mean(shapes[s]) for s in sizes))


def measure_rates(device: torch.device) -> DeviceRates:
    """Eqs. 7-13's figures for ``device``, measured the way the stages run: on a CPU with one thread (the
    stages' threads scale them); a GPU's link is the host-row gather onto it (pinned staging, async copy)."""
    gen = torch.Generator().manual_seed(0)
    rows, width, edges = 1 << 16, 64, 1 << 18
    cpu = device.type == "cpu"
    before = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(1)
    try:
        host = torch.randn(2 * rows, width, generator=gen)
        idx = torch.randperm(2 * rows, generator=gen)[:rows]
        gather = _rate(lambda: host.index_select(0, idx), rows * width * 4, torch.device("cpu"))
        dst = rows // 2
        crow = torch.arange(0, edges + 1, edges // dst)
        col = torch.randint(0, rows, (edges,), generator=gen)
        adj = torch.sparse_csr_tensor(crow, col, torch.ones(edges), (dst, rows)).to(device)
        x = host[:rows].to(device)
        aggregate = _rate(lambda: adj @ x, edges * width * 4, device)
        a = torch.randn(1 << 14, 128, generator=gen).to(device)
        w = torch.randn(128, 128, generator=gen).to(device)
        macs = _rate(lambda: a @ w, (1 << 14) * 128 * 128, device)
        # a CPU stand-in for an accelerator "transfers" by a copy in host memory
        link = _rate(lambda: host.clone(), host.numel() * 4, device) if cpu else throughput([device]).hd
    finally:
        torch.set_num_threads(before)
    return DeviceRates(gather=gather, aggregate=aggregate, macs=macs, link=link, per_thread=cpu)


def device_rates(device: torch.device) -> DeviceRates:
    """:func:`measure_rates`, measured once per machine and cached beside the other throughputs (key
    ``hybrid:<device name>``)."""
    names = ("gather", "aggregate", "macs", "link")

    def measure() -> dict[str, float]:
        r = measure_rates(device)
        return {"gather": r.gather, "aggregate": r.aggregate, "macs": r.macs, "link": r.link}

    e = cached(f"hybrid:{_name(device)}", names, measure)
    return DeviceRates(e["gather"], e["aggregate"], e["macs"], e["link"], per_thread=device.type == "cpu")

