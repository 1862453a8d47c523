"""The stages a pipelined sampled batch goes through before training (HyScale-GNN §III-B, Figure 4): sampling,
feature loading and data transfer of every trainer's share of a global batch. Each stage is a function of an
:class:`Iteration`, run on its own thread by :class:`~gnnscale.engines.core.pipeline.Pipeline`, and times itself.

1. **Sampling**: the shares sampled on the CPU go to a pool of sampler threads; an accelerator with a sampler of its
   own samples its share on its device (on a stream of its own), beside them (``SC`` and ``SA``).
2. **Feature loading**: every share's input rows gathered from host memory (into pinned buffers for CUDA), cut
   into slices gathered by a pool of loader threads (``Load``).
3. **Transfer**: each accelerator's rows (and the blocks the CPU sampled for it) copied on its copy stream, whose
   event the trainer's stream waits for; the stage's thread also waits on the host for its own copies, which is
   what times them (``Tran``, the slowest accelerator's).

Every copy, stream and wait is a :mod:`gnnscale.runtime` call, so the accelerator trainers run on the runtime's sim
device too (``tests/test_hybrid_sim.py``). Which wait orders what: the sampling stream's host synchronisation
orders a share sampled on its device before its loading and training; the transfer's host synchronisation and the
trainer's wait on the copy's event each order the copies before training (either alone suffices: the first times the
stage, the second keeps training ordered without it); the trainer's host synchronisation brings its loss to the
host and orders every later copy after the trainer's reads (a copy into memory it read then cannot race).

The hybrid engine drives them with its dynamic assignment (which sampler samples each share, the stages' thread
counts: :mod:`gnnscale.plan.hybrid`'s DRM).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.graph.block import Block
from gnnscale.sample import SampledAdjacency, Topology, sample_blocks
from gnnscale.store.features import FeatureSource
from gnnscale.store.global_store import GlobalMemoryStore


class Propagated(NamedTuple):
    """One trainer's forward and backward on its share of an iteration."""

    seconds: float
    """Wall seconds of its own work (not the waits for the other trainers' BatchNorm statistics): what DRM
    balances."""
    loss: Tensor | None
    """Its share of the batch's loss (``None`` without seeds)."""
    own_s: float
    """Seconds the work itself takes: the trainer thread's CPU time for a trainer on the CPU (its wall time
    counts the cores it waited for, which the model prices apart: the CPU's busy core-seconds over the cores),
    else the wall seconds. What the model's calibration scales Eq. 10 to."""


@dataclass(eq=False)
class Iteration:
    """One global mini-batch on its way through the pipeline."""

    index: int
    total: int
    parts: list[Tensor]
    """Per trainer, its seeds (CPU)."""
    version: int
    """The DRM assignment (split, samplers, threads) it was sampled under."""
    blocks: list[list[Block]] = field(default_factory=list)
    x: list[Tensor | None] = field(default_factory=list)
    sampled_on_device: list[bool] = field(default_factory=list)
    """Per trainer, whether its share was sampled on its own device (then its blocks are there already): fixed by
    the sample stage, since DRM may hand a sampler's work over while the iteration is between stages."""
    times: dict[str, float] = field(default_factory=dict)
    transfer_s: list[float] = field(default_factory=list)
    bytes_to: list[int] = field(default_factory=list)
    ready: list[rt.Event | None] = field(default_factory=list)


STAGE_TIMES = ("SC", "SA", "Load", "Tran", "TC", "TA", "sync")
"""The stages timed per iteration: sampling on the CPU and on the accelerators, loading, transfer (the slowest
accelerator's), training on the CPU and on the accelerators (the slowest's), and the synchronizer."""


class StageSums:
    """An epoch's seconds per stage (:data:`STAGE_TIMES`, summed over its iterations) and the bytes copied to each
    trainer's device, for trainers on ``devices`` (``cpu_index`` the CPU trainer's)."""

    def __init__(self, devices: int, cpu_index: int):
        self.cpu_index = cpu_index
        self.seconds = dict.fromkeys(STAGE_TIMES, 0.0)
        self.bytes_to = [0] * devices

    def add(self, it: Iteration, trained_s: list[float], sync_s: float) -> None:
        """Iteration ``it``'s stages, its trainers having taken ``trained_s`` and the synchronizer ``sync_s``."""
        accel = [s for g, s in enumerate(trained_s) if g != self.cpu_index]
        it.times.update(TC=trained_s[self.cpu_index], TA=max(accel, default=0.0), sync=sync_s)
        for k in self.seconds:
            self.seconds[k] += it.times.get(k, 0.0)
        for g, moved in enumerate(it.bytes_to):
            self.bytes_to[g] += moved

    def record(self) -> dict[str, float]:
        """``sc_s``, ``sa_s``, ``load_s``, ``tran_s``, ``tc_s``, ``ta_s``, ``sync_s``: the epoch's sums."""
        return {f"{k.lower()}_s": v for k, v in self.seconds.items()}


