"""Predicted epochs of the sampled engines: the minibatch engine's (XGNN's placement cost: rows read per batch from
each tier of the global store, at that tier's rate) and the hybrid engine's (HyScale-GNN's Eqs. 5-13,
:class:`~gnnscale.plan.hybrid_model.HybridModel`), both fed with :class:`~gnnscale.plan.rates.Rates` and a few
sampled batches of the real graph (:class:`SampledProbe`: §V's sampling table, and where each batch's input rows
rank by hotness).

The work of a sampled batch's forward and backward is counted as every engine's is (:mod:`gnnscale.plan.work`,
:func:`block_work`): aggregation edges times width at the sparse aggregation's rate, dense ``2 x rows x in x out``
FLOPs forward and for the backward's products, elementwise passes at the memory rate, and the optimiser's step
per batch (:func:`~gnnscale.plan.work.optimizer_s`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.plan.epoch_time import Cluster, EpochTime
from gnnscale.plan.hybrid_measure import measure_sampling
from gnnscale.plan.hybrid_model import S_FEAT, BatchShape, DeviceRates, HybridModel, SamplingTable
from gnnscale.plan.hybrid_resources import Threads
from gnnscale.plan.rates import Rates
from gnnscale.plan.work import LayerWork, compute_terms, optimizer_s
from gnnscale.sample import sample_blocks
from gnnscale.sample.adjacency import SampledAdjacency
from gnnscale.sample.neighbor import Topology
from gnnscale.store.placement import HOST, Placement

PROBE_BATCHES = 3
"""Sampled batches whose input rows are ranked (the tiers' shares of a batch's reads)."""


@dataclass(frozen=True)
class SampledProbe:
    """A few sampled batches of the real graph: the sampling table (seconds per batch of a few sizes, on one
    thread and more) and the hotness ranks of the input rows of :data:`PROBE_BATCHES` batches of ``share``
    seeds (one trainer's share of a global batch)."""

    table: SamplingTable
    share: int
    input_ranks: tuple[Tensor, ...]
    projects: tuple[bool, ...] = ()
    """Per layer, whether it projects before aggregating (its update runs over the block's source rows)."""
    transpose_s: float = 0.0
    """Seconds per batch of ``share`` seeds to build the transposed adjacency of the blocks whose sources need a
    gradient (every block but the first), which backward's aggregation reads (:meth:`Block.adj_t`), measured on
    the same batches."""

    def rows(self, hot: int, parts: int) -> tuple[float, list[float]]:
        """Mean input rows per batch of ``share`` seeds: ``(all, hot rows per logical partition)``, a hot row
        being of rank below ``hot`` and of partition ``rank % parts``."""
        n = sum(r.numel() for r in self.input_ranks) / len(self.input_ranks)
        per = [0.0] * parts
        for r in self.input_ranks:
            h = r[r < hot]
            counts = torch.bincount(h % parts, minlength=parts).tolist()
            per = [a + b / len(self.input_ranks) for a, b in zip(per, counts, strict=True)]
        return n, per


def probe(topo: Topology, ids: Tensor, fanouts: tuple[int, ...], dims: tuple[int, ...], batch: int, share: int,
          rank: Tensor | None, key: int = 0, adjacency: SampledAdjacency | None = None,
          max_threads: int = 1, projects: tuple[bool, ...] = ()) -> SampledProbe:
    """Measure :class:`SampledProbe` on the real graph: §V's sampling table up to ``batch`` seeds
    (:func:`~gnnscale.plan.hybrid_measure.measure_sampling`), and the ranks (``rank``: vertex to hotness rank;
    ``None``: the vertex ids) of the input rows of a few batches of ``share`` seeds (``0``: none)."""
    table = measure_sampling(topo, ids, fanouts, dims, batch, max_threads, key, adjacency)
    gen = torch.Generator().manual_seed(key + 1)
    order = torch.randperm(ids.numel(), generator=gen)
    ranks, transpose = [], []
    for b in range(PROBE_BATCHES if share > 0 else 0):
        seeds = ids[order[(b * share) % max(1, ids.numel() - share + 1):][:share]]
        blocks = sample_blocks(topo, seeds, fanouts, key, adjacency)
        src = blocks[0].src_ids
        assert src is not None
        ranks.append(src if rank is None else rank[src])
        t0 = time.perf_counter()
        for block in blocks[1:]:
            block.adj_t()
        transpose.append(time.perf_counter() - t0)
    return SampledProbe(table, share, tuple(ranks), projects, statistics.median(transpose) if transpose else 0.0)


# ------------------------------------------------------------------------------------------------ work
def batch_layers(shape: BatchShape, projects: tuple[bool, ...] = ()) -> list[LayerWork]:
    """A sampled batch's layers as :mod:`gnnscale.plan.work` counts them: layer ``l`` aggregates ``edges[l - 1]``
    edges from its source rows (the batch's input rows, then the previous layer's) into ``vertices[l - 1]`` rows
    and updates them (its input needs a gradient from layer 2 on). A layer that projects first (``projects[l -
    1]``: :attr:`BlockLayer.projects_first <gnnscale.nn.base.BlockLayer.projects_first>`) multiplies every
    source row by its weights and aggregates at its output width: a block's sources far outnumber its
    destinations."""
    out = []
    for l in range(1, len(shape.dims)):
        src = shape.input_vertices if l == 1 else shape.vertices[l - 2]
        first = l - 1 < len(projects) and projects[l - 1]
        out.append(LayerWork(rows=src if first else shape.vertices[l - 1], in_width=shape.dims[l - 1],
                             out_width=shape.dims[l], edges=shape.edges[l - 1],
                             agg_width=shape.dims[l] if first else shape.dims[l - 1],
                             weights=shape.dims[l - 1] * shape.dims[l], source_grad=l > 1, projects=first,
                             src_rows=src))
    return out


def block_work(shape: BatchShape, rates: Rates, projects: tuple[bool, ...] = ()) -> dict[str, float]:
    """Seconds of one sampled batch's forward and backward (``shape``: its blocks' counts; ``projects``: which
    layers project first), priced as every engine's work is (:func:`gnnscale.plan.work.compute_terms`):
    ``aggregate`` (forward and backward), ``update`` (forward, input and weight gradients) and ``elementwise``
    (input dropout over the batch's input rows, activations, loss)."""
    t = compute_terms(batch_layers(shape, projects), rates, num_classes=shape.dims[-1], params=0,
                      input_rows=shape.input_vertices)
    return {"aggregate": t["aggregate"] + t["aggregate_backward"], "update": t["update"] + t["update_backward"],
            "elementwise": t["elementwise"] + t["attention"]}


# ------------------------------------------------------------------------------------------------ minibatch
@dataclass(frozen=True)
class Store:
    """What XGNN's placement cost reads of the global store: the placement of the ``G`` logical partitions, the
    hot vertices whose feature rows the devices hold, and a row's bytes."""

    placement: Placement
    hot_features: int
    row_bytes: int


def tier_rows(p: SampledProbe, store: Store, g: int) -> dict[str, float]:
    """Trainer ``g``'s input rows per batch by where its reader finds them: ``local`` (its own device), ``peer``
    (another device over a link) and ``host`` (cold rows, and hot ones of partitions it reads from host)."""
    parts = store.placement.num_gpus
    total, hot = p.rows(store.hot_features, parts)
    out = {"local": 0.0, "peer": 0.0, "host": max(0.0, total - sum(hot))}
    for part, rows in enumerate(hot):
        src = store.placement.source[g][part]
        out["local" if src == g else "host" if src == HOST else "peer"] += rows
    return out


def minibatch_epoch(p: SampledProbe, store: Store, rates: Rates, *, accelerator: bool, num_train: int, batch: int,
                    parameters: int, cores: int, cluster: Cluster) -> EpochTime:
    """The minibatch engine's epoch: per global batch every trainer (``G``: the placement's devices) samples its
    share and gathers its input rows from each tier (XGNN's placement cost: rows per tier at that tier's rate;
    on an accelerator the host rows are copied over the host bus, which the ``G`` devices of a machine share:
    ``cluster.devices_per_machine``, else ``G``), ahead of training its blocks (:func:`block_work`); then the
    gradients are reduced and the optimiser steps. The feed overlaps the training (a producer thread per trainer);
    on a CPU every trainer's feed and training share ``cores``."""
    G = store.placement.num_gpus
    on_bus = cluster.devices_per_machine or G
    shape = p.table.shape(p.share, _dims(p))
    iters = num_train / batch
    steps = -(-num_train // batch)
    row = store.row_bytes
    rows = [tier_rows(p, store, g) for g in range(G)]
    worst = max(range(G), key=lambda g: rows[g]["host"])  # the trainer with the most host reads sets the pace
    r = rows[worst]
    local_rate = rates.memory / 2 if accelerator else rates.gather  # a gather reads and writes each byte
    per = {"sample": p.table.predict(p.share, 1),
           "gather_host": r["host"] * row / rates.gather,
           "gather_device": r["local"] * row / local_rate,
           "gather_peer": r["peer"] * row / (rates.copy if accelerator else rates.gather),
           "copy": r["host"] * row / rates.copy if accelerator else 0.0,
           **block_work(shape, rates, p.projects), "transpose": p.transpose_s}
    per["bus"] = (on_bus - 1) * per["copy"]  # the other devices' copies on the same host bus
    feed = per["sample"] + per["gather_host"] + per["gather_device"] + per["gather_peer"] + per["copy"] + per["bus"]
    train = per["aggregate"] + per["update"] + per["elementwise"] + per["transpose"]
    step = optimizer_s(parameters, rates)
    sync = 2 * (G - 1) * parameters * S_FEAT / (rates.copy if accelerator else rates.memory)
    # on a CPU the feed thread's sampling and gathers are many small torch calls that hold the interpreter lock:
    # measured, they barely overlap the trainer's (csbm 200K: 0.46 s an epoch against 0.32 s feed + 0.10 s train)
    shared = 0.0 if accelerator else G * (feed + train) / min(max(cores, 1), G)
    iteration = max(feed, train, shared)
    seconds = iters * iteration + steps * (step + sync) + feed
    terms = {k: v * iters for k, v in per.items()} | {"optimizer": steps * step, "sync": steps * sync,
                                                       "cores": iters * shared}
    host = sum(x["host"] for x in rows) * row * iters
    moved = sum(x["host"] + x["local"] + x["peer"] for x in rows) * row * iters
    by_tier = {"host": int(host), "device": int(moved)} if accelerator else {"host": int(moved)}
    return EpochTime(seconds, terms, by_tier, "XGNN placement cost (rows per tier) + sampled blocks' work")


def _dims(p: SampledProbe) -> tuple[int, ...]:
    return p.table.shapes[0].dims


# ------------------------------------------------------------------------------------------------ hybrid
def device_rates(rates: Rates, width: int, accelerator: bool) -> DeviceRates:
    """Eqs. 7-13's figures of one trainer's device from its :class:`Rates` (nothing measured twice): the host
    gather, the aggregation's source-row bytes per second at ``width``, multiply-accumulates (half the FLOPs) and
    the link (the copy from host memory); a CPU's taken as one thread's (the stages' threads scale them)."""
    return DeviceRates(gather=rates.gather, aggregate=rates.aggregate_rate(width) * width * S_FEAT,
                       macs=rates.flops / 2, link=rates.copy, per_thread=not accelerator)


def hybrid_model(table: SamplingTable, cpu: Rates, accel: Rates, accelerators: list[bool], cores: int,
                 projects: tuple[bool, ...] = ()) -> HybridModel:
    """HyScale-GNN's model of trainers on the CPU (``accelerators[g]`` false, one of them) and accelerators, at
    plan time: §V's sampling table measured on the real graph, every share sampled by the CPU sampler (no device
    sampler's table before set-up), Eq. 10 scaled to the counted work of a batch (:func:`block_work`: Eq. 10
    counts the aggregation and the update, not the elementwise passes) instead of a measured run."""
    dims = table.shapes[0].dims
    rates = [device_rates(accel if a else cpu, dims[0], a) for a in accelerators]
    cpu_index = accelerators.index(False)
    perf = HybridModel(dims=dims, cpu_sampling=table, gpu_sampling=None, rates=rates, cpu_index=cpu_index,
                       gpu_sampled=[False] * len(accelerators), cores=cores)
    size = table.sizes[-1] / len(accelerators)
    shapes = [table.shape(size, dims) for _ in accelerators]
    counted = [sum(block_work(s, accel if a else cpu, projects).values())
               for s, a in zip(shapes, accelerators, strict=True)]
    perf.calibrate(counted, shapes, Threads(1, 1, 1))
    return perf


def hybrid_epoch(perf: HybridModel, *, num_train: int, batch: int, split: list[float] | None, threads: Threads,
                 parameters: int, rates: Rates) -> EpochTime:
    """The hybrid engine's epoch (Eqs. 5-13, :meth:`HybridModel.epoch_time`) at ``split`` (``None``: the model's
    initial split) and ``threads``, plus the optimiser's steps; its stages summed over the epoch's iterations,
    the input rows gathered in host memory (Eq. 7) and those copied to the accelerators (Eq. 8) with the
    weights' synchronisation (Eq. 13)."""
    split = perf.initial_split(batch, threads) if split is None else split
    steps = -(-num_train // batch)
    iters = num_train / batch
    stages = perf.stage_times(batch, split, threads)
    step = optimizer_s(parameters, rates)
    seconds = perf.epoch_time(num_train, batch, split, threads) + steps * step
    terms = {k: v * iters for k, v in stages.items() if k != "iteration"} | {"optimizer": steps * step}
    shapes = [perf.cpu_sampling.shape(s * batch, perf.dims) for s in split]
    row = perf.dims[0] * S_FEAT
    host = sum(s.input_vertices for s in shapes) * row * iters
    weights = 2 * sum(perf.dims[l - 1] * perf.dims[l] for l in range(1, len(perf.dims))) * S_FEAT
    accel = [g for g in range(len(split)) if g != perf.cpu_index]
    device = (sum(shapes[g].input_vertices for g in accel) * row + (weights if accel else 0)) * iters
    by_tier = {"host": int(host)} | ({"device": int(device)} if accel else {})
    return EpochTime(seconds, terms, by_tier, "HyScale-GNN Eqs. 5-13 (sampling measured, work counted)")
