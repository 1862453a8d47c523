"""Planner of the offload engine: how many chunks keep one chunk's device footprint under the budget.

The offload engine (HongTu) holds on the device only the current chunk's rows, its block topology, the chunk's
intermediates and the model; everything per vertex lives in host memory. The footprint of a chunk with ``V``
destinations, ``R`` source rows (destinations and in-neighbours) and ``E`` in-edges is modelled per layer:

* block topology (CSR, its transpose, row ids) and the gathered ``[R, F_in]`` rows, twice: the next chunk is
  prefetched while this one computes;
* the input's gradient and, for layer 0, the dropout of the gathered features (``[R, F_in]`` each; later
  layers gather rows already activated and dropped out);
* the layer's own workspace (:meth:`~gnnscale.nn.base.BlockLayer.workspace_bytes`: per-edge attention tensors
  for GAT, per-destination activations otherwise; a user's layer measured, :mod:`~gnnscale.plan.layer_memory`);
* the destination side: the loaded ``[V, F_out]`` gradient, the next layer's input and its gradient, the cached
  aggregation and its gradient;

plus the parameters with their gradients and Adam moments. The largest chunk over all layers sets the peak, and
:data:`SAFETY` covers allocator rounding and short-lived temporaries the model does not list. That coarse bound
(:func:`chunk_peak_bytes`) prices only models the per-pass model (:mod:`~gnnscale.plan.offload_memory`) does not
list; GCN, SAGE, GraphConv, GAT and GIN stacks, and stacks of a user's layers run whole in every pass (PyG convs
other than those, measured by :mod:`~gnnscale.plan.layer_memory`), are priced pass by pass, each chunk with its own
sizes and its neighbours in the schedule, within a few percent above the counted peak.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.graph.graph import Graph
from gnnscale.nn import GNN, build_model
from gnnscale.nn.stack import Stack
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
    resolve_dedup,
)
from gnnscale.partition.plan import (
    ChunkCounter,
    PartitionPlan,
    chunk_neighbour_counts,
    load_or_chunk,
    load_or_partition,
    permute_csr,
)
from gnnscale.plan.host import cpu_chunk_bytes
from gnnscale.plan.layer_memory import workspace_bytes
from gnnscale.plan.memory import available_device_bytes
from gnnscale.plan.offload_memory import block_cache_bytes, epoch_peak, fused_dropout_min, modelled
from gnnscale.plan.throughput import throughput
from gnnscale.progress import stage
from gnnscale.units import format_bytes, format_bytes_up

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

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
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent partitioning (``partition_s``), splitting into chunks (``chunk_s``) and planning (``plan_s``)."""
    chunk_estimate: int = 0
    """The largest chunk's modelled peak, without the transition buffers (with the per-pass model of
    :mod:`~gnnscale.plan.offload_memory`, which prices each pass's buffers at that pass's width: with them)."""
    search_estimate: int = 0
    """The estimate the chunk-count search compares with the budget for this split: transition buffers bounded
    from chunk statistics (:func:`capacity_bound`) and, with the per-pass model, each batch's newcomer rows
    bounded by its rows; without resident blocks. At least :attr:`estimate` less the resident blocks."""
    resident_topology: bool = False
    """Every chunk's block (and transpose) stays on its device after its first use instead of being resent each
    pass: the budget holds them beside the chunk's peak."""


def chunk_sizes(indptr: Tensor, indices: Tensor, chunk_ptr: Tensor) -> Tensor:
    """``[K, 3]`` int64 per chunk: destinations ``V``, source rows ``R`` (``V`` + outside in-neighbours), in-edges
    ``E`` (plus one self-loop per destination, an upper bound for models that add them)."""
    counts = chunk_neighbour_counts(indptr, indices, chunk_ptr)
    V = chunk_ptr[1:] - chunk_ptr[:-1]
    return torch.stack([V, V + counts[:, 1], counts[:, 2] + V], dim=1)


def model_resident_bytes(model: Stack) -> int:
    """Parameters, their gradients and Adam's two moments, plus as much again for the optimiser step."""
    return 8 * sum(p.numel() * p.element_size() for p in model.parameters())


