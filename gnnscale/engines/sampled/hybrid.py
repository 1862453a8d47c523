"""Hybrid CPU + accelerator mini-batch training with dynamic resource management (HyScale-GNN, Lin et al.).

``--engine hybrid --devices cpu,cuda:0[,cuda:1...]`` runs one *trainer* per device (§III-A): the CPU trainer and one
per accelerator, each training its share of every iteration's global mini-batch (the mini-batch engine's epoch
shuffle and batches, its keyed sampler, its model replicas). The synchronizer sums the trainers' gradients,
weighted by their seeds, and the optimiser steps once: an iteration equals one step on the whole global batch,
whatever the split, because keyed sampling gives every seed the same neighbourhood in any share (with ``--norm
batch`` the trainers reduce BatchNorm's statistics over the batch: :mod:`gnnscale.engines.sampled.norm`).

Four pipeline stages (§III-B, Figure 4), each on its own thread, joined by queues of one iteration
(:class:`~gnnscale.engines.core.pipeline.Pipeline`): **sampling** (the CPU sampler samples the CPU trainer's share
and those of accelerators without a GPU sampler; a CUDA accelerator samples its own share on its device),
**feature loading** (CPU threads gather the sampled rows from host memory, into pinned buffers for CUDA),
**data transfer** (asynchronous copies to each accelerator on a copy stream) and **propagation** (the trainers in
parallel, then the synchronizer). While iteration ``i`` trains, ``i + 1`` is in transfer and ``i + 2`` loading
(two-stage prefetching, §IV-B, Figure 7). Each stage's time per iteration is measured.

Dynamic resource management (§IV-A, Algorithm 1, :func:`gnnscale.plan.hybrid.drm_decide`), ``--drm on``: after
each iteration the bottleneck stage decides to *balance work* (the trainers' shares of the global batch, or which
sampler samples an accelerator's share) or *balance threads* (one thread between the CPU sampler, the feature
loader and the CPU trainer). A share is fixed when its iteration is sampled; the stages run ahead, so a decision
takes effect a few iterations later, and DRM waits for an iteration sampled under its last decision before it
decides again.

The engine is the shared sampled loop (:class:`~gnnscale.engines.sampled.loop.SampledLoop`) with HyScale-GNN's parts:
the three stages before training (:mod:`gnnscale.engines.sampled.stages`) on a pipeline as the feed, the trainers
on a thread each (:meth:`HybridEngine._propagate`), :class:`Replicas` with the master on the CPU as the
synchronizer, and DRM looking at every step.

``cpu:N`` devices (``--devices cpu:0,cpu:1``) stand in for accelerators on a machine without one (the CPU tests and
benchmarks); every device call is :mod:`gnnscale.runtime`'s, so a trainer also runs on the sim device
(``--devices cpu,sim:0``), whose copies read NaN until waited for (``tests/test_hybrid_sim.py``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.config import HybridOptions, MiniBatchOptions, SamplingOptions, TrainConfig
from gnnscale.engines.core.disk_tier import host_plan, open_disk_tier, tier_metrics
from gnnscale.engines.core.pipeline import Pipeline
from gnnscale.engines.core.replicas import Replicas
from gnnscale.engines.sampled.engine import SampledEngine
from gnnscale.engines.sampled.eval import SampledInference
from gnnscale.engines.sampled.loop import SampledCounters, SampledLoop, Step, backward_share, cut, forward
from gnnscale.engines.sampled.norm import BatchNormSync, kept_buffers, run_trainers, traffic, waited
from gnnscale.engines.sampled.predict import hybrid_devices, predict_hybrid
from gnnscale.engines.sampled.stages import Iteration, Propagated, SampledStages, StageSums
from gnnscale.errors import ConfigError
from gnnscale.graph.graph import Graph
from gnnscale.nn.stack import Stack, class_count
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.hybrid import (
    Assignment,
    Decision,
    HybridModel,
    StageTimes,
    Threads,
    apply_decision,
    batch_shape,
    check_devices,
    check_threads,
    default_threads,
    device_rates,
    drm_decide,
    fit_cost,
    measure_sampling,
    rebalance,
)
from gnnscale.plan.rates import Rates
from gnnscale.sample import CSRTopology, sample_key
from gnnscale.store.features import FeatureSource
from gnnscale.store.global_store import GlobalMemoryStore, directory_reason

DRM_TOLERANCE = 0.1
"""DRM leaves the split alone while the trainers' times are within this fraction of each other (noise)."""
COST_SAMPLES = 4
"""Iterations each trainer's cost model (``seconds = a + b * seeds``, what *balance work* splits by) is fitted
over: about one DRM decision's worth, so it follows the split it measures (seconds per seed measured at an old
split mislead: a share's neighbourhood grows less than its seeds) while one noisy iteration does not decide."""
CALIBRATION_RUNS = 8
"""Pipelined iterations that calibrate the model at set-up (their mean is kept: an epoch sums its iterations)."""
CALIBRATION_WARMUP = 2
"""Pipelined iterations before those, not measured (first touches of the features, the allocator's growth)."""
MIN_SHARE_SEEDS = 1
"""Seeds every trainer keeps in a full batch under DRM (a trainer with none could not be measured)."""
CPU = torch.device("cpu")


