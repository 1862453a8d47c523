"""Hybrid CPU + accelerator mini-batch training with dynamic resource management (HyScale-GNN, Lin et al.).

``--engine hybrid --devices cpu,cuda:0[,cuda:1...]`` runs one *trainer* per device (§III-A): the CPU trainer and one
per accelerator, each training its share of every iteration's global mini-batch (the mini-batch engine's epoch
shuffle and batches, its keyed sampler, its model replicas). The synchronizer sums the trainers' gradients,
weighted by their seeds, and the optimiser steps once: an iteration equals one step on the whole global batch,
whatever the split, because keyed sampling gives every seed the same neighbourhood in any share.

Four pipeline stages (§III-B, Figure 4), each on its own thread, joined by queues of one iteration
(:class:`~gnnscale.engines.pipeline.Pipeline`): **sampling** (the CPU sampler samples the CPU trainer's share
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

Further ``cpu:N`` devices (``--devices cpu:0,cpu:1``) stand in for accelerators on a machine without one: they
take an accelerator's place in the pipeline (transfer stage, the ``Accel`` stage of Algorithm 1), which is how the
CPU tests and benchmarks run this code.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.engines.minibatch import EVAL_EPOCH, MiniBatchEngine, _Batch, check_fanouts, default_fanouts
from gnnscale.engines.pipeline import Pipeline
from gnnscale.engines.replicas import Replicas
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.model import GNN
from gnnscale.plan.hybrid import (
    Decision,
    HybridModel,
    StageTimes,
    Threads,
    batch_shape,
    check_threads,
    default_threads,
    device_rates,
    drm_decide,
    fit_cost,
    measure_sampling,
    rebalance,
)
from gnnscale.plan.memory import available_device_bytes
from gnnscale.sample import CSRTopology, SampledAdjacency, Topology, sample_blocks, sample_key
from gnnscale.store.global_store import GlobalMemoryStore

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

DRM_TOLERANCE = 0.1
"""DRM leaves the work split alone while the trainers' times are within this fraction of each other: measured
times are noisy, and moving seeds back and forth costs more than it gains."""
COST_SAMPLES = 4
"""Iterations each trainer's cost model (``seconds = a + b * seeds``, what *balance work* splits by) is fitted
over: about one decision's worth (DRM decides at most every few iterations, the pipeline's depth), so the model
follows the split it measures (a share's sampled neighbourhood grows less than its seeds: seconds per seed
measured at an old split mislead) while one noisy iteration does not decide alone."""
CALIBRATION_RUNS = 8
"""Pipelined iterations that calibrate the model at set-up (their median is kept)."""
CALIBRATION_WARMUP = 2
"""Pipelined iterations before those, not measured (first touches of the features, the allocator's growth)."""
MIN_SHARE_SEEDS = 1
"""Seeds every trainer keeps in a full batch under DRM (a trainer with none could not be measured)."""


def hybrid_devices(config: TrainConfig) -> list[torch.device]:
    """The trainers' devices: ``--devices`` as given, else the CPU and every visible GPU."""
    if config.devices:
        return [torch.device(d) for d in config.devices]
    return [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]


@dataclass(eq=False)
class _Iteration:
    """One global mini-batch on its way through the pipeline."""

    index: int
    total: int
    parts: list[Tensor]
    """Per trainer, its seeds (CPU)."""
    version: int
    """The DRM assignment (split, samplers, threads) it was sampled under."""
    blocks: list[list[Block]] = field(default_factory=list)
    x: list[Tensor | None] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    transfer_s: list[float] = field(default_factory=list)
    bytes_to: list[int] = field(default_factory=list)
    ready: list[torch.cuda.Event | None] = field(default_factory=list)


def _canonical_device(name: str) -> str:
    """``cpu`` and ``cpu:0`` (``cuda`` and ``cuda:0``) name one device."""
    name = name.strip().lower()
    return f"{name}:0" if name in ("cpu", "cuda") else name


class HybridEngine(MiniBatchEngine):
    """Mini-batch training on the CPU and accelerators together: unequal trainers, a four-stage pipeline and DRM
    (HyScale-GNN)."""

    name = "hybrid"

    @classmethod
    def check_options(cls, config: TrainConfig) -> None:
        """The fanouts, the devices (a CPU among them, none twice) and the threads (no more than the cores)."""
        check_fanouts(config)
        if config.devices is not None:
            names = [_canonical_device(d) for d in config.devices]
            if not any(n.startswith("cpu") for n in names):
                raise ConfigError(f"--devices {','.join(config.devices)} has no CPU: the hybrid engine trains on the "
                                  "CPU beside the accelerators; add cpu (e.g. --devices cpu,cuda:0)")
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ConfigError(f"--devices {','.join(config.devices)} lists {', '.join(repeated)} more than "
                                  "once; the hybrid engine runs one trainer per device (cpu:1, cpu:2, ... stand in "
                                  "for accelerators on a machine without one)")
        if config.threads is not None:
            why = check_threads(config.threads, os.cpu_count() or 1)
            if why:
                raise ConfigError(why)

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device) -> list[str]:
        if config.engine != "hybrid":
            return ["trains on sampled neighbourhoods; choose it with --engine hybrid"]
        return cls.sampling_reasons(config)

    def __init__(self, graph: Graph, model: GNN, config: TrainConfig, device: torch.device):
        # the mini-batch engine's set-up is not reused: the store and trainers differ (features stay in host
        # memory for the CPU feature loader, HyScale-GNN §III-B)
        super(MiniBatchEngine, self).__init__(graph, model, config, device)
        self.fanouts = tuple(config.fanouts or default_fanouts(config.layers))
        self.adjacency = SampledAdjacency.from_graph(graph, model.adjacency, config.sample_norm)  # type: ignore[arg-type]
        self.devices = hybrid_devices(config)
        self.cpu_index = next(i for i, d in enumerate(self.devices) if d.type == "cpu")
        self.masks = {m: getattr(graph, m) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.train_ids = torch.nonzero(self.masks["train_mask"]).view(-1)
        if self.train_ids.numel() == 0:
            raise ConfigError(f"graph {graph.name} has no training vertices")
        cuda = [d for d in self.devices if d.type == "cuda"]
        if cuda:  # topology on the GPUs for their samplers, as much as half the budget holds; features on the host
            budget = (config.memory_budget if config.memory_budget is not None
                      else available_device_bytes(cuda[0]))
            self.store = GlobalMemoryStore(graph, cuda, adjacency=model.adjacency,
                                           gpu_graph_ratio=config.gpu_graph_ratio, gpu_feature_ratio=0.0,
                                           memory_budget=budget // 2, gather="index_select")
        else:
            self.store = GlobalMemoryStore(graph, [torch.device("cpu")], adjacency=model.adjacency,
                                           gpu_graph_ratio=0.0, gpu_feature_ratio=0.0)
        indptr, indices, weight = self.store.host_csr
        self.host_topo = CSRTopology(indptr.view(-1), indices.view(-1), None if weight is None else weight.view(-1))
        self.host_x = self.store.host_x
        assert graph.y is not None
        self.replicas = Replicas(model, self.devices, master=self.cpu_index)
        self.ys = [graph.y.to(d) for d in self.devices]
        self.y = graph.y
        self.store_index = {d: j for j, d in enumerate(cuda)}
        self.gpu_sampler = [d.type == "cuda" for d in self.devices]
        """Per trainer: its share is sampled on its own device (SA) rather than by the CPU sampler (SC)."""
        self.copy_streams = [torch.cuda.Stream(d) if d.type == "cuda" else None for d in self.devices]
        self.sample_streams = [torch.cuda.Stream(d) if d.type == "cuda" else None for d in self.devices]
        cores = os.cpu_count() or 1
        self.threads = Threads(*config.threads) if config.threads else default_threads(cores)
        self.slowdown = [1.0] * len(self.devices)
        """Benchmark hook: trainer ``g``'s propagation takes ``slowdown[g]`` times its work (it sleeps
        ``slowdown[g] - 1`` times the CPU time its thread spent: with one intra-op thread, the work itself and not
        the waits for a core), a slower device simulated without taking cores from the others."""
        self.trainer_pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="gnnscale-trainer")
        self.pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}
        self.version = 0
        self.warm = False
        self.step = 0
        """Iterations trained so far in this run (DRM's log counts in them)."""
        self.iteration_s: list[float] = []
        """The last epoch's seconds per iteration (wall time between the ends of consecutive iterations)."""
        self.samples: list[list[tuple[int, float]]] = [[] for _ in self.devices]
        """Per trainer, its last :data:`COST_SAMPLES` iterations' seeds and seconds."""
        self.drm_log: list[dict[str, Any]] = []
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
        g = self.graph
        assert g.num_classes is not None
        dims = (g.num_features, *([self.config.hidden] * (self.config.layers - 1)), g.num_classes)
        key = sample_key(self.config.seed, 0)
        size = min(self.config.batch_size, self.train_ids.numel())
        cpu_table = measure_sampling(self.host_topo, self.train_ids, self.fanouts, dims, size, cores, key,
                                     self.adjacency)
        cuda = [d for d in self.devices if d.type == "cuda"]
        gpu_table = None
        if cuda:
            gpu_table = measure_sampling(self.store.reader(0), self.train_ids.to(cuda[0]), self.fanouts, dims,
                                         size, 1, key, self.adjacency)
        rates = [device_rates(d if d.type == "cuda" else torch.device("cpu")) for d in self.devices]
        return HybridModel(dims=dims, cpu_sampling=cpu_table, gpu_sampling=gpu_table, rates=rates,
                           cpu_index=self.cpu_index, gpu_sampled=list(self.gpu_sampler), cores=cores)

    def _calibrate(self) -> None:
        """A few iterations through the real pipeline (every trainer on an equal share, gradients discarded; the
        first :data:`CALIBRATION_WARMUP` not measured): each trainer's measured forward and backward scales its
        Eq. 10, and the measured iteration scales Eq. 6 (:meth:`HybridModel.calibrate`)."""
        size = min(self.config.batch_size, self.train_ids.numel())
        G = len(self.devices)
        equal = [1 / G] * G
        seeds = self.train_ids[self._order(0)[:size]]
        items = (_Iteration(i, size, self._cut(seeds, equal), self.version)
                 for i in range(CALIBRATION_WARMUP + CALIBRATION_RUNS))
        key = sample_key(self.config.seed, 0)
        stages = [("sampler", lambda it: self._sample(it, key)), ("loader", self._load),
                  ("transfer", self._transfer)]
        before = torch.get_num_threads()
        runs, walls = [], []
        last: _Iteration | None = None
        try:
            with Pipeline(items, stages, depth=1, handoff=True) as pipe:
                t_last = time.perf_counter()
                for it in pipe:
                    runs.append([r[0] for r in self.trainer_pool.map(
                        functools.partial(self._propagate, it=it, se=(self.config.seed, 0)), range(G))])
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
        times = [statistics.median(run[g] for run in runs[CALIBRATION_WARMUP:]) for g in range(G)]
        dims = self.perf.dims
        shapes = [batch_shape(last.blocks[g], dims) if last.parts[g].numel() else
                  self.perf.cpu_sampling.shape(1, dims) for g in range(G)]
        self.perf.calibrate(times, shapes, self.threads, statistics.median(walls[CALIBRATION_WARMUP:]), size, equal)

    def describe(self) -> str:
        names = ", ".join(f"{d}{' (CPU trainer)' if g == self.cpu_index else ''}" for g, d in enumerate(self.devices))
        split = ", ".join(f"{s:.2f}" for s in self.split)
        origin = "from the performance model" if self.config.shares is None else "from --shares"
        t = self.threads
        return (f"hybrid: batch {self.config.batch_size}, fanouts {','.join(map(str, self.fanouts))}, trainers "
                f"{names}; split {split} ({origin}), threads: sampler {t.sampler}, loader {t.loader}, CPU trainer "
                f"{t.trainer}; DRM {self.config.drm}")

    # ------------------------------------------------------------------------------------------------ stages
    def _cut(self, batch: Tensor, split: list[float]) -> list[Tensor]:
        """Trainer ``g`` takes seeds ``[round(n c_{g-1}), round(n c_g))`` of the batch (``c``: cumulative split)."""
        cum = torch.cumsum(torch.tensor(split, dtype=torch.float64), 0)[:-1]
        bounds = torch.round(cum * batch.numel()).long().tolist()
        return list(torch.tensor_split(batch, bounds))

    def _pool(self, stage: str, threads: int) -> ThreadPoolExecutor:
        """The stage's worker threads, kept across iterations; new ones when DRM changes their count."""
        have = self.pools.get(stage)
        if have is None or have[0] != threads:
            if have is not None:
                have[1].shutdown(wait=False)
            have = (threads, ThreadPoolExecutor(threads, thread_name_prefix=f"gnnscale-{stage}"))
            self.pools[stage] = have
        return have[1]

    def _sample(self, it: _Iteration, key: int) -> _Iteration:
        """Stage 1: the CPU sampler's shares on ``threads.sampler`` threads; each GPU sampler's on its device."""
        G = len(self.devices)
        it.blocks = [[] for _ in range(G)]
        on_cpu = [g for g in range(G) if not self.gpu_sampler[g]]
        on_gpu = [g for g in range(G) if self.gpu_sampler[g]]

        def cpu(g: int) -> None:
            it.blocks[g] = sample_blocks(self.host_topo, it.parts[g], self.fanouts, key, self.adjacency)

        def gpu(g: int) -> float:
            dev, stream = self.devices[g], self.sample_streams[g]
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):  # no stream (a CPU stand-in, in tests): the host store's reader
                reader = self.store.reader(self.store_index.get(dev, 0))
                it.blocks[g] = sample_blocks(reader, it.parts[g].to(dev, non_blocking=True), self.fanouts, key,
                                             self.adjacency)
                if stream is not None:
                    stream.synchronize()
            return time.perf_counter() - t0

        # the GPU samplers run beside the CPU sampler; a failure in either reaches the pipeline's consumer
        gpu_jobs = [self._pool("gpu-sampler", len(on_gpu)).submit(gpu, g) for g in on_gpu]
        t0 = time.perf_counter()
        list(self._pool("sampler", min(self.threads.sampler, max(len(on_cpu), 1))).map(cpu, on_cpu))
        it.times["SC"] = time.perf_counter() - t0 if on_cpu else 0.0
        it.times["SA"] = max((job.result() for job in gpu_jobs), default=0.0)
        return it

    def _load(self, it: _Iteration) -> _Iteration:
        """Stage 2: every trainer's input rows gathered from host memory (pinned for CUDA) on
        ``threads.loader`` threads, each a slice of the rows."""
        t0 = time.perf_counter()
        xs: list[Tensor | None] = []
        jobs = []
        for g, blocks in enumerate(it.blocks):
            src = blocks[0].src_ids
            assert src is not None
            src = src.cpu()
            out = torch.empty(src.numel(), self.host_x.shape[1], pin_memory=self.devices[g].type == "cuda")
            xs.append(out)
            k = self.threads.loader
            step = -(-src.numel() // k) if src.numel() else 1
            jobs += [(src[lo : lo + step], out[lo : lo + step]) for lo in range(0, src.numel(), step)]

        def gather(job: tuple[Tensor, Tensor]) -> None:
            torch.index_select(self.host_x, 0, job[0], out=job[1])

        if self.threads.loader > 1 and len(jobs) > 1:
            list(self._pool("loader", self.threads.loader).map(gather, jobs))
        else:
            for job in jobs:
                gather(job)
        it.x = xs
        it.times["Load"] = time.perf_counter() - t0
        return it

    def _transfer(self, it: _Iteration) -> _Iteration:
        """Stage 3: each accelerator's features (and its topology, when the CPU sampled it) copied to it,
        asynchronously on its copy stream; the trainer waits for the copy's event, not the host."""
        G = len(self.devices)
        it.transfer_s, it.bytes_to, it.ready = [0.0] * G, [0] * G, [None] * G
        for g in range(G):
            if g == self.cpu_index:
                continue
            dev, stream = self.devices[g], self.copy_streams[g]
            t0 = time.perf_counter()
            x = it.x[g]
            assert x is not None
            moved = x.numel() * x.element_size()
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                it.x[g] = x.to(dev, non_blocking=True)
                if not self.gpu_sampler[g]:
                    moved += sum(b.nbytes() for b in it.blocks[g])
                    it.blocks[g] = [b.to(dev, non_blocking=True) for b in it.blocks[g]]
                if stream is not None:
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    it.ready[g] = ev
                    stream.synchronize()  # the stage's time is the copy's (this thread only waits on its own)
            it.transfer_s[g] = time.perf_counter() - t0
            it.bytes_to[g] = moved
        it.times["Tran"] = max((s for g, s in enumerate(it.transfer_s) if g != self.cpu_index), default=0.0)
        return it

    # ------------------------------------------------------------------------------------------------ training
    def _iterations(self, epoch: int) -> Iterator[_Iteration]:
        """The epoch's global batches, each cut by the split current when the sampler takes it."""
        seeds = self.train_ids[self._order(epoch)]
        size = self.config.batch_size
        for i, lo in enumerate(range(0, seeds.numel(), size)):
            batch = seeds[lo : lo + size]
            # the version first: a decision landing between the two reads then leaves the iteration labelled
            # with the older version, which DRM skips (never a new version on an old split)
            version = self.version
            yield _Iteration(i, batch.numel(), self._cut(batch, self.split), version)

    def _propagate(self, g: int, it: _Iteration, se: tuple[int, int]) -> tuple[float, Tensor | None]:
        """Trainer ``g``'s forward and backward on its share; its seconds and its share of the batch's loss."""
        seeds = it.parts[g]
        if seeds.numel() == 0:
            return 0.0, None
        dev, model = self.devices[g], self.replicas.models[g]
        ev = it.ready[g] if it.ready else None
        if ev is not None:
            consumer = torch.cuda.current_stream(dev)
            consumer.wait_event(ev)
        if g == self.cpu_index:
            torch.set_num_threads(self.threads.trainer)
        t0, cpu0 = time.perf_counter(), time.thread_time()
        x = it.x[g]
        assert x is not None
        h = x
        for i, (layer, block) in enumerate(zip(model.block_layers, it.blocks[g], strict=True)):
            h = layer(block, model.layer_input(i, h, block.row_ids(), se))
        loss = F.cross_entropy(h, self.ys[g][seeds.to(dev)], reduction="sum") / it.total
        loss.backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - t0
        if self.slowdown[g] > 1.0:  # the work's CPU time again (f - 1) times, not the waits for a shared core
            extra = (self.slowdown[g] - 1.0) * (time.thread_time() - cpu0)
            time.sleep(extra)
            elapsed += extra
        return elapsed, loss.detach().to("cpu") * it.total

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        self.model.train()
        self.replicas.sync()
        se = (self.config.seed, epoch)
        key = sample_key(self.config.seed, epoch)
        G = len(self.devices)
        threads_before = torch.get_num_threads()
        stage_sum = dict.fromkeys(("SC", "SA", "Load", "Tran", "TC", "TA", "sync"), 0.0)
        trainer_s, seeds_per, edges_per, bytes_to = [0.0] * G, [0] * G, [0] * G, [0] * G
        loss_sum, iters, work_moves, thread_moves = 0.0, 0, 0, 0
        t_epoch = t_last = time.perf_counter()
        self.iteration_s = []
        stages = [("sampler", lambda it: self._sample(it, key)), ("loader", self._load),
                  ("transfer", self._transfer)]
        try:
            with Pipeline(self._iterations(epoch), stages, depth=1, handoff=True) as pipe:
                for it in pipe:
                    self.optimizer.zero_grad(set_to_none=True)
                    results = list(self.trainer_pool.map(functools.partial(self._propagate, it=it, se=se), range(G)))
                    t0 = time.perf_counter()
                    self.replicas.reduce()
                    self.optimizer.step()
                    self.replicas.sync()
                    sync_s = time.perf_counter() - t0
                    times = [r[0] for r in results]
                    loss_sum += sum(float(r[1]) for r in results if r[1] is not None)
                    accel = [g for g in range(G) if g != self.cpu_index]
                    it.times["TC"] = times[self.cpu_index]
                    it.times["TA"] = max((times[g] for g in accel), default=0.0)
                    it.times["sync"] = sync_s
                    for k in stage_sum:
                        stage_sum[k] += it.times.get(k, 0.0)
                    for g in range(G):
                        trainer_s[g] += times[g]
                        seeds_per[g] += int(it.parts[g].numel())
                        edges_per[g] += sum(b.num_edges for b in it.blocks[g])
                        bytes_to[g] += it.bytes_to[g] if it.bytes_to else 0
                    iters += 1
                    now = time.perf_counter()
                    self.iteration_s.append(now - t_last)  # wall time from the previous iteration's end
                    t_last = now
                    self.step += 1
                    if self.config.drm == "on":
                        d = self._drm(it, times)
                        work_moves += d.kind == "work"
                        thread_moves += d.kind == "thread"
        finally:
            torch.set_num_threads(threads_before)
        epoch_s = time.perf_counter() - t_epoch
        n = self.train_ids.numel()
        edges = sum(edges_per)
        self.measured = {k: v / max(iters, 1) for k, v in stage_sum.items()}
        self.measured["epoch_s"] = epoch_s
        self.measured["iteration"] = epoch_s / max(iters, 1)
        self.perf.gpu_sampled = list(self.gpu_sampler)
        self.predicted = self.perf.stage_times(self.config.batch_size, self.split, self.threads)
        self.predicted["epoch_s"] = self.perf.epoch_time(n, self.config.batch_size, self.split, self.threads)
        out: dict[str, Any] = {
            "loss": loss_sum / n, "batches": iters, "trainers": G,
            **{f"{k.lower()}_s": v for k, v in stage_sum.items()},
            "trainer_s": trainer_s, "trainer_seeds": seeds_per, "trainer_sampled_edges": edges_per,
            "sampled_edges": edges, "mteps": edges / epoch_s / 1e6,
            "split": [round(s, 4) for s in self.split],
            "threads": [self.threads.sampler, self.threads.loader, self.threads.trainer],
            "gpu_sampled": [g for g in range(G) if self.gpu_sampler[g]],
            "accel_bytes": [bytes_to[g] for g in range(G) if g != self.cpu_index],
            "drm_work_moves": work_moves, "drm_thread_moves": thread_moves,
            "predicted_epoch_s": self.predicted["epoch_s"],
        }
        return out

    # ------------------------------------------------------------------------------------------------ DRM
    def _drm(self, it: _Iteration, times: list[float]) -> Decision:
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

    def _busy(self, it: _Iteration, times: list[float]) -> list[float]:
        """Each trainer's seconds in iteration ``it``; an accelerator's bundles its transfer (Algorithm 1,
        line 1: ``T_Accel = max(T_Tran, T_TA)``)."""
        return [max(times[g], it.transfer_s[g]) if g != self.cpu_index else times[g]
                for g in range(len(self.devices))]

    def _apply(self, d: Decision, it: _Iteration, times: list[float]) -> Decision | None:
        """Carry out ``d``; the decision carried out, or ``None``. A thread move with no thread to give (the donor
        has one) speeds the bottleneck up the other way Algorithm 1 knows: its work moves to its counterpart
        (the CPU trainer's to the accelerators, the CPU sampler's to the GPU samplers), where there is one."""
        if d.kind == "thread":
            moved = self.threads.move(d.src, d.dst)  # type: ignore[arg-type]
            if moved is not None:
                self.threads = moved
                self.version += 1
                return d
            other = {"TC": "Accel", "SC": "SA"}.get(d.dst or "")
            if other is None:
                return None
            d = Decision("work", d.dst, other, d.bottleneck)
        if d.kind == "work" and {d.src, d.dst} == {"TC", "Accel"}:
            seeds = [int(p.numel()) for p in it.parts]
            new = rebalance(self.split, self._busy(it, times), seeds,
                            min_share=MIN_SHARE_SEEDS / self.config.batch_size, tolerance=DRM_TOLERANCE,
                            costs=[fit_cost(x) for x in self.samples])
            if new is None:
                return None
            self.split = new
        elif d.kind == "work":  # SC <-> SA: one accelerator's sampling moves between the CPU and its device
            cuda = [g for g in range(len(self.devices)) if self.devices[g].type == "cuda"]
            movable = [g for g in cuda if self.gpu_sampler[g] == (d.dst == "SC")]
            if not movable:
                return None
            self.gpu_sampler[movable[0]] = d.dst == "SA"
        else:
            return None
        self.version += 1
        return d

    # ------------------------------------------------------------------------------------------------ inference
    def _eval_topology(self) -> Topology:
        return self.host_topo

    def _eval_features(self, src: Tensor) -> Tensor:
        return self.host_x.index_select(0, src.cpu()).to(self.device)

    def _sampled_eval(self, fanouts: tuple[int, ...]) -> dict[str, float | None]:
        """``--eval-fanouts``: the master model on the CPU over sampled batches (the mini-batch engine's keying)."""
        pred = torch.full((self.graph.num_nodes,), -1, dtype=torch.int64)
        ids = torch.nonzero(torch.stack(list(self.masks.values())).any(0)).view(-1)
        key = sample_key(self.config.seed, EVAL_EPOCH)
        for lo in range(0, ids.numel(), self.config.batch_size):
            seeds = ids[lo : lo + self.config.batch_size]
            blocks = sample_blocks(self.host_topo, seeds, fanouts, key, self.adjacency)
            x = self._eval_features(blocks[0].src_ids)  # type: ignore[arg-type]
            pred[seeds] = self._forward(_Batch(seeds, blocks, x, 0.0, 0.0), None).argmax(-1).cpu()
        return self.accuracies(pred, self.y.cpu(), self.masks)

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
                "gpu_sampler": list(self.gpu_sampler)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.split = [float(s) for s in state["split"]]
        self.threads = Threads(*state["threads"])
        self.gpu_sampler = [bool(b) for b in state["gpu_sampler"]]
