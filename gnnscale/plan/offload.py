"""Planner of the offload engine: how many chunks keep one chunk's device footprint under the budget.

The offload engine (HongTu) holds on the device only the current chunk's rows, its block topology, the chunk's
intermediates and the model; everything per vertex lives in host memory. The footprint of a chunk with ``V``
destinations, ``R`` source rows (destinations and in-neighbours) and ``E`` in-edges is modelled per layer:

* block topology (CSR, its transpose, row ids) and the gathered ``[R, F_in]`` rows, twice: the next chunk is
  prefetched while this one computes;
* the input's gradient and, for layer 0, the dropout of the gathered features (``[R, F_in]`` each; later
  layers gather rows already activated and dropped out);
* the layer's own workspace (:meth:`~gnnscale.nn.base.BlockLayer.workspace_bytes`: per-edge attention tensors
  for GAT, per-destination activations otherwise);
* the destination side: the loaded ``[V, F_out]`` gradient, the next layer's input and its gradient, the cached
  aggregation and its gradient;

plus the parameters with their gradients and Adam moments. The largest chunk over all layers sets the peak, and
:data:`SAFETY` covers allocator rounding and short-lived temporaries the model does not list.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.graph.graph import Graph
from gnnscale.nn.model import GNN, build_model
from gnnscale.partition.dedup import (
    CommVolume,
    ExchangePlan,
    Throughput,
    chunk_rows,
    comm_cost,
    comm_volume,
    default_schedule,
    plan_exchange,
    reorganize,
)
from gnnscale.partition.plan import (
    PartitionPlan,
    chunk_neighbour_counts,
    load_or_chunk,
    load_or_partition,
    permute_csr,
)
from gnnscale.plan.memory import available_device_bytes, format_bytes

if TYPE_CHECKING:
    from gnnscale.train import TrainConfig

SAFETY = 1.25
MAX_CHUNKS_PER_PARTITION = 1024
"""The search stops here: beyond it per-chunk overheads dominate and the budget is unrealistic."""


@dataclass
class OffloadPlan:
    """The planner's answer: how the graph is cut and scheduled, and the estimated peak device bytes."""

    partition: PartitionPlan
    estimate: int
    budget: int
    plan_path: Any
    reused_plan: bool
    searched: dict[int, int]
    """Chunks per partition tried by the search -> estimated peak bytes (range chunks)."""
    rows: list[Tensor]
    """Per chunk: its destinations, then its sorted outside in-neighbours (the chunk's source rows)."""
    schedule: Tensor
    """``[m, n]`` chunk ids per partition and batch (Algorithm 4's output when reorganised)."""
    reorganized: bool
    dedup: str
    volume: CommVolume
    exchange: ExchangePlan | None
    """Transition buffers (``reuse``/``full``), ``None`` for ``--dedup none``."""
    devices: int = 1
    costs: dict[str, float] = field(default_factory=dict)
    """Eq. 4 modelled seconds per layer pass of the candidates weighed by ``auto`` choices."""
    resident_topology: bool = False
    """Every chunk's block (and transpose) stays on its device after its first use instead of being resent each
    pass: the budget holds them beside the chunk's peak."""


def chunk_sizes(indptr: Tensor, indices: Tensor, chunk_ptr: Tensor) -> Tensor:
    """``[K, 3]`` int64 per chunk: destinations ``V``, source rows ``R`` (``V`` + outside in-neighbours), in-edges
    ``E`` (plus one self-loop per destination, an upper bound for models that add them)."""
    counts = chunk_neighbour_counts(indptr, indices, chunk_ptr)
    V = chunk_ptr[1:] - chunk_ptr[:-1]
    return torch.stack([V, V + counts[:, 1], counts[:, 2] + V], dim=1)


def model_resident_bytes(model: GNN) -> int:
    """Parameters, their gradients and Adam's two moments, plus as much again for the optimiser step."""
    return 8 * sum(p.numel() * p.element_size() for p in model.parameters())


def chunk_peak_bytes(model: GNN, num_dst: int, num_src: int, num_edges: int) -> int:
    """Modelled peak device bytes while training one chunk, over all layers (see module docstring)."""
    V, R, E = num_dst, num_src, num_edges
    peak = 0
    for l, layer in enumerate(model.block_layers):
        f_in, f_out = layer.in_features, layer.out_features
        topology = 4 * (V + 1) + 12 * E + 4 * (R + 1) + 12 * E + 16 * R  # block, transpose, ids
        staged = 2 * (topology + 4 * R * f_in)  # this chunk and the prefetched next one
        # the input's gradient; layer 0 also masks its gathered features (dropout temporaries), later layers
        # gather rows already activated and dropped out
        inputs = 4 * R * f_in * (6 if l == 0 else 2)
        dst_side = 4 * V * f_out * 6 + 4 * V * f_in * 3  # gradient rows, next input + grad; cached aggregation
        peak = max(peak, staged + inputs + layer.workspace_bytes(R, V, E) + dst_side)
    return int(SAFETY * peak) + model_resident_bytes(model)