_Iteration = Iteration  # one global mini-batch on its way through the pipeline (sampled.stages.Iteration)


class HybridEngine(SampledEngine):
    """Mini-batch training on the CPU and accelerators together: unequal trainers, a four-stage pipeline and DRM
    (HyScale-GNN)."""

    name = "hybrid"
    trains_jk = True  # the sampled forward combines every layer at the seeds; layer-wise evaluation too
    mode = "sampled"
    trains_beside_accelerators = True
    plan_kind = "pipeline"
    options = (SamplingOptions, MiniBatchOptions, HybridOptions)
    also_reads = ("host_memory",)  # a converted directory's features read from disk behind a host cache

    @classmethod
    def check_options(cls, config: TrainConfig) -> None:
        """The fanouts, the devices (a CPU among them, none twice) and the threads (no more than the cores)."""
        super().check_options(config)  # the fanouts
        for why in (None if config.devices is None else check_devices(config.devices),
                    None if config.threads is None else check_threads(config.threads, os.cpu_count() or 1)):
            if why:
                raise ConfigError(why)

    @classmethod
    def batch_norm_reason(cls, config: TrainConfig) -> str | None:
        """None: the trainers reduce their statistics over the global batch (:mod:`gnnscale.engines.sampled.norm`),
        so any split (DRM's included) normalises as the mini-batch engine's one trainer does."""
        del config
        return None

    @classmethod
    def auto_skip_reason(cls, config: TrainConfig) -> str | None:
        """Without ``--devices`` it would train the CPU alone, as the mini-batch engine does without the pipeline's
        cost: ``--engine auto`` leaves it to ``--engine hybrid``."""
        if config.devices and len(config.devices) > 1:
            return None
        return "trains the CPU beside accelerators: name them with --devices (e.g. cpu,cuda:0)"

    @classmethod
    def predict_epoch(cls, graph: Graph, config: TrainConfig, device: torch.device, rates: Rates, *,
                      model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime | None:
        """HyScale-GNN's Eqs. 5-13 at the configured split and threads (one machine: ``cluster`` not priced)."""
        del device, cluster
        return predict_hybrid(graph, config, hybrid_devices(config), rates, model=model)

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device, *,
                               model: Stack | None = None) -> list[str]:
        reasons = cls.sampling_reasons(config, model)
        if config.memory_budget is not None and any(not d.strip().lower().startswith("cpu")
                                                    for d in config.devices or ()):
            store = directory_reason(graph.num_nodes, config.memory_budget, 0.5)  # the GPUs' store: half
            if store:
                reasons.append(store)
        return reasons

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        self.devices = hybrid_devices(config)
        self.cpu_index = next(i for i, d in enumerate(self.devices) if d.type == "cpu")
        cuda = [d for d in self.devices if rt.is_accelerator(d)]
        self.tier = open_disk_tier(graph, host_plan(graph, config, model), self.name)
        """The disk tier (``--host-memory`` on a converted directory): the store's host tier reads from it, behind
        its host cache, and the loaders gather through that (:attr:`host_x` is then the chain, not a tensor)."""
        host_source = None if self.tier is None else self.tier.source
        cache_bytes = 0 if self.tier is None else self.tier.cache_bytes
        if cuda:  # topology on the GPUs for their samplers, as much as half the budget holds; features on the host
            budget = config.memory_budget if config.memory_budget is not None else rt.mem_get_info(cuda[0])[0]
            self.store = GlobalMemoryStore(graph, cuda, adjacency=model.adjacency,
                                           gpu_graph_ratio=config.gpu_graph_ratio, gpu_feature_ratio=0.0,
                                           memory_budget=budget // 2, gather="index_select", host_source=host_source,
                                           host_cache_bytes=cache_bytes)
        else:
            self.store = GlobalMemoryStore(graph, [CPU], adjacency=model.adjacency,
                                           gpu_graph_ratio=0.0, gpu_feature_ratio=0.0, host_source=host_source,
                                           host_cache_bytes=cache_bytes)
        indptr, indices, weight = self.store.host_csr
        self.host_topo = CSRTopology(indptr.view(-1), indices.view(-1), None if weight is None else weight.view(-1))
        self.host_x: Tensor | FeatureSource = (self.store.host_x if self.store.host_source is None
                                               else self.store.host_source)
        assert graph.y is not None
        self.replicas = Replicas(model, self.devices, master=self.cpu_index)
        self.norm_sync = BatchNormSync.build(self.replicas.models, self.cpu_index)
        """Several trainers and ``--norm batch``: their norms' statistics reduced over the global batch."""
        self.ys = [rt.to_device(graph.y, d) for d in self.devices]  # on the default stream: ordered before training
        self.y = graph.y
        self.gpu_sampler = [rt.is_accelerator(d) for d in self.devices]
        """Per trainer: its share is sampled on its own device (SA) rather than by the CPU sampler (SC)."""
        self.stages = SampledStages(self.devices, self.cpu_index, self.host_topo, self.host_x, self.store,
                                    self.fanouts, self.adjacency)
        cores = os.cpu_count() or 1
        self.threads = Threads(*config.threads) if config.threads else default_threads(cores)
        self.slowdown = [1.0] * len(self.devices)
        """Benchmark hook: trainer ``g``'s propagation takes ``slowdown[g]`` times its work (it sleeps
        ``slowdown[g] - 1`` times the CPU time its thread spent: with one intra-op thread, the work itself and not
        the waits for a core), a slower device simulated without taking cores from the others."""
        self.trainer_pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="gnnscale-trainer")
        self.version = 0
        self.warm = False
        self.step = 0
        """Iterations trained so far in this run (DRM's log counts in them)."""
        self.iteration_s: list[float] = []
        """The last epoch's seconds per iteration (wall time between the ends of consecutive iterations)."""
        self.samples: list[list[tuple[int, float]]] = [[] for _ in self.devices]
        """Per trainer, its last :data:`COST_SAMPLES` iterations' seeds and seconds."""
        self.drm_log: list[dict[str, Any]] = []
        self.loop = SampledLoop(self.optimizer, self.train_ids, seed=config.seed, batch_size=config.batch_size,
                                reducer=self.replicas)
        self.inference = SampledInference(model, self.host_topo, self._eval_features, self.adjacency,
                                          graph.num_nodes, config.batch_size, device, done=self.store.reset_stats)
        t0 = time.perf_counter()
        self.perf = self._performance_model(cores)
        self._calibrate()
        self.timings["model_s"] = time.perf_counter() - t0
        if config.shares is not None:
            self.split = list(config.shares)
        else:
            self.split = self.perf.initial_split(config.batch_size, self.threads)
        self.initial_split = list(self.split)
        self.predicted: dict[str, float] = {}
        self.measured: dict[str, float] = {}

    def _performance_model(self, cores: int) -> HybridModel:
        """§V's model for this machine, model and graph: the sampling-time tables of the CPU sampler (and of the
        first GPU's), measured now on this graph; the devices' rates, measured once per machine."""
        layers = self.model.block_layers  # the model's widths (a user's model's too): features, hidden, classes
        dims = (layers[0].in_features, *(layer.out_features for layer in layers[:-1]), class_count(self.model))
        key = sample_key(self.config.seed, 0)
        size = min(self.config.batch_size, self.train_ids.numel())
        cpu_table = measure_sampling(self.host_topo, self.train_ids, self.fanouts, dims, size, cores, key,
                                     self.adjacency)
        cuda = [d for d in self.devices if rt.is_accelerator(d)]
        gpu_table = None
        if cuda:
            gpu_table = measure_sampling(self.store.reader(0), rt.to_device(self.train_ids, cuda[0]), self.fanouts,
                                         dims, size, 1, key, self.adjacency)
        rates = [device_rates(rt.torch_device(d) if rt.is_accelerator(d) else CPU) for d in self.devices]
        return HybridModel(dims=dims, cpu_sampling=cpu_table, gpu_sampling=gpu_table, rates=rates,
                           cpu_index=self.cpu_index, gpu_sampled=list(self.gpu_sampler), cores=cores)

    def _calibrate(self) -> None:
        """A few iterations through the real pipeline (every trainer on an equal share of the epoch order's first
        batches, gradients discarded; the first :data:`CALIBRATION_WARMUP` not measured): each trainer's measured
        forward and backward scales its Eq. 10, the measured iteration Eq. 6 (:meth:`HybridModel.calibrate`)."""
        size = min(self.config.batch_size, self.train_ids.numel())
        G = len(self.devices)
        equal = [1 / G] * G
        order, n = self._order(0), self.train_ids.numel()  # distinct batches, as an epoch's (no warm caches)
        items = (Iteration(i, size, cut(self.train_ids[order[(i * size + torch.arange(size)) % n]], equal),
                           self.version) for i in range(CALIBRATION_WARMUP + CALIBRATION_RUNS))
        before = torch.get_num_threads()
        runs, walls = [], []
        last: Iteration | None = None
        try:  # the running statistics as they were: the calibration's batches are not training's
            with self._pipeline(items, sample_key(self.config.seed, 0)) as pipe, kept_buffers(self.model):
                t_last = time.perf_counter()
                for it in pipe:
                    runs.append([r.own_s for r in run_trainers(self.norm_sync, self.trainer_pool, functools.partial(
                        self._propagate, it=it, se=(self.config.seed, 0)), G)])
                    self.model.zero_grad(set_to_none=True)
                    self.replicas.sync()
                    now = time.perf_counter()
                    walls.append(now - t_last)
                    t_last, last = now, it
        finally:
            torch.set_num_threads(before)
            self.model.zero_grad(set_to_none=True)
            self.replicas.sync()
        assert last is not None
        times = [statistics.mean(run[g] for run in runs[CALIBRATION_WARMUP:]) for g in range(G)]
        dims = self.perf.dims
        shapes = [batch_shape(last.blocks[g], dims) if last.parts[g].numel() else
                  self.perf.cpu_sampling.shape(1, dims) for g in range(G)]
        self.perf.calibrate(times, shapes, self.threads, statistics.mean(walls[CALIBRATION_WARMUP:]), size, equal)

    def describe(self) -> str:
        names = ", ".join(f"{d}{' (CPU trainer)' if g == self.cpu_index else ''}" for g, d in enumerate(self.devices))
        split = ", ".join(f"{s:.2f}" for s in self.split)
        origin = "from the performance model" if self.config.shares is None else "from --shares"
        t = self.threads
        return (f"hybrid: batch {self.config.batch_size}, fanouts {','.join(map(str, self.fanouts))}, trainers "
                f"{names}; split {split} ({origin}), threads: sampler {t.sampler}, loader {t.loader}, CPU trainer "
                f"{t.trainer}; DRM {self.config.drm}")

    # ------------------------------------------------------------------------------------------------ the feed
    def _sample(self, it: Iteration, key: int) -> Iteration:
        """Stage 1: the CPU sampler's shares on ``threads.sampler`` threads; each GPU sampler's on its device."""
        return self.stages.sample(it, key, self.gpu_sampler, self.threads.sampler)

    def _load(self, it: Iteration) -> Iteration:
        """Stage 2: every trainer's input rows gathered from host memory on ``threads.loader`` threads."""
        return self.stages.load(it, self.threads.loader)

    def _transfer(self, it: Iteration) -> Iteration:
        """Stage 3: each accelerator's features (and the topology the CPU sampled for it) copied to it."""
        return self.stages.transfer(it)

    def _cut(self, batch: Tensor, split: list[float]) -> list[Tensor]:
        """Trainer ``g`` takes seeds ``[round(n c_{g-1}), round(n c_g))`` of the batch (``c``: cumulative split)."""
        return cut(batch, split)

    def _pipeline(self, items: Iterator[Iteration], key: int) -> Pipeline:
        """The stages on their threads, each holding one iteration (Figure 7's depth: two-stage prefetching)."""
        stages = [("sampler", lambda it: self._sample(it, key)), ("loader", self._load),
                  ("transfer", self._transfer)]
        return Pipeline(items, stages, depth=1, handoff=True)

    def _iterations(self, batches: list[Tensor]) -> Iterator[Iteration]:
        """The global batches as iterations, each cut by the split current when the sampler takes it."""
        for i, batch in enumerate(batches):
            # the version first: a decision landing between the two reads then leaves the iteration labelled
            # with the older version, which DRM skips (never a new version on an old split)
            version = self.version
            yield Iteration(i, batch.numel(), self._cut(batch, self.split), version)

    def _propagate(self, g: int, it: Iteration, se: tuple[int, int]) -> Propagated:
        """Trainer ``g``'s forward and backward on its share: its seconds and its share of the batch's loss."""
        seeds = it.parts[g]
        trains = seeds.numel() > 0
        with (contextlib.nullcontext() if self.norm_sync is None
              else self.norm_sync.step(g, it.blocks[g] if trains else None)):
            if not trains:
                return Propagated(0.0, None, 0.0)
            dev, model = self.devices[g], self.replicas.models[g]
            ev = it.ready[g] if it.ready else None
            if ev is not None:
                rt.wait_event(ev, rt.current_stream(dev))
            if g == self.cpu_index:
                torch.set_num_threads(self.threads.trainer)
            t0, cpu0, w0 = time.perf_counter(), time.thread_time(), waited(self.norm_sync, g)
            x = it.x[g]
            assert x is not None
            with rt.on_device(dev):  # on the device's default stream (a sim device checks every op there)
                loss = backward_share(forward(model, it.blocks[g], x, se), self.ys[g][rt.to_device(seeds, dev)],
                                      it.total)
            loss = rt.to_host(loss)
            if rt.is_accelerator(dev):
                rt.synchronize(dev)  # the trainer's work is done (its time) and its loss is in host memory
        # its own work's time: not the waits for the other trainers' BatchNorm statistics
        elapsed = time.perf_counter() - t0 - (waited(self.norm_sync, g) - w0)
        cpu_s = time.thread_time() - cpu0
        extra = 0.0
        if self.slowdown[g] > 1.0:  # the work's CPU time again (f - 1) times, not the waits for a shared core
            extra = (self.slowdown[g] - 1.0) * cpu_s
            time.sleep(extra)
        own = elapsed if rt.is_accelerator(self.devices[g]) else cpu_s  # a GPU's work is not this thread's CPU
        return Propagated(elapsed + extra, loss * it.total, own + extra)

    def _train(self, it: Iteration, total: int, se: tuple[int, int],
               counters: SampledCounters) -> list[Propagated]:
        """The loop's trainers: every trainer's propagation on its own thread; their seconds and losses."""
        del total  # the iteration's own (it.total)
        results = run_trainers(self.norm_sync, self.trainer_pool, functools.partial(self._propagate, it=it, se=se),
                               len(self.devices))
        for g, (seconds, loss, _) in enumerate(results):
            c = counters[g]
            c["seeds"] += int(it.parts[g].numel())
            c["sampled_edges"] += sum(b.num_edges for b in it.blocks[g])
            c["train_s"] += seconds
            if loss is not None:
                c["loss_sum"] += float(loss)
        return results

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        self.model.train()
        self.replicas.sync()
        se, key = (self.config.seed, epoch), sample_key(self.config.seed, epoch)
        G = len(self.devices)
        threads_before = torch.get_num_threads()
        counters, stages = SampledCounters(G), StageSums(G, self.cpu_index)
        moves = {"work": 0, "thread": 0}
        t_epoch = time.perf_counter()
        t_last = [t_epoch]
        self.iteration_s = []
        if isinstance(self.host_x, FeatureSource):
            self.host_x.reset_stats()
        traffic(self.norm_sync)  # counted from here (not the calibration's)

        def after(step: Step[Iteration, list[Propagated]]) -> None:
            """Each stage's time of the step, and DRM's look at it."""
            it, times = step.item, [r[0] for r in step.result]
            stages.add(it, times, step.sync_s)
            now = time.perf_counter()
            self.iteration_s.append(now - t_last[0])  # wall time from the previous iteration's end
            t_last[0] = now
            self.step += 1
            if self.config.drm == "on":
                kind = self._drm(it, times).kind
                moves[kind] = moves.get(kind, 0) + 1

        try:
            self.loop.run(epoch, lambda batches, first: self._pipeline(self._iterations(batches), key),
                          functools.partial(self._train, se=se, counters=counters), counters, after)
        finally:
            torch.set_num_threads(threads_before)
        epoch_s = time.perf_counter() - t_epoch
        iters = counters.iterations
        n = self.train_ids.numel()
        edges = int(counters.total("sampled_edges"))
        self.measured = {k: v / max(iters, 1) for k, v in stages.seconds.items()}
        self.measured["epoch_s"] = epoch_s
        self.measured["iteration"] = epoch_s / max(iters, 1)
        self.perf.gpu_sampled = list(self.gpu_sampler)
        self.predicted = self.perf.stage_times(self.config.batch_size, self.split, self.threads)
        self.predicted["epoch_s"] = self.perf.epoch_time(n, self.config.batch_size, self.split, self.threads)
        out: dict[str, Any] = {
            "loss": counters.total("loss_sum") / n, "batches": iters, "trainers": G,
            **stages.record(),
            "trainer_s": [c["train_s"] for c in counters.trainers], "trainer_seeds": counters.per_trainer("seeds"),
            "trainer_sampled_edges": counters.per_trainer("sampled_edges"),
            "sampled_edges": edges, "mteps": edges / epoch_s / 1e6,
            "split": [round(s, 4) for s in self.split],
            "threads": [self.threads.sampler, self.threads.loader, self.threads.trainer],
            "gpu_sampled": [g for g in range(G) if self.gpu_sampler[g]],
            "accel_bytes": [b for g, b in enumerate(stages.bytes_to) if g != self.cpu_index],
            "drm_work_moves": moves["work"], "drm_thread_moves": moves["thread"],
            "predicted_epoch_s": self.predicted["epoch_s"],
        }
        if isinstance(self.host_x, FeatureSource):  # the disk tier: what the loaders read from disk and the cache
            out.update(tier_metrics(self.host_x.read_stats()))
        return {**out, **traffic(self.norm_sync)}

    # ------------------------------------------------------------------------------------------------ DRM
    def _drm(self, it: Iteration, times: list[float]) -> Decision:
        """Algorithm 1 on iteration ``it``'s stage times, applied; nothing while ``it`` predates the last
        decision (its share and threads were fixed before that decision took effect)."""
        if self.warm is False:
            self.warm = True  # the run's first iteration warms up (allocations, lazy set-up): not measured
            return Decision("none")
        busy = self._busy(it, times)
        for g, p in enumerate(it.parts):  # every trainer's recent (seeds, seconds), for its cost model
            if p.numel() and busy[g] > 0:
                self.samples[g] = [*self.samples[g], (int(p.numel()), busy[g])][-COST_SAMPLES:]
        if it.version != self.version:
            return Decision("none")
        has_accel = len(self.devices) > 1
        gpu = [g for g in range(len(self.devices)) if self.gpu_sampler[g]]
        st = StageTimes(SC=it.times["SC"], Load=it.times["Load"], TC=it.times["TC"],
                        Tran=it.times["Tran"] if has_accel else None, TA=it.times["TA"] if has_accel else None,
                        SA=it.times["SA"] if gpu else None)
        d = drm_decide(st)
        done = self._apply(d, it, times)
        self.drm_log.append({"step": self.step, "iteration": it.index, "bottleneck": d.bottleneck,
                             "decision": d.kind, "src": d.src, "dst": d.dst,
                             "applied": None if done is None else done.kind, "split": list(self.split),
                             "threads": list(self.threads.as_tuple())})
        return done if done is not None else Decision("none", bottleneck=d.bottleneck)

    def _busy(self, it: Iteration, times: list[float]) -> list[float]:
        """Each trainer's seconds in iteration ``it``; an accelerator's bundles its transfer (Algorithm 1,
        line 1: ``T_Accel = max(T_Tran, T_TA)``)."""
        return [max(times[g], it.transfer_s[g]) if g != self.cpu_index else times[g]
                for g in range(len(self.devices))]

    def _apply(self, d: Decision, it: Iteration, times: list[float]) -> Decision | None:
        """Carry out ``d`` (:func:`~gnnscale.plan.hybrid.apply_decision`: a thread move with no thread to give
        moves work instead); the decision carried out, or ``None``. A new assignment is a new version."""
        def balance(split: list[float]) -> list[float] | None:
            return rebalance(split, self._busy(it, times), [int(p.numel()) for p in it.parts],
                             min_share=MIN_SHARE_SEEDS / self.config.batch_size, tolerance=DRM_TOLERANCE,
                             costs=[fit_cost(x) for x in self.samples])

        cuda = [g for g in range(len(self.devices)) if rt.is_accelerator(self.devices[g])]
        out = apply_decision(d, Assignment(tuple(self.split), self.threads, tuple(self.gpu_sampler)), cuda=cuda,
                             balance=balance)
        if out is None:
            return None
        done, a = out
        self.split, self.threads, self.gpu_sampler = list(a.split), a.threads, list(a.gpu_sampler)
        self.version += 1
        return done

    # ------------------------------------------------------------------------------------------------ inference
    def _eval_features(self, src: Tensor) -> Tensor:
        """Input rows of ``src`` for inference: host memory (or the disk tier), on the training device (the CPU)."""
        if isinstance(self.host_x, FeatureSource):
            return self.host_x.gather_unchecked(src.cpu()).to(self.device)
        return self.host_x.index_select(0, src.cpu()).to(self.device)

    # ------------------------------------------------------------------------------------------------ summary
    def report(self) -> dict[str, Any]:
        """Predicted (Eqs. 5-13 and the sampling table) and measured per-stage seconds per iteration, last
        epoch, with the split and threads they were predicted for."""
        if not self.measured:
            return {}
        return {"predicted": dict(self.predicted), "measured": dict(self.measured),
                "split": list(self.split), "initial_split": self.initial_split,
                "threads": [self.threads.sampler, self.threads.loader, self.threads.trainer]}

    def state_dict(self) -> dict[str, Any]:
        """The DRM's assignment carries over a resume (the split and threads it converged to)."""
        return {"split": list(self.split), "threads": list(self.threads.as_tuple()),
                "gpu_sampler": list(self.gpu_sampler), **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.split = [float(s) for s in state["split"]]
        self.threads = Threads(*state["threads"])
        self.gpu_sampler = [bool(b) for b in state["gpu_sampler"]]
        super().load_state_dict({k: v for k, v in state.items() if k not in ("split", "threads", "gpu_sampler")})
