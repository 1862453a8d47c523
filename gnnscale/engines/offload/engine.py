"""HongTu's offload engine: full-graph training with every vertex's data in host memory (HongTu Algorithms 1-4).

The graph is cut into ``partitions x chunks`` destination chunks (:mod:`gnnscale.partition`); partition ``i`` runs
on worker ``i mod len(devices)`` (one thread, stream set and model replica per device,
:mod:`~gnnscale.engines.offload.workers`), and a *batch* -- the chunks at one position of every partition, in the
planner's (possibly reorganised, Algorithm 4) schedule -- runs concurrently. Per epoch (:meth:`OffloadEngine.
train_epoch`, each step one pass over the schedule, :mod:`~gnnscale.engines.offload.layers`):

1. **Forward**, layer by layer, chunk by chunk: gather the chunk's source rows ``h^l[N_k]`` (layer ``l``'s input)
   from host memory, run the layer, apply the next layer's activation and keyed dropout to the destination rows
   and copy them back as ``h^{l+1}[V_k]`` -- once per vertex, not once per replica (layer 0 applies dropout to
   the gathered features). A layer whose AGGREGATE is a
   parameter-free linear map (GCN, SAGE, GIN, MLP) also copies its aggregation ``a^l[V_k]`` to host memory: the
   recomputation-caching hybrid (§4.2). A layer that projects before a parameter-free propagation (GCN/SAGE
   wider in than out) first projects every vertex once into host ``p^l``, then moves the narrower projected
   rows and caches the propagation the same way; its backward ends with one per-vertex pass through the
   projection.
2. **Last layer, loss and its backward**, fused per chunk: the last layer is computed with autograd, its
   cross-entropy share taken (the sum over the chunk's training vertices divided by the global count) and
   backpropagated at once, so its output never needs a host round trip.
3. **Backward**, layer ``L-2`` down to ``0``, chunk by chunk: load ``dL/dx^{l+1}[V_k]`` (the gradient of the next
   layer's input), recompute this layer (cached layers: only UPDATE, from ``a^l[V_k]``; others, GAT: the whole
   layer from ``h^l[N_k]``) together with the next layer's activation and dropout, backpropagate, and add the
   source rows' gradients into the host buffer ``dL/dx^l`` (the sum over chunks is the full gradient, because
   sources only *sum* gradients along out-edges). Layer 0 computes no gradient for the input features.
4. Parameter gradients summed over the replicas, one optimiser step.

Source rows reach a chunk in one of three ways (``--dedup``, :mod:`gnnscale.partition.dedup`): gathered from host
memory per chunk (``none``), or assembled from per-device *transition buffers*
(:mod:`~gnnscale.engines.offload.exchange`) into which each batch's rows are loaded once, by the partition that
owns them (``full``, Algorithm 2) or per partition (``reuse``), rows kept from the previous batch staying in their
slots. Source-row gradients go the opposite way into the same slots and reach host memory once each time a row
leaves the device (Algorithm 3).

The features (layer 0's input) are read only through feature sources (:mod:`gnnscale.store.features`; one per
worker, :class:`~gnnscale.engines.offload.workers.Features`: an ``InMemorySource`` on the CPU, a
``PinnedHostSource`` read by the worker's row mover on an accelerator, with the mover's copies, staging and
waits; with ``--host-memory`` and a converted directory's ``x.npy``, the shared disk tier
(:func:`~gnnscale.engines.core.disk_tier.open_disk_tier`: one :class:`~gnnscale.store.disk.DiskSource` per worker,
read through a :class:`~gnnscale.store.sources.ReorderedRows` that maps the engine's vertex order back to file
rows), so every feature row read is counted per tier
(``engine.features.read_stats()``). The later layers'
inputs, gradients, projections and cached aggregations are plain host buffers: the engine's own scratch, written
and read back during the epoch, not features; with ``--host-memory`` those the planner's budget cannot hold
(:func:`~gnnscale.plan.host.plan_host`: what the budget has left after the model, the vertex arrays and the read
buffers) are file-backed in ``--scratch`` (default: the system's temporary folder;
:class:`~gnnscale.engines.offload.workers.Spill`: unlinked shared maps, bit-exact, nothing left in the folder
whatever ends the run).

Dropout masks are keyed by (seed, epoch, layer, *original* vertex id), so forward, recomputation and the in-memory
engine draw the same masks. The result is the in-memory engine's, up to floating-point summation order.

On a CPU without a device budget or a host one (no ``--gpu-memory``, no ``--host-memory``: host memory is the
device, and the 4 bytes an edge of the blocks over host rows need no planning) the chunks read what the
host holds where it is: a propagation, or a cached parameter-free AGGREGATE after layer 0, multiplies the host
table itself through the chunk's block over its rows (:meth:`~gnnscale.engines.core.chunks.Chunk.in_place`), and a
cached propagation's source gradients are added into host rows as they are made
(:meth:`~gnnscale.nn.base.BlockLayer.aggregate_vjp_add`): the same sums in the same order as gathering, without
the per-chunk copies (``tests/test_offload_in_place.py``). With a budget the CPU stands in for the accelerator it
is for, and gathers.

On an accelerator (a GPU, or the runtime's sim device) the host buffers are pinned where the device needs it, the next
chunk's rows and topology are loaded on a copy stream while the current chunk computes, and gradient accumulation into
host memory runs on a worker thread (all in the row mover, :mod:`~gnnscale.engines.core.mover`, through
:mod:`gnnscale.runtime`), and ``peak_device_bytes`` is the device's allocation peak; on the CPU the same code runs
synchronously and ``peak_device_bytes`` is measured by :class:`~gnnscale.plan.memory.LiveBytesCounter` (every epoch
under ``--gpu-memory``; else the first, later epochs reporting the process's peak as the other engines do). Every epoch
record carries the planner's ``estimated_peak_device_bytes`` (per device) beside that count. Per pass a device waits
twice per chunk (its copy stream for its compute stream, its compute stream for the chunk's loads) and the host once
(:meth:`~gnnscale.engines.core.mover.RowMover.barrier`), plus once per accumulation into host memory on the
accumulating thread.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.config import ChunkOptions, GatherOptions, OffloadOptions, PartitionOptions
from gnnscale.engines.core.base import Engine
from gnnscale.engines.core.chunks import Chunk, cut_chunks
from gnnscale.engines.core.disk_tier import anon_rss_bytes, host_plan, open_disk_tier
from gnnscale.engines.core.mover import RowMover
from gnnscale.engines.core.replicas import Replicas
from gnnscale.engines.offload.layers import LayerPasses
from gnnscale.engines.offload.rows import HostRows
from gnnscale.engines.offload.sweep import Sweep
from gnnscale.engines.offload.workers import Features, Spill, Worker, WorkerGroup
from gnnscale.errors import ConfigError
from gnnscale.graph.block import normalized_csr
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.stack import Stack
from gnnscale.notes import note
from gnnscale.partition import permute_csr
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.fullgraph_time import offload_recompute, predict_offload
from gnnscale.plan.host import HostPlan
from gnnscale.plan.memory import LiveBytesCounter, replica_baseline
from gnnscale.plan.offload import OffloadPlan, describe, plan_offload, topology_bytes
from gnnscale.plan.rates import Rates
from gnnscale.plan.work import compute_terms, layer_work, parameters_of
from gnnscale.store import default_gather_method, triton_available
from gnnscale.store.disk import DiskSource, Upcast
from gnnscale.store.sources import ReorderedRows as DiskRows
from gnnscale.units import format_bytes

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

H2D_KINDS = ("row", "topology", "index")
"""Host->device bytes by kind: vertex rows (features, activations, gradients, labels), chunk topology, and index
tensors (row ids, buffer slots, positions)."""


class OffloadEngine(Engine):
    """Full-graph training with vertex data in host memory, batch by batch (HongTu Algorithms 1-4)."""

    name = "offload"
    host_layer_copies = 2
    host_topology_copies = 6.0  # the planner's edge gaps, the normalised, permuted and transposed CSR, the blocks
    trains_jk = True  # the last layer's pass reads the earlier layers' stored outputs beside it (GNN.head)
    plan_kind = "partition"
    mode = "full"
    spills_to_scratch = True
    also_reads = ("host_memory",)  # the features from disk, the host buffers past it spilled to --scratch
    options = (ChunkOptions, PartitionOptions, OffloadOptions, GatherOptions)

    @classmethod
    def batch_norm_reason(cls, config: TrainConfig) -> str | None:
        """None: a statistics pass and a gradient-sums pass over the chunks per BatchNorm make each chunk's
        normalisation, and its backward, the whole layer's (:class:`~gnnscale.engines.offload.layers.LayerPasses`)."""
        del config
        return None

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: rt.Device, *,
                               model: Stack | None = None) -> list[str]:
        reasons = []
        devices = worker_devices(config, device)
        # the UVA gather reads pinned host memory from a CUDA kernel: a device that pins its host memory
        if config.gather == "uva" and not (rt.needs_pinning(devices[0]) and triton_available()):
            reasons.append("--gather uva needs a CUDA device and Triton")
        try:
            plan_offload(graph, config, device, model)
        except ConfigError as exc:
            reasons.append(str(exc))
        return reasons

    @classmethod
    def estimate(cls, graph: Graph, config: TrainConfig, device: rt.Device, *, model: Stack | None = None) -> str:
        plan = plan_offload(graph, config, device, model)
        p = plan.partition
        return (f"{p.chunks} chunk(s) per partition x {p.partitions} partition(s) on {plan.devices} device(s), "
                f"about {format_bytes(plan.estimate)} per device")

    @classmethod
    def predict_epoch(cls, graph: Graph, config: TrainConfig, device: rt.Device, rates: Rates, *,
                      model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime | None:
        """HongTu's model on the planner's own plan (memoised: the one its checks made;
        :func:`~gnnscale.plan.fullgraph_time.predict_offload`)."""
        return predict_offload(graph, config, device, rates, plan_offload(graph, config, device, model),
                               model=model, cluster=cluster)

    @classmethod
    def predict_floor(cls, graph: Graph, config: TrainConfig, device: rt.Device, rates: Rates, *,
                      model: Stack | None = None) -> float:
        """The computation alone, over the devices (no plan needed): the epoch cannot be shorter."""
        work = layer_work(graph, config, model)
        terms = compute_terms(work, rates, num_classes=graph.num_classes or 1,
                              params=parameters_of(graph, config, model))
        share = len(config.devices or [device]) if rt.is_accelerator(device) else 1
        return (sum(terms.values()) + offload_recompute(work, rates)) / share

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: rt.Device):
        super().__init__(graph, model, config, rt.torch_device(device))
        self.device = device  # type: ignore[assignment]  # a runtime device: the model is where its tensors are
        self.plan: OffloadPlan = plan_offload(graph, config, device, model)
        self.timings = dict(self.plan.timings)
        part = self.plan.partition
        self.partitions, self.num_chunks = part.partitions, part.num_chunks
        devices = worker_devices(config, device)
        gather = default_gather_method(devices[0]) if config.gather == "auto" else config.gather
        host_lock = threading.Lock() if len(devices) > 1 else None
        self.replicas = Replicas(model, devices)
        self.workers = [
            Worker(w, dev, self.replicas.models[w],
                   RowMover(dev, gather=gather, host_lock=host_lock, resident=self.plan.resident_topology,
                            in_place=config.memory_budget is None and config.host_memory is None),
                   [i for i in range(self.partitions) if i % len(devices) == w])
            for w, dev in enumerate(devices)]
        self.group = WorkerGroup(self.workers)
        pin = rt.needs_pinning(devices[0])
        host = partial(_pinned, device=devices[0]) if pin else _unchanged
        perm = part.perm
        assert graph.x is not None and graph.y is not None
        # on a CPU the chunk being computed is host memory too: the planner's modelled peak, held by the host plan
        chunk_bytes = 0 if pin or config.host_memory is None else self.plan.estimate
        self.host_plan = host_plan(graph, config, model, readers=len(self.workers), cache=False,
                                   activation_bytes=HostRows.buffer_bytes(model, graph.num_nodes),
                                   working_bytes=chunk_bytes)
        if self.host_plan is not None and self.host_plan.spills:  # the pages one chunk touches in the spill files
            self.host_plan = host_plan(graph, config, model, readers=len(self.workers), cache=False,
                                       activation_bytes=HostRows.buffer_bytes(model, graph.num_nodes),
                                       working_bytes=chunk_bytes + spill_window(model, self.plan, graph.num_nodes))
        """The planner's split of ``--host-memory`` (read buffers, activations in RAM, the rest spilled)."""
        self.tier = open_disk_tier(graph, self.host_plan, self.name)
        self.disk: list[DiskSource] = [] if self.tier is None else self.tier.sources
        if self.disk:  # read x.npy's rows (bf16: 2 bytes an element), mapped to the new order
            # the engine keeps float32 features: bfloat16 rows are cast after the move, on the worker's device
            self.features = Features(tuple(Upcast(DiskRows(d, perm, w.device)) if d.dtype != torch.float32
                                           else DiskRows(d, perm, w.device)
                                           for d, w in zip(self.disk, self.workers, strict=True)))
        else:
            x = host(graph.x.index_select(0, perm).float())  # [N, F0] features in the new order
            self.features = Features(tuple(w.io.source(x) for w in self.workers))
        """The features, read only through their sources (each worker's; counted by ``features.read_stats()``)."""
        self._read_before = self.features.read_stats()
        self.y = host(graph.y.index_select(0, perm))
        self.masks = {m: getattr(graph, m).index_select(0, perm) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.num_train = int(self.masks["train_mask"].sum())
        self.spill: Spill | None = None
        # under --host-memory on a device that reads host memory as it is (not pinned), the chunks' blocks are file
        # pages when what the budget has left after the activations cannot hold them
        files = 0 if self.host_plan is None or pin else chunk_file_bytes(model, self.plan, graph.num_nodes,
                                                                         graph.num_edges)
        if self.host_plan is not None and files <= self.host_plan.free_bytes:
            files = 0
        if self.host_plan is not None and (self.host_plan.spills or files):
            if config.scratch is None:
                note(f"--host-memory {format_bytes(self.host_plan.budget)}: {_spill_what(self.host_plan, files)} "
                     f"spilled to files in {tempfile.gettempdir()} (--scratch DIR chooses the folder)")
            self.spill = Spill(config.scratch or "", self.host_plan.ram_activation_bytes,
                               self.host_plan.activation_bytes, files=files)
        try:
            self.chunks = self._build_chunks(graph, host if self.spill is None or not files else self.spill.copy)
            for chunk in self.chunks:  # the reads pass ids unchecked (no reduction per read): check them once here
                self.features.sources[0].check_range(chunk.rows)
            if pin and self.plan.exchange is not None:
                self.plan.exchange.pin_memory()
            self.sweep = Sweep(self.group, self.chunks, self.plan.schedule.tolist(), self.plan.exchange)
            if self.spill is not None:  # the spilled pages a chunk touched leave the process after it
                self.sweep.after_chunk = self.spill.release
            self._pred = host(torch.empty(graph.num_nodes, dtype=torch.int64))
            self.host = HostRows.allocate(model, self.features, host, self.spill)
        finally:
            if self.spill is not None:
                self.spill.finish()  # the files are unlinked already: nothing stays in the scratch folder
        self.passes = LayerPasses(model, self.host, self.sweep, self.num_train)
        cpu = not rt.is_accelerator(devices[0])
        self.counter = LiveBytesCounter() if cpu and len(devices) == 1 else None
        self._counting_now, self._epochs_counted = False, 0
        """Whether this epoch runs under :attr:`counter` (on one CPU: every epoch under ``--gpu-memory``, which
        rehearses a device's budget; else the first epoch only: counting every op costs Python time per op, 1.2x
        the epoch of a PyG GraphConv stack at 8 chunks, benchmarks/HISTORY.md)."""
        if cpu and len(devices) > 1:
            for w in self.workers:
                w.counter = LiveBytesCounter()
        self._resident = sum(p.numel() * p.element_size() for p in model.parameters())

    def _build_chunks(self, graph: Graph, host: Callable[[Tensor], Tensor]) -> list[Chunk]:
        """Every chunk's block, cut once from the normalised adjacency in the new order: int32 where it fits, the
        transpose built here when a layer's backward needs it, pinned for a GPU."""
        part = self.plan.partition
        indptr, indices, weight = normalized_csr(graph, self.model.adjacency)
        indptr, indices, weight = permute_csr(indptr, indices, weight, part.perm, part.inverse())
        bounds = [part.chunk_range(k) for k in range(part.num_chunks)]
        return cut_chunks(indptr, indices, weight, bounds, self.plan.rows, train=self.masks["train_mask"], y=self.y,
                          ids=part.perm,  # the original ids: the dropout keys
                          transpose=any(layer.sparse_backward for layer in self.model.block_layers), host=host)

    # ------------------------------------------------------------------------------------------------ training
    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.replicas.sync()  # the replicas take the master's parameters
        self._reset_counters()
        self._read_before = self.features.read_stats()
        key = (self.config.seed, epoch)
        num_layers = len(self.model.layers)
        try:
            with self._counting():
                for layer in range(num_layers - 1):
                    self.passes.forward(layer, key)
                loss = self.passes.loss_and_last_backward(key)
                for layer in reversed(range(num_layers - 1)):
                    self.passes.backward(layer, key)
                self.replicas.reduce()  # the replicas' gradients summed into the master's (HongTu's all-reduce)
                self.optimizer.step()
        except BaseException:
            self._clear_gradients()
            raise
        finally:
            self.passes.release_norms()
        return self._epoch_stats(loss)

    def _reset_counters(self) -> None:
        self.passes.norm_passes = self.passes.norm_reduced_bytes = 0
        for w in self.workers:
            w.io.reset_counters()
            w.rows.clear()
        self.sweep.pass_widths.clear()

    def _counting(self) -> contextlib.AbstractContextManager[Any]:
        """The epoch's device-byte count: each accelerator's allocation peak; on the CPU each worker's counter, or
        the engine's around the epoch."""
        for w in self.workers:
            w.io.reset_device_peak()
            if w.counter is not None:
                w.counter.baseline = replica_baseline(w.model, w.index)
                w.counter.reset_peak()
        self._counting_now = self.counter is not None and (self.config.memory_budget is not None
                                                           or self._epochs_counted == 0)
        if self.counter is None or not self._counting_now:
            return contextlib.nullcontext()
        self._epochs_counted += 1
        self.counter.baseline = self._resident
        self.counter.reset_peak()
        return self.counter

    def _clear_gradients(self) -> None:
        """After a failed epoch: host gradient buffers hold part of a pass; zero them (once every queued
        accumulation has landed) so the next epoch starts clean, as it would after a completed one."""
        for w in self.workers:
            w.io.barrier(raise_errors=False)
        self.host.zero_grads()
        self.optimizer.zero_grad(set_to_none=True)

    def _epoch_stats(self, loss: float) -> dict[str, float]:
        h2d = {kind: sum(w.io.moved.get(kind, 0) for w in self.workers) for kind in H2D_KINDS}
        stats: dict[str, float] = {"loss": loss, "h2d_bytes": sum(h2d.values()),
                                   **{f"h2d_{kind}_bytes": v for kind, v in h2d.items()},
                                   "d2h_bytes": sum(w.io.moved.get("d2h", 0) for w in self.workers),
                                   "chunks": self.num_chunks, "partitions": self.partitions,
                                   "devices": len(self.workers), **self._row_counters()}
        if self.model.norm == "batch":  # BatchNorm's statistics and gradient-sums passes over the chunks
            stats["norm_passes"] = self.passes.norm_passes
            stats["norm_reduced_bytes"] = self.passes.norm_reduced_bytes
        stats.update(self._tier_counters())
        stats["estimated_peak_device_bytes"] = self.plan.estimate  # the planner's, per device: beside the count
        if self.counter is not None and self._counting_now:  # else the record keeps the process's peak
            stats["peak_device_bytes"] = self.counter.peak
        peaks = [w.counter.peak for w in self.workers if w.counter is not None]
        peaks += [p for p in (w.io.device_peak() for w in self.workers) if p is not None]
        if peaks:
            stats["device_peak_bytes"] = peaks  # type: ignore[assignment]
            stats["peak_device_bytes"] = max(peaks)
        return stats

    def _tier_counters(self) -> dict[str, Any]:
        """The disk tier's and the spill's counters (``--host-memory`` only)."""
        if self.config.host_memory is None:
            return {}
        out: dict[str, Any] = {}
        if self.disk:
            out["disk_read_bytes"] = (self.features.read_stats() - self._read_before).bytes["disk"]
        if self.spill is not None:
            out["spill_bytes"] = self.spill.spill_bytes
        out["host_rows_ram_bytes"] = sum(t.numel() * t.element_size() for t in self.host.buffers()) - (
            0 if self.spill is None else self.spill.spill_bytes)
        out["anon_rss_bytes"] = anon_rss_bytes()
        return out

    def close(self) -> None:
        """Close the features' files and the spill files' descriptors (the buffers stay readable while alive)."""
        if self.tier is not None:
            self.tier.close()
        if self.spill is not None:
            self.spill.close()

    def _row_counters(self) -> dict[str, int]:
        """The epoch's row counters, summed over its layer passes (see :mod:`gnnscale.partition.dedup`)."""
        vol, widths = self.plan.volume, self.sweep.pass_widths
        out = {"layer_passes": len(widths),
               "rows_ori": vol.ori * len(widths), "rows_ori_bytes": vol.ori * 4 * sum(widths),
               "rows_p2p": vol.p2p * len(widths), "rows_p2p_bytes": vol.p2p * 4 * sum(widths)}
        for name in ("rows_h2d", "rows_reused", "rows_d2d"):
            for key in (name, name + "_bytes"):
                out[key] = sum(w.rows.get(key, 0) for w in self.workers)
        return out

    # ------------------------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        return self.accuracies(self._infer(), self.y, self.masks)

    def predict(self) -> Tensor:
        pred = self._infer().cpu()
        out = torch.empty_like(pred)
        out[self.plan.partition.perm] = pred  # new id i is vertex perm[i]
        return out

    def _infer(self) -> Tensor:
        """``[N]`` predicted classes in the engine's vertex order, chunk by chunk as in training."""
        self.model.eval()
        self.replicas.sync()
        for layer in range(len(self.model.layers) - 1):
            self.passes.forward(layer, None)
        self.passes.predict_last(self._pred)  # pinned on CUDA: predictions stream back without a sync per chunk
        return self._pred

    def describe(self) -> str:
        text = describe(self.plan)
        return text if self.host_plan is None else f"{text}; {self.host_plan.describe()}"


def chunk_file_bytes(model: Stack, plan: OffloadPlan, num_nodes: int, num_edges: int) -> int:
    """Bytes of every chunk's block, source-row ids, training positions and labels (with a self-loop per vertex,
    an upper bound): what the chunks keep in files under ``--host-memory`` on a CPU when the budget cannot hold
    them."""
    rows = sum(r.numel() for r in plan.rows)
    sizes = torch.tensor([[num_nodes, rows, num_edges + num_nodes]])
    return int(topology_bytes(model, sizes, num_nodes)[0]) + 8 * rows + 16 * num_nodes  # + training ids, labels


def spill_window(model: Stack, plan: OffloadPlan, num_nodes: int) -> int:
    """Bytes of the spill files' pages one chunk may touch before they are released (:meth:`Spill.release`): a
    page (4 KiB) for each of the largest chunk's source rows in the buffer it gathers from or adds gradients into,
    at most that buffer, and its destination rows of three row-sliced buffers (output, aggregation, gradient)."""
    widths = [layer.out_features for layer in model.block_layers]  # the host buffers' (not the features')
    row = 4 * max(widths)
    rows = max((r.numel() for r in plan.rows), default=0)
    p = plan.partition
    dst = max((hi - lo for lo, hi in (p.chunk_range(k) for k in range(p.num_chunks))), default=0)
    return min(num_nodes * row, rows * 4096) + 3 * dst * row


def _spill_what(plan: HostPlan, files: int) -> str:
    """The note's account of what goes to files."""
    parts = [f"the chunks' topology ({format_bytes(files)})"] if files else []
    if plan.spills:
        parts.append(f"{format_bytes(plan.spill_bytes)} of the {format_bytes(plan.activation_bytes)} of host "
                     "activations")
    return " and ".join(parts) + " are"


def worker_devices(config: TrainConfig, device: rt.Device) -> list[rt.Device]:
    """The devices partitions run on: ``config.devices``, else the training device."""
    return [rt.resolve_device(d) for d in config.devices] if config.devices else [device]


def _pinned(t: Tensor, device: rt.Device) -> Tensor:
    """``t`` copied into page-locked host memory for ``device``."""
    return rt.pinned_empty(t.shape, dtype=t.dtype, device=device).copy_(t)


def _unchanged(t: Tensor) -> Tensor:
    return t