class SampledStages:
    """Sampling, loading and transfer for trainers on ``devices`` (``devices[cpu_index]`` the CPU trainer's):
    topology in host memory (``host_topo``) and, for the accelerators' own samplers, in ``store``; features in
    host memory (``host_x``)."""

    def __init__(self, devices: list[rt.Device], cpu_index: int, host_topo: Topology, host_x: Tensor | FeatureSource,
                 store: GlobalMemoryStore, fanouts: tuple[int, ...], adjacency: SampledAdjacency):
        self.devices, self.cpu_index = devices, cpu_index
        self.host_topo, self.host_x, self.store = host_topo, host_x, store
        self.fanouts, self.adjacency = fanouts, adjacency
        cuda = [d for d in devices if rt.is_accelerator(d)]
        self.store_index = {d: j for j, d in enumerate(cuda)}
        self.copy_streams = [rt.new_stream(d) for d in devices]
        self.sample_streams = [rt.new_stream(d) for d in devices]
        self.pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}

    def pool(self, stage: str, threads: int) -> ThreadPoolExecutor:
        """The stage's worker threads, kept across iterations; new ones when DRM changes their count."""
        have = self.pools.get(stage)
        if have is None or have[0] != threads:
            if have is not None:
                have[1].shutdown(wait=False)
            have = (threads, ThreadPoolExecutor(threads, thread_name_prefix=f"gnnscale-{stage}"))
            self.pools[stage] = have
        return have[1]

    def sample(self, it: Iteration, key: int, gpu_sampler: list[bool], threads: int) -> Iteration:
        """Stage 1: the CPU-sampled shares on ``threads`` threads; each share with ``gpu_sampler`` on its
        device."""
        G = len(self.devices)
        it.blocks = [[] for _ in range(G)]
        it.sampled_on_device = list(gpu_sampler)
        on_cpu = [g for g in range(G) if not gpu_sampler[g]]
        on_gpu = [g for g in range(G) if gpu_sampler[g]]

        def cpu(g: int) -> None:
            it.blocks[g] = sample_blocks(self.host_topo, it.parts[g], self.fanouts, key, self.adjacency)

        def gpu(g: int) -> float:
            dev, stream = self.devices[g], self.sample_streams[g]
            t0 = time.perf_counter()
            with rt.use_stream(stream), rt.on_device(dev):  # no stream (a CPU stand-in): the host store's reader
                reader = self.store.reader(self.store_index.get(dev, 0))
                it.blocks[g] = sample_blocks(reader, rt.to_device(it.parts[g], dev), self.fanouts, key,
                                             self.adjacency)
                rt.synchronize(stream)  # the loader reads the blocks' input ids, the trainer the blocks
            return time.perf_counter() - t0

        # the GPU samplers run beside the CPU sampler; a failure in either reaches the pipeline's consumer
        gpu_jobs = [self.pool("gpu-sampler", len(on_gpu)).submit(gpu, g) for g in on_gpu]
        t0 = time.perf_counter()
        list(self.pool("sampler", min(threads, max(len(on_cpu), 1))).map(cpu, on_cpu))
        it.times["SC"] = time.perf_counter() - t0 if on_cpu else 0.0
        it.times["SA"] = max((job.result() for job in gpu_jobs), default=0.0)
        return it

    def load(self, it: Iteration, threads: int) -> Iteration:
        """Stage 2: every trainer's input rows gathered from host memory (pinned for CUDA) on ``threads``
        threads, each a slice of the rows."""
        t0 = time.perf_counter()
        xs: list[Tensor | None] = []
        jobs = []
        for g, blocks in enumerate(it.blocks):
            src = blocks[0].src_ids
            assert src is not None
            src = rt.to_host(src, blocking=True)  # the ids of a share sampled on its device
            width = self.host_x.dim if isinstance(self.host_x, FeatureSource) else self.host_x.shape[1]
            out = rt.pinned_empty((src.numel(), width), dtype=self.host_x.dtype,
                                  device=self.devices[g])
            xs.append(out)
            step = -(-src.numel() // threads) if src.numel() else 1
            jobs += [(src[lo : lo + step], out[lo : lo + step]) for lo in range(0, src.numel(), step)]

        def gather(job: tuple[Tensor, Tensor]) -> None:
            if isinstance(self.host_x, FeatureSource):  # the disk tier behind its host cache
                self.host_x.gather_unchecked(job[0], out=job[1])
            else:
                torch.index_select(self.host_x, 0, job[0], out=job[1])

        if threads > 1 and len(jobs) > 1:
            list(self.pool("loader", threads).map(gather, jobs))
        else:
            for job in jobs:
                gather(job)
        it.x = xs
        it.times["Load"] = time.perf_counter() - t0
        return it

    def transfer(self, it: Iteration) -> Iteration:
        """Stage 3: each accelerator's features (and its topology, when the CPU sampled it: the sample stage's
        ``it.sampled_on_device``, not the samplers' assignment now) copied to it, asynchronously on its copy stream;
        the trainer's stream waits for the copy's event (``it.ready``), and this thread waits on the host for its
        own copies (the stage's time)."""
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
            with rt.use_stream(stream):
                it.x[g] = rt.to_device(x, dev)
                if not it.sampled_on_device[g]:
                    moved += sum(b.nbytes() for b in it.blocks[g])
                    it.blocks[g] = [b.map(functools.partial(rt.to_device, device=dev)) for b in it.blocks[g]]
                it.ready[g] = rt.record_event(stream)
                rt.synchronize(stream)  # the stage's time is the copy's (this thread only waits on its own)
            it.transfer_s[g] = time.perf_counter() - t0
            it.bytes_to[g] = moved
        it.times["Tran"] = max((s for g, s in enumerate(it.transfer_s) if g != self.cpu_index), default=0.0)
        return it