def chunk_peak_bytes(model: Stack, num_dst: int, num_src: int, num_edges: int) -> int:
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
        peak = max(peak, staged + inputs + workspace_bytes(layer, R, V, E) + dst_side + norm_bytes(model, l, V))
    return int(SAFETY * peak) + model_resident_bytes(model)


def norm_bytes(model: Stack, layer: int, num_dst: int) -> int:
    """Device bytes the model options of layer ``layer`` add per chunk of ``num_dst`` destinations: for each norm
    (inside the layer, as GIN's MLP has one, and on its output) the normalised rows, what backward saves of them
    (BatchNorm: ``x̂``; LayerNorm: the rows and their statistics) and their gradient. BatchNorm's statistics
    and gradient sums are a few vectors (:mod:`gnnscale.nn.batchnorm`); its extra passes hold no more than the
    real pass does. With ``--jk``, the last layer's pass holds every earlier layer's output rows besides."""
    width = model.block_layers[layer].out_features
    jk = 0
    if getattr(model, "lin", None) is not None and layer == len(model.block_layers) - 1:
        # --jk: the last layer's pass also reads every earlier output of its destinations, with their gradients
        jk = 2 * 4 * num_dst * width * len(model.block_layers)
    if getattr(model, "norm", "none") == "none":
        return jk
    count = (model.kind == "gin") + (layer < len(model.norms))
    return 3 * 4 * num_dst * width * count + jk


def sizes_from_rows(rows: list[Tensor], indptr: Tensor, chunk_ptr: Tensor) -> Tensor:
    """:func:`chunk_sizes` from known chunk rows (no second pass over the edges)."""
    V = chunk_ptr[1:] - chunk_ptr[:-1]
    R = torch.tensor([r.numel() for r in rows], dtype=torch.int64)
    E = indptr[chunk_ptr[1:]] - indptr[chunk_ptr[:-1]]
    return torch.stack([V, R, E + V], dim=1)


def transition_bytes(model: Stack, capacity: list[int] | None) -> int:
    """Device bytes of the transition buffers of ``capacity`` rows per device (an exchange plan's, or a bound):
    rows and their gradients at the widest row a layer moves, on the fullest device."""
    return 0 if not capacity else 2 * 4 * transition_width(model) * max(capacity)


def _estimate(model: Stack, sizes: Tensor) -> int:
    V, R, E = sizes[:, 0], sizes[:, 1], sizes[:, 2]
    # the footprint grows with each of V, R and E: bound it with their maxima over chunks
    return chunk_peak_bytes(model, int(V.max()), int(R.max()), int(E.max()))


def transition_width(model: Stack) -> int:
    """The widest row a layer pass moves through the transition buffers."""
    return max(max(layer.in_features, layer.out_features) for layer in model.block_layers)


def capacity_bound(sizes: Tensor, owners: Tensor | None, part_sizes: list[int], chunks: int, mode: str,
                   device_of: list[int]) -> list[int]:
    """Rows of each device's transition buffer under any schedule, from chunk statistics alone (no exchange plan).

    ``reuse`` is exact (a partition's buffer holds its largest chunk). ``full`` with one partition is exact too
    (the batch's set is its one chunk's rows); with several, partition ``b``'s set in a batch is at most the sum
    over partitions of their largest chunk's rows owned by ``b``, and at most ``|V_b|``.

    Args:
        sizes: ``[K, 3]`` per chunk ``V, R, E`` (:func:`chunk_sizes`).
        owners: ``[K, m]`` rows of chunk ``k`` owned by partition ``b`` (needed for ``full`` with ``m > 1``).
    """
    m, n = len(part_sizes), chunks
    devices = max(device_of) + 1
    cap = [0] * m
    if mode != "none":
        R = sizes[:, 1].view(m, n)
        if mode == "reuse" or m == 1:
            cap = R.max(dim=1).values.tolist()
        else:
            assert owners is not None
            per = owners.view(m, n, m).max(dim=1).values.sum(dim=0)  # [b]: sum over i of max_j |N_ij ∩ V_b|
            cap = [min(int(c), size) for c, size in zip(per.tolist(), part_sizes, strict=True)]
    out = [0] * devices
    for b in range(m):
        out[device_of[b]] += cap[b]
    return out


