"""Predicted epochs of the full-graph engines (:class:`~gnnscale.plan.epoch_time.EpochTime`): the in-memory
engine's computation, the offload engine's HongTu model (Eq. 4's row traffic on the planner's own chunks and
schedule, the recomputation and caching the engine does, the host's gathers and scatters, the disk tier and spill
files), and the task-parallel engine's NeutronTask model (Eqs. 5-8's assignment, its pipeline over subgraphs).

Every computation is counted once (:mod:`gnnscale.plan.work`) and priced with a machine's
:class:`~gnnscale.plan.rates.Rates`; each model's terms are named so a test can remove one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gnnscale import runtime as rt
from gnnscale.graph.graph import Graph
from gnnscale.nn.stack import Stack
from gnnscale.partition.dedup import Throughput, comm_cost
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.memory import estimate_host_bytes
from gnnscale.plan.offload import OffloadPlan
from gnnscale.plan.rates import Rates
from gnnscale.plan.taskparallel import TaskPlan
from gnnscale.plan.work import (
    LayerWork,
    compute_terms,
    device_bytes,
    input_dropout_s,
    layer_work,
    parameters_of,
)
from gnnscale.store.disk import mapped_npy

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


def _compute(graph: Graph, config: TrainConfig, rates: Rates, model: Stack | None) -> tuple[
        list[LayerWork], dict[str, float]]:
    work = layer_work(graph, config, model)
    terms = compute_terms(work, rates, num_classes=graph.num_classes or 1,
                          params=parameters_of(graph, config, model))
    return work, terms


def predict_inmemory(graph: Graph, config: TrainConfig, rates: Rates, *, model: Stack | None = None) -> EpochTime:
    """The in-memory engine: the whole graph's computation on one device, nothing moved."""
    work, terms = _compute(graph, config, rates, model)
    return EpochTime(sum(terms.values()), terms, {"device": device_bytes(work)}, "counted work")


# ------------------------------------------------------------------------------------------------ offload (HongTu)
def _moved_width(w: LayerWork) -> int:
    """Width of the rows a chunk loads for this layer (the projected rows of a layer that projects first)."""
    return w.agg_width if w.projects else w.in_width


def offload_traffic(plan: OffloadPlan, work: list[LayerWork], rates: Rates, *, in_place: bool) -> tuple[
        dict[str, float], int]:
    """Seconds of the offload epoch's row traffic by kind, and its bytes: ``h2d`` (Eq. 4 per layer pass: the
    chunks' source rows, loaded again in backward by a layer that recomputes its aggregation), ``store`` (each
    layer's output and cached aggregation written to host memory), ``load_grad`` (the output gradient and the
    cached aggregation read back in backward) and ``scatter`` (the source rows' gradients added into host memory,
    Eq. 4's volume the other way). ``in_place``: the CPU without budgets, which reads and writes the host rows
    where they are (only layer 0's gathered, dropped-out features move)."""
    tp = Throughput(hd=rates.copy, dd=rates.copy, ru=rates.gather)
    V = work[0].rows if work else 0
    out = {"h2d": 0.0, "store": 0.0, "load_grad": 0.0, "scatter": 0.0}
    moved = 0
    last = len(work) - 1
    for i, w in enumerate(work):
        width = _moved_width(w)
        loads = 1 if w.cacheable or i == last else 2  # a recomputed layer loads its sources again in backward
        if not in_place or i == 0:
            out["h2d"] += loads * comm_cost(plan.volume, plan.dedup, tp, 4 * width)
            moved += loads * plan.volume.h2d(plan.dedup) * 4 * width
        if in_place:
            continue
        stored = (w.out_width if i < last else 0) + (w.agg_width if w.cacheable and i < last else 0)
        out["store"] += 4 * V * stored / rates.copy
        back = (w.out_width + (w.agg_width if w.cacheable else 0)) if i < last else 0
        out["load_grad"] += 4 * V * back / rates.copy
        if w.source_grad:
            out["scatter"] += comm_cost(plan.volume, plan.dedup, tp, 4 * width)
            moved += plan.volume.h2d(plan.dedup) * 4 * width
        moved += 4 * V * (stored + back)
    return out, moved


def offload_recompute(work: list[LayerWork], rates: Rates) -> float:
    """Seconds the backward recomputes (HongTu §4.2's recomputation-caching hybrid): a cached layer its UPDATE
    from the cached aggregation, any other layer (GAT) the whole layer; the last layer nothing (its forward and
    backward are fused per chunk)."""
    out = 0.0
    for w in work[:-1]:
        out += w.dense_s(rates)
        if not w.cacheable:
            out += w.aggregate_s(rates) + w.attention_s(rates) / 2
    return out


OPS_PER_CHUNK_LAYER = 53
"""Torch ops one chunk runs per layer and direction (forward or backward) in the offload engine's loop, for a layer
without per-edge work (counted with torch's profiler: GCN, csbm 6,000, 3 against 25 chunks: 684 and 5,370 ops a
two-layer epoch, 213 per chunk); :data:`OPS_PER_CHUNK_ATTENTION` for one with it (GAT: 799 per chunk)."""
OPS_PER_CHUNK_ATTENTION = 200


def counted_ops(plan: OffloadPlan, work: list[LayerWork]) -> int:
    """Ops of an offload epoch that the CPU's byte counter sees (each costs :attr:`Rates.counted_op` more)."""
    chunks = plan.partition.partitions * plan.partition.chunks
    return 2 * chunks * sum(OPS_PER_CHUNK_ATTENTION if w.heads else OPS_PER_CHUNK_LAYER for w in work)


