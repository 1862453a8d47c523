"""Mini-batch training over XGNN's global memory store (XGNN §3-5; pipeline vocabulary of HyScale-GNN §III).

Per epoch the training vertices are shuffled (by seed and epoch) and cut into ``--batch-size`` seed batches. Each
device of ``--devices`` is a *trainer* (XGNN's one worker per GPU): it takes its share of every global batch (the
batch cut into contiguous parts), samples it with the keyed sampler (:func:`gnnscale.sample.sample_blocks`: per hop,
the frontier's degrees, positions drawn on the trainer's device, one read of only those entries), extracts the input
rows, and trains its model replica on the blocks. Every trainer reads through its own row of the placement
(:meth:`GlobalMemoryStore.reader`). Gradients are summed over the trainers, weighted by their seeds, and the
optimiser steps once per global batch. Sampling is keyed by ``(seed, epoch, hop, vertex)``, so a step on N
trainers equals one trainer's step on the whole batch; with ``--norm batch`` the trainers reduce BatchNorm's
statistics over the whole batch (:mod:`gnnscale.engines.sampled.norm`) for the same reason.

Per trainer, sampling and extraction run on a producer thread ahead of training through a bounded queue
(:data:`QUEUE_DEPTH` batches: HyScale-GNN's pipeline of sampling, feature loading and training); on CUDA on their
own stream, each batch handed over with an event the training stream waits for.

Sampled blocks are the layers' adjacency as PyG's layers see a sampled subgraph (:mod:`gnnscale.sample.adjacency`):
one self-loop per destination outside the fanout, and GCN's weights from each vertex's degree in the sample
(``--sample-norm sampled``, the default) or in the whole graph (``graph``). Evaluation is layer-wise full-neighbour
inference (every vertex's exact output, layer by layer over destination batches, with the whole graph's weights:
the in-memory engine's evaluation and PyG's full-batch ``model(x, edge_index)``), or sampled inference with
``--eval-fanouts`` (the training blocks' semantics).

The engine is the shared sampled loop (:class:`~gnnscale.engines.sampled.loop.SampledLoop`) with XGNN's parts: a
producer thread per trainer as the feed, model replicas on threads as the trainers, :class:`Replicas` as the
reducer.

Mini-batch training learns from sampled neighbourhoods, not the full graph, so ``--engine auto`` never picks it.
With fanouts at least the largest in-degree a step equals the in-memory engine restricted to the batch's seeds.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.config import GatherOptions, MiniBatchOptions, SamplingOptions, StoreOptions
from gnnscale.engines.core.disk_tier import anon_rss_bytes, host_plan, open_disk_tier
from gnnscale.engines.core.replicas import Replicas
from gnnscale.engines.sampled.engine import SampledEngine
from gnnscale.engines.sampled.eval import SampledInference
from gnnscale.engines.sampled.loop import (
    EVAL_BATCH,
    EVAL_EPOCH,
    SampledBatch,
    SampledCounters,
    SampledLoop,
    backward_share,
    check_fanouts,
    cut,
    default_fanouts,
    epoch_order,
    fetch_batch,
    forward,
    model_depth,
)
from gnnscale.engines.sampled.norm import BatchNormSync, traffic, wait_all
from gnnscale.engines.sampled.predict import predict_minibatch
from gnnscale.errors import ConfigError
from gnnscale.graph.graph import Graph
from gnnscale.nn.stack import Stack
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.host import plan_host, sampled_batch_rows, sampled_working_bytes
from gnnscale.plan.memory import estimate_host_bytes
from gnnscale.plan.rates import Rates
from gnnscale.sample import CSRTopology, sample_blocks, sample_key
from gnnscale.store.cache import DeviceCache
from gnnscale.store.disk import DiskSource
from gnnscale.store.global_store import GlobalMemoryStore, StoreReader, directory_reason
from gnnscale.store.transfer import place

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

T = TypeVar("T")

QUEUE_DEPTH = 2
"""Batches sampled and extracted ahead of training, per trainer."""
STORE_SHARE = 0.5
"""Share of the device budget the store may fill when the ratios are left to the engine."""
PRESAMPLE_BATCHES = 8
"""Mini-batches sampled by ``--hotness presample`` to count how often each vertex is read."""

@dataclass(eq=False)
class _Trainer:
    """One device: a model replica, its reader of the store, and (CUDA) the stream it samples on."""

    index: int
    device: rt.Device
    model: Stack
    reader: StoreReader
    stream: rt.Stream | None
    y: Tensor


class MiniBatchEngine(SampledEngine):
    """Sampled mini-batch training with topology and features in a global GPU+host store (XGNN), one trainer
    per device.

    The :class:`~gnnscale.engines.sampled.loop.SampledLoop`'s parts: the feed is a producer thread per trainer that
    samples and extracts its shares through its reader ahead of training (:meth:`_batches`), the trainers are
    model replicas on threads (:meth:`_run`), and :class:`Replicas` reduces."""

    name = "minibatch"
    host_topology_copies = 2.0  # the sampling lists without self-loops (and their temporaries): see Engine
    trains_jk = True  # the sampled forward combines every layer at the seeds; layer-wise evaluation too
    mode = "sampled"
    options = (SamplingOptions, MiniBatchOptions, StoreOptions, GatherOptions)

    @classmethod
    def check_options(cls, config: TrainConfig) -> None:
        check_fanouts(config, evaluation=True)

    @classmethod
    def batch_norm_reason(cls, config: TrainConfig) -> str | None:
        """Each layer normalises over the batch's rows of that layer, as PyG with a NeighborLoader; several
        trainers reduce their statistics (:mod:`gnnscale.engines.sampled.norm`), so 3 trainers equal 1. Not two
        trainers on one accelerator: autograd runs a device's backward on one thread, where the first trainer's
        reduction would wait for the second's forever."""
        named = [d.strip().lower() for d in config.devices or ()]
        accel = [d if ":" in d else f"{d}:0" for d in named if d.split(":")[0] not in ("cpu", "sim")]
        twice = sorted({d for d in accel if accel.count(d) > 1})
        if twice:
            return (f"{', '.join(twice)} named twice in --devices: two trainers on one accelerator cannot reduce "
                    "their statistics (its backward runs on one thread); name each accelerator once")
        return None

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device, *,
                               model: Stack | None = None) -> list[str]:
        reasons = cls.sampling_reasons(config, model)
        kinds = {d.split(":")[0].strip().lower() for d in config.devices or ()}
        if "cpu" in kinds and len(kinds) > 1:
            reasons.append(f"--devices {','.join(config.devices or ())} mixes the CPU and accelerators: the hybrid "
                           "engine trains them together")
        devices = trainer_devices(config, device)
        budget = config.memory_budget if config.memory_budget is not None else int(rt.mem_get_info(devices[0])[0])
        store = directory_reason(graph.num_nodes, budget, STORE_SHARE)
        if store:
            reasons.append(store)
        if config.host_memory is not None:  # the set-up's host plan, priced before any work (plan, --engine auto)
            row = max(graph.num_features, 1) * (graph.x.element_size() if graph.x is not None else 4)
            try:
                plan_host(config.host_memory, num_nodes=graph.num_nodes, row_bytes=row,
                          parameters=estimate_host_bytes(graph, config, layer_copies=0, model=model)["model"] // 16,
                          working_bytes=cls.working_bytes(graph, config, len(config.devices or (1,)), model))
            except ConfigError as exc:
                reasons.append(str(exc))
        return reasons

    @classmethod
    def predict_epoch(cls, graph: Graph, config: TrainConfig, device: torch.device, rates: Rates, *,
                      model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime | None:
        """XGNN's placement cost and the sampled blocks' work (:mod:`gnnscale.engines.sampled.predict`); with
        ``cluster.devices_per_machine``, that many devices sharing the host bus."""
        return predict_minibatch(graph, config, trainer_devices(config, device), rates, store_share=STORE_SHARE,
                                 model=model, cluster=cluster)

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: rt.Device):
        super().__init__(graph, model, config, rt.torch_device(device))
        self.device = device  # type: ignore[assignment]  # a runtime device: the model is where its tensors are
        devices = trainer_devices(config, device)
        budget = config.memory_budget if config.memory_budget is not None else int(rt.mem_get_info(devices[0])[0])
        hotness = self.presampled_hotness() if config.hotness == "presample" else None
        graph_ratio, feature_ratio = config.gpu_graph_ratio, config.gpu_feature_ratio
        self.tier = open_disk_tier(graph, host_plan(graph, config, model, working_bytes=self.working_bytes(
            graph, config, len(devices), model)), self.name)
        """The disk tier (``--host-memory`` on a converted directory): the store's host tier reads from it."""
        self.disk: DiskSource | None = None if self.tier is None else self.tier.source
        if self.tier is not None and not any(rt.is_accelerator(d) for d in devices):
            # the "device" tier would be host memory too: everything past the host cache is read from disk
            graph_ratio = 0.0 if graph_ratio is None else graph_ratio
            feature_ratio = 0.0 if feature_ratio is None else feature_ratio
        self.store = GlobalMemoryStore(graph, devices, adjacency=model.adjacency,
                                       gpu_graph_ratio=graph_ratio,
                                       gpu_feature_ratio=feature_ratio,
                                       memory_budget=int(STORE_SHARE * budget), gather=config.gather,
                                       hotness=hotness, host_source=self.disk,
                                       host_cache_bytes=0 if self.tier is None else self.tier.cache_bytes)
        assert graph.y is not None
        self.replicas = Replicas(model, devices)
        self.norm_sync = BatchNormSync.build(self.replicas.models)
        """Several trainers and ``--norm batch``: their norms' statistics reduced over the global batch."""
        self.trainers = [
            _Trainer(g, dev, self.replicas.models[g], self.store.reader(g),
                     rt.new_stream(dev), place(graph.y, dev))
            for g, dev in enumerate(devices)]
        self.pool = (ThreadPoolExecutor(len(devices), thread_name_prefix="gnnscale-trainer")
                     if len(devices) > 1 else None)
        self.y = self.trainers[0].y
        self.loop = SampledLoop(self.optimizer, self.train_ids, seed=config.seed, batch_size=config.batch_size,
                                reducer=self.replicas)
        self.inference = SampledInference(
            model, self.store, self.store.features, self.adjacency, graph.num_nodes, config.batch_size, device,
            batches=lambda parts, fanouts, key: self._batches(self.trainers[0], parts, fanouts, key),
            done=self.store.reset_stats)
        if self.tier is not None:  # layer-wise steps within the budget's working set: the batches' rows
            share, flight, fanouts = self.in_flight(graph, config, len(devices), model)
            self.inference.degree = graph.in_degree()
            self.inference.max_rows = flight * sampled_batch_rows(graph.num_nodes, share, fanouts)[0]

    @staticmethod
    def in_flight(graph: Graph, config: TrainConfig, trainers: int, model: Stack | None = None
                  ) -> tuple[int, int, tuple[int, ...]]:
        """``(seeds per trainer, batches in flight, fanouts)``: each trainer's queue, the batch it trains and the
        one its producer makes (``model``: a user's, whose depth sets the default fanouts)."""
        share = -(-config.batch_size // max(trainers, 1))
        fanouts = config.fanouts or default_fanouts(model_depth(config, model))
        return share, trainers * (QUEUE_DEPTH + 2), tuple(fanouts)

    @classmethod
    def working_bytes(cls, graph: Graph, config: TrainConfig, trainers: int, model: Stack | None = None) -> int:
        """Host bytes of the batches in flight and of layer-wise evaluation under ``--host-memory``
        (:func:`~gnnscale.plan.host.sampled_working_bytes`; ``model``: a user's, its widest layer as the hidden
        width)."""
        share, flight, fanouts = cls.in_flight(graph, config, trainers, model)
        row = 4 * max(graph.num_features, 1)  # gathered rows are float32 (bf16 rows are upcast)
        hidden = config.hidden if model is None else max(layer.out_features for layer in model.block_layers)
        return sampled_working_bytes(graph.num_nodes, row, share, fanouts, hidden, flight,
                                     graph.num_classes or 1)

    def presampled_hotness(self) -> Tensor:
        """Access counts from a short pre-sampling pass (XGNN's alternative to degree): how often each vertex is
        a sampled source in :data:`PRESAMPLE_BATCHES` batches of epoch 1, plus its out-degree as a tie-breaker."""
        topo = CSRTopology.from_graph(self.graph, self.model.adjacency)
        key = sample_key(self.config.seed, 1)
        order = self.train_ids[self._order(1)]
        counts = torch.zeros(self.graph.num_nodes, dtype=torch.float64)
        size = self.config.batch_size
        for lo in range(0, min(order.numel(), PRESAMPLE_BATCHES * size), size):
            for block in sample_blocks(topo, order[lo : lo + size], self.fanouts, key):
                assert block.src_ids is not None
                counts.index_add_(0, block.src_ids, torch.ones(block.num_src, dtype=torch.float64))
        deg = self.graph.out_degree().double()
        return counts + deg / (deg.max() + 1)

    def describe(self) -> str:
        s = self.store
        n = max(s.num_nodes, 1)
        rest = "the rest in host memory"
        if self.disk is not None:
            cached = s.host_source.cache.num_rows if isinstance(s.host_source, DeviceCache) else 0
            rest = (f"the rest of the topology in host memory, of the features {100 * cached / n:.0f}% in a host "
                    f"cache and the rest read from {self.disk.path}")
        return (f"minibatch: batch {self.config.batch_size}, fanouts {','.join(map(str, self.fanouts))}, "
                f"{len(self.trainers)} trainer(s); store: topology of {100 * s.hot_graph / n:.0f}% and features of "
                f"{100 * s.hot_features / n:.0f}% of the vertices on {len(s.devices)} device(s), {rest}")

    # ------------------------------------------------------------------------------------------------ the feed
    def _prepare(self, t: _Trainer, seeds: Tensor, fanouts: tuple[int, ...], key: int) -> SampledBatch:
        """Sample ``seeds`` (on ``t``'s device) and extract the input rows through ``t``'s reader."""
        with rt.use_stream(t.stream), rt.on_device(t.device):  # a sim device marks what it makes as the stream's
            batch = fetch_batch(t.reader, t.reader.features, place(seeds, t.device), fanouts, key, self.adjacency)
            batch.ready = rt.record_event(t.stream)
        return batch

    def _batches(self, t: _Trainer, parts: list[Tensor], fanouts: tuple[int, ...], key: int
                 ) -> Generator[SampledBatch, None, None]:
        """``t``'s sampled and extracted batches of ``parts``, produced ahead by a thread through a bounded queue."""
        q: queue.Queue[SampledBatch | BaseException | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        stop = threading.Event()

        def produce() -> None:
            try:
                for part in parts:
                    if stop.is_set():
                        return
                    q.put(self._prepare(t, part, fanouts, key))
                q.put(None)
            except BaseException as exc:  # surfaced in the consumer
                q.put(exc)

        if t.stream is not None:  # the seeds were copied to the device on this stream: sampling starts after
            rt.wait_stream(t.stream, rt.current_stream(t.device))
        thread = threading.Thread(target=produce, name=f"gnnscale-sampler-{t.index}", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                if item.ready is not None:  # training waits for the sampling stream on the device, not the host
                    consumer = rt.current_stream(t.device)
                    rt.wait_event(item.ready, consumer)
                    for tensor in [*(x for b in item.blocks for x in b.tensors()), item.x, item.seeds]:
                        rt.record_stream(tensor, consumer)
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # let a producer blocked on a full queue finish
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.05)

    def _forward(self, batch: SampledBatch, se: tuple[int, int] | None, model: Stack | None = None) -> Tensor:
        return forward(self.model if model is None else model, batch.blocks, batch.x, se)

    def _run(self, fn: Callable[[_Trainer], T]) -> list[T]:
        """``fn`` on every trainer: inline for one, one thread each otherwise."""
        if self.pool is None:
            return [fn(self.trainers[0])]
        return wait_all([self.pool.submit(fn, t) for t in self.trainers])

    def _parts(self, batches: list[Tensor]) -> list[list[Tensor]]:
        """Per trainer, its contiguous share of each global batch, on its device (the epoch's seeds are copied to
        each device once, not per batch): equal shares, or ``--shares``."""
        if not batches:
            return [[] for _ in self.trainers]
        seeds, sizes = torch.cat(batches), [b.numel() for b in batches]
        shares = self.config.shares
        out = []
        for t in self.trainers:
            on = torch.split(place(seeds, t.device), sizes)
            if shares is None:
                out.append([torch.tensor_split(batch, len(self.trainers))[t.index] for batch in on])
            else:
                out.append([cut(batch, shares)[t.index] for batch in on])
        return out

    def _feed(self, batches: list[Tensor], first: int, key: int) -> Iterator[list[Callable[[], SampledBatch]]]:
        """The loop's feed: per global batch, a way for each trainer to take its share off its producer thread
        (from its own thread, so a trainer starts as soon as its own share is ready)."""
        del first
        parts = self._parts(batches)
        streams = [self._batches(t, parts[t.index], self.fanouts, key) for t in self.trainers]
        try:
            for _ in batches:
                yield [functools.partial(next, s) for s in streams]
        finally:
            for s in streams:
                s.close()

    # ------------------------------------------------------------------------------------------------ training
    def _train(self, shares: list[Callable[[], SampledBatch]], total: int, se: tuple[int, int],
               counters: SampledCounters) -> None:
        """The loop's trainers: each takes its share and runs forward and backward on its replica."""

        def step(t: _Trainer) -> None:
            try:
                batch = shares[t.index]()
            except BaseException:
                if self.norm_sync is not None:  # the others would wait for this trainer's rows
                    self.norm_sync.abort()
                raise
            counters.took(t.index, batch)
            trains = batch.seeds.numel() > 0  # fewer seeds than trainers: nothing to add
            with (contextlib.nullcontext(trains) if self.norm_sync is None
                  else self.norm_sync.step(t.index, batch.blocks if trains else None)):
                if not trains:
                    return
                t0 = time.perf_counter()
                with rt.on_device(t.device):  # on the device's current stream (a sim device checks every op there)
                    loss = backward_share(self._forward(batch, se, t.model), t.y[batch.seeds], total)
                    c = counters[t.index]
                    c["loss_sum"] += loss * total
                c["train_s"] += time.perf_counter() - t0

        if self.norm_sync is not None:
            self.norm_sync.begin()
        self._run(step)
        if self.norm_sync is not None:
            self.norm_sync.settle()

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        self.model.train()
        self.replicas.sync()
        se, key = (self.config.seed, epoch), sample_key(self.config.seed, epoch)
        counters = SampledCounters(len(self.trainers))
        for t in self.trainers:  # the loss stays on the trainer's device: no host sync per batch
            counters[t.index]["loss_sum"] = rt.zeros((), device=t.device)
        self.store.reset_stats()
        traffic(self.norm_sync)  # counted from here
        self.loop.run(epoch, functools.partial(self._feed, key=key),
                      functools.partial(self._train, se=se, counters=counters), counters)
        for t in self.trainers:  # one blocking read per trainer and epoch: the host has waited for its device's work
            counters[t.index]["loss_sum"] = rt.item(counters[t.index]["loss_sum"])
        stats = self.store.reset_stats()
        if self.disk is None:
            return {**counters.record(), **stats.metrics(), **traffic(self.norm_sync)}
        return {**counters.record(), **stats.metrics(), **stats.disk_metrics(), "anon_rss_bytes": anon_rss_bytes(),
                **traffic(self.norm_sync)}


def trainer_devices(config: TrainConfig, device: rt.Device) -> list[rt.Device]:
    """The trainers' devices: ``config.devices`` (sim devices included), else the training device."""
    return [rt.resolve_device(d) for d in config.devices] if config.devices else [device]


__all__ = ["EVAL_BATCH", "EVAL_EPOCH", "PRESAMPLE_BATCHES", "MiniBatchEngine", "check_fanouts",
           "default_fanouts", "epoch_order"]