def sizes_from_rows(rows: list[Tensor], indptr: Tensor, chunk_ptr: Tensor) -> Tensor:
    """:func:`chunk_sizes` from known chunk rows (no second pass over the edges)."""
    V = chunk_ptr[1:] - chunk_ptr[:-1]
    R = torch.tensor([r.numel() for r in rows], dtype=torch.int64)
    E = indptr[chunk_ptr[1:]] - indptr[chunk_ptr[:-1]]
    return torch.stack([V, R, E + V], dim=1)


def transition_bytes(model: GNN, exchange: ExchangePlan | None) -> int:
    """Device bytes of the transition buffers: rows and their gradients at the widest row a layer moves."""
    if exchange is None:
        return 0
    width = max(max(layer.in_features, layer.out_features) for layer in model.block_layers)
    return 2 * 4 * width * max(exchange.capacity)


def _estimate(model: GNN, sizes: Tensor) -> int:
    V, R, E = sizes[:, 0], sizes[:, 1], sizes[:, 2]
    # the footprint grows with each of V, R and E: bound it with their maxima over chunks
    return chunk_peak_bytes(model, int(V.max()), int(R.max()), int(E.max()))


_MEMO: dict[int, tuple[Any, tuple[Any, ...], OffloadPlan]] = {}


def plan_offload(graph: Graph, config: TrainConfig, device: torch.device, model: GNN | None = None) -> OffloadPlan:
    """Partition ``graph``, choose the chunk count, the chunker and the schedule for ``config``.

    The METIS step runs once per (graph, method, partitions, seed) and is saved (see
    :func:`~gnnscale.partition.load_or_partition`); the chunk-count search re-splits it into range chunks cheaply
    (doubling, then bisection, on the modelled peak of the largest chunk). The chosen split is then checked with
    the transition buffers of ``config.dedup`` added, taking more chunks while it does not fit. ``auto`` choices
    (``config.chunker``, ``config.reorganize``) take the candidate with the lower Eq. 4 cost.

    Raises:
        ConfigError: no chunk count fits the budget (the message names the smallest budget that would), or the
            forced ``--chunks`` does not fit.
    """
    budget = config.memory_budget if config.memory_budget is not None else available_device_bytes(device)
    devices = list(config.devices) if config.devices else [str(device)]
    key = (graph.num_nodes, graph.num_edges, config.model, config.layers, config.hidden, config.heads,
           config.partitions, config.chunks, config.partition_method, config.seed, budget, str(config.plan_dir),
           config.dedup, config.chunker, config.reorganize, tuple(devices))
    memo = _MEMO.get(id(graph))
    if memo is not None and memo[0]() is graph and memo[1] == key:
        return memo[2]
    m = config.partitions
    if len(devices) > m:
        raise ConfigError(f"--devices lists {len(devices)} devices but --partitions is {m}; use at least one "
                          "partition per device")
    if model is None:
        assert graph.num_classes is not None
        model = build_model(config.model, graph.num_features, config.hidden, graph.num_classes, layers=config.layers,
                            dropout=config.dropout, heads=config.heads, seed=config.seed)
    base, path, reused = load_or_partition(graph, m, config.chunks or 1, config.partition_method,
                                           config.seed, config.plan_dir)
    indptr, indices, _ = permute_csr(graph.indptr, graph.indices, None, base.perm, base.inverse())
    smallest_part = int((base.part_ptr[1:] - base.part_ptr[:-1]).min())
    limit = min(smallest_part, MAX_CHUNKS_PER_PARTITION)
    searched: dict[int, int] = {}

    def estimate(n: int) -> int:
        if n not in searched:
            searched[n] = _estimate(model, chunk_sizes(indptr, indices, base.with_chunks(graph, n).chunk_ptr))
        return searched[n]

    if config.chunks is not None:
        n = config.chunks
        if estimate(n) > budget:
            raise ConfigError(f"--chunks {n} needs about {format_bytes(searched[n])} of device memory per "
                              f"chunk, more than the budget ({format_bytes(budget)}); use more chunks or leave "
                              "--chunks out to let the planner choose")
    else:
        n = 1
        while estimate(n) > budget and n < limit:
            n = min(2 * n, limit)
        lo = n // 2  # estimate(lo) > budget or lo == 0: binary search for the fewest chunks that fit
        while searched[n] <= budget and n - lo > 1 and n > 1:
            mid = (lo + n) // 2
            if estimate(mid) <= budget:
                n = mid
            else:
                lo = mid
    device_of = [i % len(devices) for i in range(m)]
    tps: list[Throughput] = []

    def tp() -> Throughput:
        if not tps:
            from gnnscale.plan.throughput import throughput

            tps.append(throughput([torch.device(d) for d in devices]))
        return tps[0]

    costs: dict[str, float] = {}

    reorg_options = [False] if config.reorganize == "off" or config.dedup == "none" else \
        [True] if config.reorganize == "on" else [False, True]

    def build(part: PartitionPlan, rows: list[Tensor], est: int, reorg: bool) -> OffloadPlan:
        m_, n_ = part.partitions, part.chunks
        sched = reorganize(rows, m_, n_, graph.num_nodes) if reorg else default_schedule(m_, n_)
        vol = comm_volume(rows, sched)
        exchange = None if config.dedup == "none" else plan_exchange(rows, part.part_ptr, sched, config.dedup,
                                                                     device_of, vol)
        return OffloadPlan(part, est + transition_bytes(model, exchange), budget, path, reused, {}, rows, sched,
                           reorg, config.dedup, vol, exchange, len(devices))

    def candidate(chunker: str, n: int) -> OffloadPlan:
        """The split of every partition into ``n`` chunks by ``chunker`` with its total estimate (``auto``
        reorganisation is decided by :func:`scheduled` once the chunk count is known)."""
        part = load_or_chunk(base, graph, n, chunker, config.plan_dir)
        ip, ix = permute_csr(graph.indptr, graph.indices, None, part.perm, part.inverse())[:2]
        rows = chunk_rows(ip, ix, part.chunk_ptr)
        return build(part, rows, _estimate(model, sizes_from_rows(rows, ip, part.chunk_ptr)), reorg_options[0])

    def cost(plan: OffloadPlan) -> tuple[float, int]:
        """Eq. 4, then (equal cost) fewer rows over the bus."""
        value = comm_cost(plan.volume, config.dedup, tp())
        costs[f"{plan.partition.chunker}{plan.partition.chunks}{'-reorganized' if plan.reorganized else ''}"] = value
        return value, plan.volume.h2d(config.dedup)

    def scheduled(plan: OffloadPlan) -> OffloadPlan:
        """With ``--reorganize auto``: Algorithm 4's schedule when it lowers the modelled cost and still fits."""
        if len(reorg_options) == 1:
            return plan
        chunk_est = plan.estimate - transition_bytes(model, plan.exchange)
        other = build(plan.partition, plan.rows, chunk_est, True)
        return other if other.estimate <= budget and cost(other) < cost(plan) else plan

    def fit(chunker: str, n: int) -> OffloadPlan | None:
        """The split by ``chunker`` with the fewest chunks from ``n`` up (to the limit) that fits the budget, its
        buffers included: doubling, then bisection, as for the chunks alone."""
        cand = candidate(chunker, n)
        if cand.estimate <= budget:
            return cand
        if config.chunks is not None:
            raise ConfigError(f"--chunks {n} with --dedup {config.dedup} needs about "
                              f"{format_bytes(cand.estimate)} of device memory (chunk and transition buffers), "
                              f"more than the budget ({format_bytes(budget)}); use more chunks or --dedup none")
        lo = hi = n
        while cand.estimate > budget:
            if hi >= limit:
                return None
            lo, hi = hi, min(limit, 2 * hi)
            cand = candidate(chunker, hi)
        while hi - lo > 1:  # lo fails, hi fits
            mid = (lo + hi) // 2
            c = candidate(chunker, mid)
            if c.estimate <= budget:
                hi, cand = mid, c
            else:
                lo = mid
        return cand

    def too_big() -> ConfigError:
        # the range split at the chunk limit: the search always reaches it, so this budget is enough
        need = candidate("range", limit).estimate if config.chunks is None else min(searched.values())
        return ConfigError(
            f"the offload engine needs at least {format_bytes(need)} of device memory for {graph.name} "
            f"({config.model}, hidden {config.hidden}, {config.layers} layers, --dedup {config.dedup}; tried up "
            f"to {limit} chunks per partition), more than the budget ({format_bytes(budget)})")

    if config.chunks is None and searched[n] > budget:
        raise too_big()
    chunkers = ["range", "metis"] if config.chunker == "auto" else [config.chunker]
    found = []
    for chunker in chunkers:
        try:
            cand = fit(chunker, n)
        except ConfigError:
            if len(chunkers) == 1:
                raise
            continue  # e.g. METIS left a chunk empty: the other chunker still applies
        if cand is not None:
            found.append(scheduled(cand))
    if not found:
        raise too_big()
    plan = found[0] if len(found) == 1 else min(found, key=cost)
    plan.searched = dict(sorted(searched.items()))
    plan.costs = costs
    _MEMO.clear()
    _MEMO[id(graph)] = (weakref.ref(graph), key, plan)
    return plan


def describe(plan: OffloadPlan) -> str:
    """One line for the CLI: chunks chosen and the estimate against the budget."""
    p = plan.partition
    share = 100 * plan.estimate / plan.budget if plan.budget else math.nan
    method = p.method if p.partitions > 1 else "one partition"
    saved = "not saved" if plan.plan_path is None else (
        f"{'reused' if plan.reused_plan else 'saved'} {plan.plan_path}")
    v = plan.volume
    n = max(p.num_nodes, 1)
    return (f"offload plan: {p.partitions} partition(s) x {p.chunks} chunk(s) ({method}, {p.chunker} chunks"
            f"{', reorganized' if plan.reorganized else ''}) on {plan.devices} device(s), estimated peak "
            f"{format_bytes(plan.estimate)} of a {format_bytes(plan.budget)} budget ({share:.0f}%); --dedup "
            f"{plan.dedup}: {v.h2d(plan.dedup) / n:.2f}|V| rows host->device per layer pass of {v.ori / n:.2f}|V| "
            f"read; partition plan {saved}")