def topology_bytes(model: Stack, sizes: Tensor, num_nodes: int) -> Tensor:
    """``[K]`` bytes of each chunk's block on the device as the engine builds it: CSR (int32 while it fits),
    weights when the adjacency is normalised, source ids, and the transpose when a layer's backward uses it."""
    V, R, E = sizes[:, 0], sizes[:, 1], sizes[:, 2]
    idx = 4 if num_nodes < 2**31 else 8
    weights = 4 * E if model.adjacency.norm == "gcn" else 0
    total = idx * (V + 1) + idx * E + weights + idx * R
    if any(layer.sparse_backward for layer in model.block_layers):
        total = total + idx * (R + 1) + idx * E + weights
    return total


_MEMO: dict[int, tuple[Any, tuple[Any, ...], OffloadPlan]] = {}


def plan_offload(graph: Graph, config: TrainConfig, device: rt.Device, model: Stack | None = None) -> OffloadPlan:
    """Partition ``graph``, choose the chunk count, the chunker and the schedule for ``config``.

    Preprocessing runs each expensive step once: METIS once per (graph, method, partitions, seed), saved (see
    :func:`~gnnscale.partition.load_or_partition`); the chunk count is searched (steps in proportion to the
    overshoot, then bisection) on range splits priced from chunk statistics alone -- the per-pass model of
    :mod:`~gnnscale.plan.offload_memory` in the range order, newcomer rows bounded, transition buffers bounded
    (:func:`capacity_bound`) -- without building any exchange plan or running METIS; the chosen split is then
    built once and priced with its schedule and exchange plan. A ``metis`` chunker runs METIS at the chosen
    count (and, only when those less balanced chunks do not fit, at a larger one); ``auto`` choices
    (``config.chunker``, ``config.reorganize``) take the candidate with the lower Eq. 4 cost. When the budget
    also holds every chunk's topology, blocks stay resident on the device. The plan is memoised per graph and
    config, so an engine's checks and its set-up share it.

    Raises:
        ConfigError: no chunk count fits the budget (the message names the smallest budget that would), or the
            forced ``--chunks`` does not fit.
    """
    devices = list(config.devices) if config.devices else [str(device)]
    accelerator = rt.is_accelerator(rt.resolve_device(devices[0]) if config.devices else device)
    dedup = resolve_dedup(config.dedup, accelerator)
    # without a budget, the device's size too: two sim devices of one name may have pools of different sizes
    size = rt.mem_get_info(device)[1] if config.memory_budget is None else None
    workers = [rt.resolve_device(d) for d in config.devices] if config.devices else [device]
    # under --host-memory the chunk budget bounds the process's resident peak, not only the counted live bytes:
    # there the planner keeps pricing dropout the torch way and slices as copies (rows come from the disk tier and
    # the spill files into buffers); measured: the fused-kernel and view pricing let an 8 MB run's peak pass its
    # bound by 30-40 MiB (tests/test_host_bound.py)
    bounded = config.host_memory is not None
    fused_min = math.inf if bounded else fused_dropout_min(workers)
    views = not any(rt.is_accelerator(d) for d in workers) and not bounded
    key = (graph.num_nodes, graph.num_edges, config.model, config.layers, config.hidden, config.heads,
           config.partitions, config.chunks, config.partition_method, config.seed, config.memory_budget,
           config.host_memory,
           str(config.plan_dir), dedup, config.chunker, config.reorganize, tuple(devices), str(device), size, fused_min,
           None if model is None or isinstance(model, GNN) else id(model))  # a user's model: its own plan
    memo = _MEMO.get(id(graph))
    if memo is not None and memo[0]() is graph and memo[1] == key:
        return memo[2]
    budget = (config.memory_budget if config.memory_budget is not None
              else cpu_chunk_bytes(config.host_memory) if config.host_memory is not None and not accelerator
              and config.chunks is None  # the planner chooses the chunks in the budget's share (forced: priced)
              else config.host_memory if config.host_memory is not None and not accelerator
              else available_device_bytes(device))  # type: ignore[arg-type]  # any runtime device
    m = config.partitions
    if len(devices) > m:
        raise ConfigError(f"--devices lists {len(devices)} devices but --partitions is {m}; use at least one "
                          "partition per device")
    if model is None:
        assert graph.num_classes is not None
        model = build_model(config.model, graph.num_features, config.hidden, graph.num_classes, layers=config.layers,
                            dropout=config.dropout, heads=config.heads, seed=config.seed)
    timings: dict[str, float] = {}
    with stage("partition", timings):
        base, path, reused = load_or_partition(graph, m, config.chunks or 1, config.partition_method,
                                               config.seed, config.plan_dir)
    device_of = [i % len(devices) for i in range(m)]
    part_sizes = (base.part_ptr[1:] - base.part_ptr[:-1]).tolist()
    limit = min(min(part_sizes), MAX_CHUNKS_PER_PARTITION)
    need_owners = dedup == "full" and m > 1

    def price(ip: Tensor, ix: Tensor, chunk_ptr: Tensor, chunks: int, sizes: Tensor) -> tuple[int, int]:
        """The largest chunk's modelled peak, and the transition buffers' bytes bounded (:func:`capacity_bound`),
        of the split ``chunk_ptr`` of the renumbered CSR ``ip, ix`` whose chunk sizes are ``sizes``."""
        owners = ChunkCounter.of(ip, ix).owners(chunk_ptr, base.part_ptr) if need_owners else None
        cap = capacity_bound(sizes, owners, part_sizes, chunks, dedup, device_of)
        if per_pass:  # the passes' own buffers, priced in the schedule (range order here; build() re-prices)
            caps[id(sizes)] = cap
            return pass_priced(sizes, default_schedule(m, chunks), cap, False), 0
        return _estimate(model, sizes), transition_bytes(model, cap)

    def pass_priced(sizes: Tensor, schedule: Tensor, cap: list[int], resident: bool,
                    exchange: ExchangePlan | None = None) -> int:
        """The per-pass model's epoch peak (:func:`~gnnscale.plan.offload_memory.epoch_peak`) of chunks of
        ``sizes`` run in ``schedule`` with transition buffers of ``cap`` rows; the newcomer rows each batch loads
        are ``exchange``'s when planned, else bounded by the batch's rows (an estimate that can only drop once
        the exchange is planned)."""
        moves = None if exchange is None else [[mv.new_rows for mv in dev] for dev in exchange.moves]
        return epoch_peak(model, sizes, schedule, device_of, cap, exchange=dedup != "none",
                          resident=resident, num_nodes=graph.num_nodes, moves=moves, fused_min=fused_min,
                          views=views)[0]

    per_pass = modelled(model)
    caps: dict[int, list[int]] = {}
    searched: dict[int, int] = {}
    with stage("chunk", timings):
        indptr, indices, _ = permute_csr(graph.indptr, graph.indices, None, base.perm, base.inverse())

        def estimate(n: int) -> int:
            """Modelled peak of the range split into ``n`` chunks per partition, transition buffers bounded."""
            if n not in searched:
                chunk_ptr = base.with_chunks(graph, n).chunk_ptr
                searched[n] = sum(price(indptr, indices, chunk_ptr, n, chunk_sizes(indptr, indices, chunk_ptr)))
            return searched[n]

        if config.chunks is not None:
            n = config.chunks
        else:
            # each try counts every chunk's in-neighbours (a pass over the edges): step in proportion to the
            # overshoot (the peak falls about as 1/n) rather than doubling, then bisect
            n, lo = 1, 0
            while estimate(n) > budget and n < limit:
                lo, n = n, min(limit, max(n + 1, math.ceil(n * searched[n] / budget)))
            # estimate(lo) > budget or lo == 0: binary search for the fewest chunks that fit
            while searched[n] <= budget and n - lo > 1 and n > 1:
                mid = (lo + n) // 2
                if estimate(mid) <= budget:
                    n = mid
                else:
                    lo = mid
            if searched[n] > budget:
                raise ConfigError(
                    f"the offload engine needs at least {format_bytes_up(searched[n])} of device memory for "
                    f"{graph.name} ({config.model}, hidden {config.hidden}, {config.layers} layers, --dedup "
                    f"{dedup}; tried up to {limit} chunks per partition), more than the budget "
                    f"({format_bytes(budget)})")

    tps: list[Throughput] = []

    def tp() -> Throughput:
        if not tps:
            # measured where the devices' tensors are (a sim device's: host memory)
            tps.append(throughput([rt.torch_device(rt.resolve_device(d)) for d in devices]))
        return tps[0]

    costs: dict[str, float] = {}
    reorg_options = [False] if config.reorganize == "off" or dedup == "none" else \
        [True] if config.reorganize == "on" else [False, True]

    priced: dict[int, Tensor] = {}
    """Per plan (by id): its chunks' sizes, for re-pricing with the exact buffers and resident blocks."""

    def build(part: PartitionPlan, rows: list[Tensor], chunk_est: int, reorg: bool, bound: int,
              sizes: Tensor | None = None) -> OffloadPlan:
        """The split ``part`` scheduled (``reorg``: by Algorithm 4) with its volumes; the transition buffers are
        priced by ``bound`` until :func:`finish` plans them exactly (only the chosen candidate is)."""
        m_, n_ = part.partitions, part.chunks
        sched = reorganize(rows, m_, n_, graph.num_nodes) if reorg else default_schedule(m_, n_)
        if per_pass and sizes is not None:
            chunk_est = pass_priced(sizes, sched, caps[id(sizes)], False)
        plan = OffloadPlan(part, chunk_est + bound, budget, path, reused, {}, rows, sched, reorg, dedup,
                           comm_volume(rows, sched), None, len(devices))
        plan.chunk_estimate, plan.search_estimate = chunk_est, chunk_est + bound
        if sizes is not None:
            priced[id(plan)] = sizes
        return plan

    def finish(plan: OffloadPlan) -> OffloadPlan:
        """Plan the transition buffers exactly (the estimate can only drop: the bound holds for any schedule)."""
        if dedup != "none" and plan.exchange is None:
            plan.exchange = plan_exchange(plan.rows, plan.partition.part_ptr, plan.schedule, dedup,
                                          device_of, plan.volume)
            if per_pass:
                plan.chunk_estimate = plan.estimate = pass_priced(priced[id(plan)], plan.schedule,
                                                                  plan.exchange.capacity, False, plan.exchange)
            else:
                plan.estimate = plan.chunk_estimate + transition_bytes(model, plan.exchange.capacity)
        return plan

    def candidate(part: PartitionPlan) -> OffloadPlan:
        """The split ``part``, priced with the transition-buffer bound (``auto`` reorganisation is decided by
        :func:`scheduled`)."""
        ip, ix = _permuted(graph, part, base, indptr, indices)
        rows = chunk_rows(ip, ix, part.chunk_ptr)
        sizes = sizes_from_rows(rows, ip, part.chunk_ptr)
        chunk_est, bound = price(ip, ix, part.chunk_ptr, part.chunks, sizes)
        return build(part, rows, chunk_est, reorg_options[0], bound, sizes)

    def fits(plan: OffloadPlan) -> bool:
        """Within the budget, the transition buffers planned exactly when their bound alone does not fit."""
        return plan.estimate <= budget or finish(plan).estimate <= budget

    def cost(plan: OffloadPlan) -> tuple[float, int]:
        """Eq. 4, then (equal cost) fewer rows over the bus."""
        value = comm_cost(plan.volume, dedup, tp())
        costs[f"{plan.partition.chunker}{plan.partition.chunks}{'-reorganized' if plan.reorganized else ''}"] = value
        return value, plan.volume.h2d(dedup)

    def scheduled(plan: OffloadPlan) -> OffloadPlan:
        """With ``--reorganize auto``: Algorithm 4's schedule when it lowers the modelled cost and still fits."""
        if len(reorg_options) == 1:
            return finish(plan)
        other = build(plan.partition, plan.rows, plan.chunk_estimate, True, plan.estimate - plan.chunk_estimate,
                      priced.get(id(plan)))
        return finish(other if cost(other) < cost(plan) and fits(other) else plan)

    def forced_too_big(plan: OffloadPlan) -> ConfigError:
        return ConfigError(f"--chunks {plan.partition.chunks} with --dedup {dedup} needs about "
                           f"{format_bytes(plan.estimate)} of device memory (chunk and transition buffers), more "
                           f"than the budget ({format_bytes(budget)}); use more chunks, --dedup none, or leave "
                           "--chunks out to let the planner choose")

    def metis_split(n: int) -> OffloadPlan | None:
        """METIS chunks at ``n`` per partition; when those (vertex-balanced, so less even in edges) do not fit, once
        more at the count their overshoot suggests. ``None`` when they still do not fit."""
        for _ in range(2):
            cand = candidate(load_or_chunk(base, graph, n, "metis", config.plan_dir))
            if fits(cand) or config.chunks is not None or n >= limit:
                return cand if cand.estimate <= budget or config.chunks is not None else None
            n = min(limit, max(n + 1, math.ceil(n * cand.estimate / budget)))
        return None

    with stage("plan", timings):
        found: list[OffloadPlan] = []
        if config.chunker in ("range", "auto"):
            cand = candidate(base.with_chunks(graph, n))
            if not fits(cand):  # only a forced --chunks gets here: the search's bound fits
                raise forced_too_big(cand)
            found.append(scheduled(cand))
        if config.chunker in ("metis", "auto"):
            try:
                metis = metis_split(n)
            except ConfigError:  # e.g. METIS left a chunk empty: the range split still applies
                if config.chunker == "metis":
                    raise
                metis = None
            if metis is not None:
                if not fits(metis):
                    raise forced_too_big(metis)
                found.append(scheduled(metis))
            elif config.chunker == "metis":
                raise ConfigError(f"the metis chunker's chunks do not fit the budget ({format_bytes(budget)}) at "
                                  f"{n} chunks per partition or the next count tried; use --chunker range")
        plan = found[0] if len(found) == 1 else min(found, key=cost)
        plan.searched = dict(sorted(searched.items()))
        plan.costs = costs
        ip = _permuted(graph, plan.partition, base, indptr, indices)[0]
        plan_sizes = sizes_from_rows(plan.rows, ip, plan.partition.chunk_ptr)
        topo = topology_bytes(model, plan_sizes, graph.num_nodes)
        if per_pass:  # resident blocks keep what their layers cache on them too
            V, R, E = plan_sizes.double().unbind(1)
            topo = topo + block_cache_bytes(model, V, R, E).long()
        per_device = [0] * len(devices)
        for i in range(m):
            k0 = i * plan.partition.chunks
            per_device[device_of[i]] += int(topo[k0 : k0 + plan.partition.chunks].sum())
        if per_pass:  # the passes without per-chunk block loads, the blocks held beside them
            cap = plan.exchange.capacity if plan.exchange is not None else []
            resident = pass_priced(priced[id(plan)], plan.schedule, cap, True, plan.exchange) + max(per_device)
            if resident <= budget:
                plan.resident_topology, plan.estimate = True, resident
        elif plan.estimate + max(per_device) <= budget:
            plan.resident_topology = True
            plan.estimate += max(per_device)
    plan.timings = timings
    _MEMO.clear()
    _MEMO[id(graph)] = (weakref.ref(graph), key, plan)
    return plan


def _permuted(graph: Graph, part: PartitionPlan, base: PartitionPlan, indptr: Tensor,
              indices: Tensor) -> tuple[Tensor, Tensor]:
    """``part``'s renumbered CSR pointers (the base's when the chunker kept its order)."""
    if part.perm is base.perm:
        return indptr, indices
    return permute_csr(graph.indptr, graph.indices, None, part.perm, part.inverse())[:2]


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
            f"{', reorganized' if plan.reorganized else ''}) on {plan.devices} device(s)"
            f"{', topology resident' if plan.resident_topology else ''}, estimated peak "
            f"{format_bytes(plan.estimate)} of a {format_bytes(plan.budget)} budget ({share:.0f}%); --dedup "
            f"{plan.dedup}: {v.h2d(plan.dedup) / n:.2f}|V| rows host->device per layer pass of {v.ori / n:.2f}|V| "
            f"read; partition plan {saved}")