def predict_offload(graph: Graph, config: TrainConfig, device: rt.Device, rates: Rates, plan: OffloadPlan, *,
                    model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime:
    """HongTu's epoch: the computation, divided over the ``G`` devices (each runs its partitions' chunks), plus
    Eq. 4's row traffic on ``plan``, which the ``G`` devices share (one host bus: ``cluster.devices_per_machine``),
    plus the recomputation, the disk tier's feature reads and the spill files' traffic. On an accelerator the
    row mover overlaps the traffic with the computation (the larger of the two); on the CPU they add up."""
    work, terms = _compute(graph, config, rates, model)
    accelerator = rt.is_accelerator(device)
    G = cluster.devices_per_machine or plan.devices
    share = G if accelerator else 1  # sim devices and CPU workers share the host's cores
    terms = {k: v / share for k, v in terms.items()}
    terms["recompute"] = offload_recompute(work, rates) / share
    in_place = not accelerator and config.memory_budget is None and config.host_memory is None
    traffic, moved = offload_traffic(plan, work, rates, in_place=in_place)
    terms.update(traffic)
    disk = 0
    if config.host_memory is not None and graph.x is not None and mapped_npy(graph.x) is not None:
        loads = 1 if work[0].cacheable else 2
        disk = loads * plan.volume.h2d(plan.dedup) * 4 * work[0].in_width
    if config.host_memory is not None:  # activations past the budget: written to --scratch and read back
        parts = estimate_host_bytes(graph, config, layer_copies=3, model=model)
        disk += 2 * max(parts.get("activations", 0) - config.host_memory, 0)
    terms["disk"] = disk / rates.disk if disk and rates.disk > 0 else 0.0
    # on the CPU with a budget, the engine counts its "device" bytes (LiveBytesCounter): a cost per op
    terms["counting"] = counted_ops(plan, work) * rates.counted_op if not accelerator and not in_place else 0.0
    compute = sum(v for k, v in terms.items() if k not in traffic and k != "disk")
    transfer = sum(traffic.values()) + terms["disk"]
    seconds = max(compute, transfer) if accelerator else compute + transfer
    tiers = {"host": moved, "device": device_bytes(work) + (moved if accelerator else 0)}
    if disk:
        tiers["disk"] = disk
    return EpochTime(seconds, terms, tiers, f"HongTu Eq. 4 on the plan's chunks + counted work, {G} device(s) "
                     "sharing the host bus")


# ---------------------------------------------------------------------------------------- taskparallel (NeutronTask)
def task_terms(graph: Graph, config: TrainConfig, rates: Rates, model: Stack | None) -> dict[str, float]:
    """Seconds of the T tasks (forward, the backward's recomputation, backward: NeutronTask §5.1 keeps nothing) and
    the P tasks (forward and backward propagations, dgat's edge task), each on one device, and the host traffic:
    the features read for the T tasks twice (and dropped out twice), ``H^0`` to the P tasks and its gradient
    back."""
    work, terms = _compute(graph, config, rates, model)
    t_work = [w for w in work if not w.edges and not w.heads]
    t_fwd = sum(w.dense_s(rates) for w in t_work)
    t_total = 2 * t_fwd + sum(w.dense_s(rates) * (2 if w.source_grad else 1) for w in t_work)
    p_total = terms["aggregate"] + terms["aggregate_backward"] + terms["attention"]
    p_total += sum(3 * w.dense_s(rates) for w in work if w.heads)  # the edge task's projections
    V, F = graph.num_nodes, max(graph.num_features, 1)
    C = graph.num_classes or 1
    redrop = input_dropout_s(V * F, rates)  # the recomputed T forward drops the features out again
    return {"t_tasks": t_total + terms["elementwise"] + redrop + terms["optimizer"], "p_tasks": p_total,
            "features": 2 * 4 * V * F / rates.copy, "handoff": 2 * 4 * V * C / rates.copy}


def predict_taskparallel(graph: Graph, config: TrainConfig, device: rt.Device, rates: Rates, plan: TaskPlan, *,
                         model: Stack | None = None) -> EpochTime:
    """NeutronTask's epoch on ``plan`` (Eqs. 7-8's ``N_t`` T and ``N_p`` P devices, ``S`` subgraphs): one device
    runs everything in turn; on several accelerators each side's work is split over its devices and the subgraphs
    pipeline: ``--dependency skip`` overlaps the T and P sides (the slower side, plus the faster side's share of
    one subgraph), ``exact`` overlaps only the T stages' chain (the P tasks wait for every T task). Devices that
    share the host's cores (the CPU) add up."""
    terms = task_terms(graph, config, rates, model)
    n, S = len(plan.devices), max(plan.subgraphs, 1)
    t, p = terms["t_tasks"], terms["p_tasks"]
    if n == 1 or not rt.is_accelerator(device):
        compute = t + p
    else:
        t_stage, p_stage = t / plan.n_t, p / plan.n_p
        if config.dependency == "skip":
            compute = max(t_stage, p_stage) + min(t_stage, p_stage) / S
        else:
            compute = t_stage * (S + len(plan.t_stages) - 1) / S + p_stage
    traffic = terms["features"] + terms["handoff"]
    seconds = compute + traffic
    V = graph.num_nodes
    host = 2 * 4 * V * max(graph.num_features, 1)
    work = layer_work(graph, config, model)
    tiers = {"host": host, "device": device_bytes(work) + 2 * 4 * V * (graph.num_classes or 1)}
    return EpochTime(seconds, terms, tiers, f"NeutronTask Eqs. 5-8: {plan.n_t} T / {plan.n_p} P device(s), "
                     f"{S} subgraph(s)")
