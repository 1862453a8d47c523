"""HongTu's offload engine: full-graph training with every vertex's data in host memory (HongTu Algorithms 1-4).

The graph is cut into ``partitions x chunks`` destination chunks (:mod:`gnnscale.partition`); partition ``i`` runs
on worker ``i mod len(devices)`` (one thread, stream set and model replica per device), and a *batch* -- the chunks
at one position of every partition, in the planner's (possibly reorganised, Algorithm 4) schedule -- runs
concurrently. Per epoch:

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
memory per chunk (``none``), or assembled from per-device *transition buffers* (:class:`_Exchange`) into which each
batch's rows are loaded once, by the partition that owns them (``full``, Algorithm 2) or per partition
(``reuse``), rows kept from the previous batch staying in their slots. Source-row gradients go the opposite way
into the same slots and reach host memory once each time a row leaves the device (Algorithm 3).

Dropout masks are keyed by (seed, epoch, layer, *original* vertex id), so forward, recomputation and the in-memory
engine draw the same masks. The result is the in-memory engine's, up to floating-point summation order.

On CUDA the host buffers are pinned, the next chunk's rows and topology are loaded on a side stream while the
current chunk computes, and gradient accumulation into host memory runs on a worker thread; on CPU the same code
runs synchronously and ``peak_device_bytes`` is measured by :class:`~gnnscale.plan.memory.LiveBytesCounter`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.engines.base import Engine
from gnnscale.engines.replicas import Replicas
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block, cut_block, normalized_csr
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.decoupled import DECOUPLED_MODELS
from gnnscale.nn.model import GNN
from gnnscale.partition import permute_csr
from gnnscale.partition.dedup import ExchangePlan
from gnnscale.plan.memory import LiveBytesCounter, replica_baseline
from gnnscale.plan.offload import OffloadPlan, describe, plan_offload
from gnnscale.store import default_gather_method, gather_rows, scatter_add_rows, triton_available

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

T = TypeVar("T")

H2D_KINDS = ("row", "topology", "index")


@dataclass(eq=False)
class Chunk:
    """One destination chunk: new ids ``[lo, hi)``, its source rows and its block (host side)."""

    k: int
    """Chunk id (position in the partition plan)."""
    lo: int
    hi: int
    rows: Tensor
    """``[R]`` int64 new ids of the source rows: ``lo..hi-1`` first, then the sorted outside in-neighbours."""
    block: Block
    """Local CSR (int32 row pointers and source rows while the chunk has fewer than 2^31 edges), globally
    normalised weights, and its transpose when a layer's backward needs one; ``src_ids`` are the *original*
    vertex ids (the dropout keys, int32 below 2^31 vertices). Built once, pinned on CUDA, reused every pass."""
    train_local: Tensor
    """``[t]`` int64 positions in ``[0, V)`` of the chunk's training vertices."""
    y_train: Tensor
    """``[t]`` their labels."""

    @property
    def num_dst(self) -> int:
        return self.hi - self.lo


class _Mover:
    """Host <-> device traffic of the engine, with byte counters; asynchronous on CUDA, synchronous on CPU."""

    def __init__(self, device: torch.device, gather: str, host_lock: threading.Lock | None = None):
        self.device, self.gather, self.host_lock = device, gather, host_lock
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnnscale-accumulate") if self.cuda else None
        self.pending: list[Future[None]] = []
        self.h2d: dict[str, int] = dict.fromkeys(H2D_KINDS, 0)
        """Host->device bytes by kind: vertex rows (features, activations, gradients, labels), chunk topology,
        and index tensors (row ids, buffer slots, positions)."""
        self.d2h = 0
        self.resident: dict[int, Block] | None = None
        """Chunk blocks kept on the device after their first use (``None``: topology is resent every pass)."""

    def reset_counters(self) -> None:
        self.h2d = dict.fromkeys(H2D_KINDS, 0)
        self.d2h = 0

    # -------------------------------------------------------------------------------------------- host -> device
    def rows(self, host: Tensor, rows: Tensor, rows_dev: Tensor | None) -> Tensor:
        """``host[rows]`` on the device: ``[R, F]`` (``rows_dev``: the same ids on the device, for the UVA gather)."""
        R, F_ = rows.numel(), host.shape[1]
        self.h2d["row"] += R * F_ * host.element_size()
        if not self.cuda:
            return host.index_select(0, rows)  # a new tensor, like the device copy it stands for
        out = torch.empty(R, F_, dtype=host.dtype, device=self.device)
        if self.gather == "uva":
            assert rows_dev is not None
            return gather_rows(host, rows_dev, out, method="uva")
        staging = torch.empty(R, F_, dtype=host.dtype, pin_memory=True)  # caching host allocator: event-guarded
        return gather_rows(host, rows, out, method="index_select", staging=staging)

    def index(self, t: Tensor, device: torch.device | None = None, kind: str = "index") -> Tensor:
        """A small host tensor (pinned on CUDA) on ``device`` (default: this mover's), counted as host->device
        bytes of ``kind``. On CPU it is used in place (counted all the same, so tests see the traffic)."""
        device = device or self.device
        self.h2d[kind] += t.numel() * t.element_size()
        if device.type == "cpu":
            return t
        return t.to(device, non_blocking=True)

    def slice(self, host: Tensor, lo: int, hi: int) -> Tensor:
        """``host[lo:hi]`` on the device (a contiguous bulk copy)."""
        part = host[lo:hi]
        self.h2d["row"] += part.numel() * part.element_size()
        return part.to(self.device, non_blocking=True) if self.cuda else part.clone()

    def block(self, chunk: Chunk, transpose: bool) -> tuple[Block, Tensor | None]:
        """The chunk's block on the device (its transpose too when ``transpose``), and its row ids there when the
        UVA gather needs them. Resident blocks are moved once, whole, and reused."""
        rows_dev = self.index(chunk.rows) if self.cuda and self.gather == "uva" else None
        if self.resident is not None:
            b = self.resident.get(chunk.k)
            if b is None:
                b = self.resident[chunk.k] = self._move_block(chunk.block, True)
            return b, rows_dev
        return self._move_block(chunk.block, transpose), rows_dev

    def _move_block(self, b: Block, transpose: bool) -> Block:
        self.h2d["topology"] += b.nbytes(transpose)
        if not self.cuda:  # copies, as on a GPU: measured as device bytes, and they die with the chunk
            return b.map(torch.clone, transpose)
        return b.to(self.device, non_blocking=True, transpose=transpose)

    def prefetched(self, load: Callable[[int], T], count: int) -> Iterator[tuple[int, T]]:
        """Yield ``(k, load(k))`` for ``k < count``, issuing ``load(k + 1)`` before chunk ``k`` is computed.

        On CUDA loads run on the side stream and the compute stream waits on an event; the caching allocator is
        told the tensors are used there (``record_stream``). On CPU this is a plain loop that holds two loads.
        """

        def issue(k: int) -> tuple[T, Any]:
            if not self.cuda:
                return load(k), None
            assert self.stream is not None
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                item = load(k)
                event = torch.cuda.Event()
                event.record(self.stream)
            return item, event

        nxt = issue(0) if count else None
        for k in range(count):
            assert nxt is not None
            item, event = nxt
            nxt = issue(k + 1) if k + 1 < count else None
            if event is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(event)
                _record_stream(item, stream)
            yield k, item

    # -------------------------------------------------------------------------------------------- device -> host
    def store(self, host: Tensor, lo: int, value: Tensor) -> None:
        """``host[lo:lo+len(value)] = value`` (asynchronous into pinned memory on CUDA)."""
        self.d2h += value.numel() * value.element_size()
        host[lo : lo + value.shape[0]].copy_(value.detach(), non_blocking=self.cuda)

    def accumulate(self, host: Tensor, rows: Tensor, value: Tensor) -> None:
        """``host[rows] += value``; on CUDA the copy is asynchronous and the addition runs on a worker thread, in
        submission order (chunks' source rows overlap)."""
        self.d2h += value.numel() * value.element_size()
        if not self.cuda:
            self._add(host, rows, value)
            return
        assert self.pool is not None
        staging = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        staging.copy_(value, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))

        def add() -> None:
            event.synchronize()
            self._add(host, rows, staging)

        self.pending.append(self.pool.submit(add))

    def _add(self, host: Tensor, rows: Tensor, value: Tensor) -> None:
        if self.host_lock is None:
            scatter_add_rows(host, rows, value)
            return
        with self.host_lock:  # several workers' rows may overlap
            scatter_add_rows(host, rows, value)

    def barrier(self, raise_errors: bool = True) -> None:
        """Wait until every copy and accumulation into host memory has landed (between layers; after a failed
        pass, with ``raise_errors=False``, so that none lands later)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        errors = [e for e in (f.exception() for f in self.pending) if e is not None]
        self.pending.clear()
        if errors and raise_errors:
            raise errors[0]


def _record_stream(item: Any, stream: Any) -> None:
    if isinstance(item, Tensor):
        item.record_stream(stream)
    elif isinstance(item, Block):
        item.record_stream(stream)
    elif isinstance(item, tuple | list):
        for x in item:
            _record_stream(x, stream)


@dataclass(eq=False)
class _Worker:
    """One device's share of an epoch: its partitions, a model replica and its own mover (streams, counters)."""

    index: int
    device: torch.device
    model: GNN
    io: _Mover
    partitions: list[int]
    rows: dict[str, int] = field(default_factory=dict)
    """Row counters of this epoch (``rows_h2d``, ``rows_reused``, ``rows_d2d`` and their ``_bytes``)."""
    counter: LiveBytesCounter | None = None
    """This worker's device bytes (several CPU devices: each worker thread runs its share under its own)."""

    def count(self, name: str, rows: int, width: int) -> None:
        self.rows[name] = self.rows.get(name, 0) + rows
        self.rows[name + "_bytes"] = self.rows.get(name + "_bytes", 0) + rows * width * 4


_Assembly = list[tuple[int, Tensor | None, Tensor]]
"""Per source worker: positions in the chunk's rows (``None``: all, in order) and slots in its buffer, on device."""


class _Exchange:
    """The transition buffers of one pass over every worker (HongTu Algorithms 2-3 and §6).

    ``buf[w]`` holds worker ``w``'s share of the current batch's rows (forward), ``gbuf[w]`` their accumulated
    gradients (backward). With several workers, batches start and end at a barrier: a worker's newcomers are
    written, and its leaving gradients flushed, only when no other worker reads or adds to its buffer.
    """

    def __init__(self, plan: ExchangePlan, workers: list[_Worker]):
        self.plan, self.workers = plan, workers
        self.barrier = threading.Barrier(len(workers)) if len(workers) > 1 else None
        self.locks = [threading.Lock() for _ in workers]
        self.buf: list[Tensor | None] = [None] * len(workers)
        self.gbuf: list[Tensor | None] = [None] * len(workers)
        self.src: Tensor | None = None
        self.grad: Tensor | None = None

    def begin_pass(self, src: Tensor | None, grad: Tensor | None) -> None:
        """Allocate buffers for gathering rows of host ``src`` and/or accumulating gradients into host ``grad``."""
        self.src, self.grad = src, grad
        for w in self.workers:
            cap = self.plan.capacity[w.index]
            self.buf[w.index] = None if src is None else torch.empty(cap, src.shape[1], device=w.device)
            self.gbuf[w.index] = None if grad is None else torch.zeros(cap, grad.shape[1], device=w.device)

    def end_pass(self) -> None:
        self.buf = [None] * len(self.workers)
        self.gbuf = [None] * len(self.workers)
        self.src = self.grad = None

    def stage(self, w: _Worker, j: int) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """Batch ``j``'s newcomer rows of worker ``w`` loaded to its device (prefetched), their slots, and the slots
        whose gradients leave after the batch."""
        mv = self.plan.moves[w.index][j]
        staged = slots = leave = None
        if self.src is not None:
            rows_dev = w.io.index(mv.new_rows) if w.io.cuda and w.io.gather == "uva" else None
            staged, slots = w.io.rows(self.src, mv.new_rows, rows_dev), w.io.index(mv.new_slots)
        if self.grad is not None:
            leave = w.io.index(mv.leave_slots)
        return staged, slots, leave

    def assembly(self, w: _Worker, k: int) -> _Assembly:
        """Chunk ``k``'s assembly map, positions on ``w``'s device and slots on each source worker's."""
        return [(d, None if pos is None else w.io.index(pos), w.io.index(slots, self.workers[d].device))
                for d, pos, slots in self.plan.assembly[k].parts]

    def begin_batch(self, w: _Worker, j: int, staged: tuple[Tensor | None, Tensor | None, Tensor | None]) -> None:
        """Write the newcomers into their slots; rows kept from the previous batch stay where they are."""
        rows, slots, _ = staged
        buf = self.buf[w.index]
        if buf is not None and rows is not None and slots is not None:
            buf.index_copy_(0, slots, rows)
            mv = self.plan.moves[w.index][j]
            w.count("rows_h2d", mv.new_rows.numel(), buf.shape[1])
            w.count("rows_reused", mv.kept, buf.shape[1])
        if self.barrier is not None:
            self.barrier.wait()

    def assemble(self, w: _Worker, k: int, asm: _Assembly, num_rows: int) -> Tensor:
        """Chunk ``k``'s rows gathered from the buffers (pulled from other workers' devices, Algorithm 2)."""
        remote = self.plan.assembly[k].remote_rows
        parts = [(d, pos, self.buf[d].index_select(0, slots)) for d, pos, slots in asm]  # type: ignore[union-attr]
        width = parts[0][2].shape[1]
        w.count("rows_d2d", remote, width)
        if len(parts) == 1 and parts[0][1] is None:
            return parts[0][2].to(w.device, non_blocking=True)
        out = torch.empty(num_rows, width, device=w.device)
        for _, pos, rows in parts:
            assert pos is not None
            out.index_copy_(0, pos, rows.to(w.device, non_blocking=True))
        return out

    def push(self, w: _Worker, asm: _Assembly, grad: Tensor) -> None:
        """Add a chunk's source-row gradients into the owners' gradient buffers (Algorithm 3, lines 1-3)."""
        for d, pos, slots in asm:
            g = grad if pos is None else grad.index_select(0, pos)
            gbuf = self.gbuf[d]
            assert gbuf is not None
            with self.locks[d]:
                gbuf.index_add_(0, slots, g.to(gbuf.device, non_blocking=True))

    def end_batch(self, w: _Worker, j: int, staged: tuple[Tensor | None, Tensor | None, Tensor | None]) -> None:
        """Flush the gradients of rows whose slots the next batch replaces to host memory (Algorithm 3, lines
        5-7), compacted on the device; the kept rows' gradients stay."""
        if self.barrier is not None:
            self.barrier.wait()
        gbuf, leave = self.gbuf[w.index], staged[2]
        if gbuf is None or leave is None or leave.numel() == 0:
            return
        assert self.grad is not None
        w.io.accumulate(self.grad, self.plan.moves[w.index][j].leave_rows, gbuf.index_select(0, leave))
        gbuf.index_fill_(0, leave, 0.0)


class OffloadEngine(Engine):
    """Full-graph training with vertex data in host memory, batch by batch (HongTu Algorithms 1-4)."""

    name = "offload"

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device) -> list[str]:
        if config.model in DECOUPLED_MODELS:
            return [f"{config.model} is a decoupled model: train it with --engine inmemory or taskparallel"]
        reasons = []
        devices = worker_devices(config, device)
        if config.gather == "uva" and not (devices[0].type == "cuda" and triton_available()):
            reasons.append("--gather uva needs a CUDA device and Triton")
        try:
            plan_offload(graph, config, device)
        except ConfigError as exc:
            reasons.append(str(exc))
        return reasons

    def __init__(self, graph: Graph, model: GNN, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        self.plan: OffloadPlan = plan_offload(graph, config, device, model)
        self.timings = dict(self.plan.timings)
        part = self.plan.partition
        self.partitions, self.num_chunks = part.partitions, part.num_chunks
        devices = worker_devices(config, device)
        gather = default_gather_method(devices[0]) if config.gather == "auto" else config.gather
        host_lock = threading.Lock() if len(devices) > 1 else None
        self.replicas = Replicas(model, devices)
        self.workers = [
            _Worker(w, dev, self.replicas.models[w], _Mover(dev, gather, host_lock),
                    [i for i in range(self.partitions) if i % len(devices) == w])
            for w, dev in enumerate(devices)]
        self.pool = ThreadPoolExecutor(len(devices), thread_name_prefix="gnnscale-worker") if len(devices) > 1 else None
        sched = self.plan.schedule.tolist()
        n = part.chunks
        # each worker's chunk order: batch by batch, its partitions in turn
        self.sequence = {w.index: [(j, sched[i][j]) for j in range(n) for i in w.partitions] for w in self.workers}
        self.exchange = None if self.plan.exchange is None else _Exchange(self.plan.exchange, self.workers)
        pin = devices[0].type == "cuda"
        perm = part.perm

        def host(t: Tensor) -> Tensor:
            return t.pin_memory() if pin else t

        assert graph.x is not None and graph.y is not None
        self.x = host(graph.x.index_select(0, perm).float())  # [N, F0] features in the new order
        self.y = host(graph.y.index_select(0, perm))
        self.masks = {m: getattr(graph, m).index_select(0, perm) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.num_train = int(self.masks["train_mask"].sum())
        self.chunks = self._build_chunks(graph, host)
        if pin and self.plan.exchange is not None:
            _pin_exchange(self.plan.exchange)
        if self.plan.resident_topology:
            for w in self.workers:
                w.io.resident = {}
        self._pred = host(torch.empty(graph.num_nodes, dtype=torch.int64))
        N, L = graph.num_nodes, len(model.layers)
        widths = [layer.in_features for layer in model.block_layers]
        # h[l]: input of layer l (output of layer l-1 after activation and dropout); g[l]: dL/dh[l]
        self.h: dict[int, Tensor] = {l: host(torch.empty(N, widths[l])) for l in range(1, L)}
        self.g: dict[int, Tensor] = {l: host(torch.zeros(N, widths[l])) for l in range(1, L)}
        layers = model.block_layers
        # Projecting layers (GCN/SAGE wider in than out) project every vertex once into p[l] and move those
        # narrower rows; their propagation is then cached like a cacheable layer's aggregation.
        self.projected = {l for l in range(L) if layers[l].projects_first}
        self.cached = {l for l in range(L - 1) if layers[l].cacheable or l in self.projected}
        with torch.no_grad():
            agg_width = {l: layers[l].project(torch.zeros(1, widths[l])).shape[1] if l in self.projected
                         else widths[l] for l in range(L)}
        self.p: dict[int, Tensor] = {l: host(torch.empty(N, agg_width[l])) for l in self.projected}
        self.gp: dict[int, Tensor] = {l: host(torch.zeros(N, agg_width[l])) for l in self.projected}
        # a[l]: cached aggregation of layer l
        self.agg: dict[int, Tensor] = {l: host(torch.empty(N, agg_width[l])) for l in self.cached}
        cpu = devices[0].type == "cpu"
        self.counter = LiveBytesCounter() if cpu and len(devices) == 1 else None
        if cpu and len(devices) > 1:
            for w in self.workers:
                w.counter = LiveBytesCounter()
        self._resident = sum(p.numel() * p.element_size() for p in model.parameters())
        self._passes: list[int] = []  # widths of this epoch's layer passes

    def _build_chunks(self, graph: Graph, host: Callable[[Tensor], Tensor]) -> list[Chunk]:
        """Every chunk's block, cut once from the normalised adjacency in the new order: int32 where it fits, the
        transpose built here when a layer's backward needs it, pinned on CUDA."""
        part = self.plan.partition
        indptr, indices, weight = normalized_csr(graph, self.model.adjacency)
        indptr, indices, weight = permute_csr(indptr, indices, weight, part.perm, part.inverse())
        transpose = any(layer.sparse_backward for layer in self.model.block_layers)
        ids_dtype = torch.int32 if graph.num_nodes < 2**31 else torch.int64
        rows = self.plan.rows
        pos = torch.empty(graph.num_nodes, dtype=torch.int32 if graph.num_nodes < 2**31 else torch.int64)
        train = self.masks["train_mask"]
        chunks = []
        for k in range(part.num_chunks):
            lo, hi = part.chunk_range(k)
            r = rows[k]
            # original ids: the dropout keys
            block = cut_block(indptr, indices, weight, lo, hi, r, pos, part.perm.index_select(0, r).to(ids_dtype))
            if transpose:
                block.with_transpose()
            train_local = torch.nonzero(train[lo:hi]).view(-1)
            chunks.append(Chunk(k, lo, hi, host(r), block.map(host), host(train_local),
                                host(self.y[lo:hi].index_select(0, train_local))))
        return chunks

    # ------------------------------------------------------------------------------------------------ workers
    def _run(self, fn: Callable[[_Worker], T]) -> list[T]:
        """``fn`` on every worker: inline for one, one thread each otherwise (a failure stops the others)."""
        if self.pool is None:
            return [fn(self.workers[0])]
        barrier = None if self.exchange is None else self.exchange.barrier

        def guarded(w: _Worker) -> T:
            try:
                if w.counter is not None:
                    with w.counter:  # dispatch modes are per thread: this worker's allocations only
                        return fn(w)
                return fn(w)
            except BaseException:
                if barrier is not None:
                    barrier.abort()
                raise

        futures = [self.pool.submit(guarded, w) for w in self.workers]
        errors = [f.exception() for f in futures]
        if barrier is not None and barrier.broken:
            barrier.reset()
        real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
        if real or any(errors):
            raise (real or [e for e in errors if e is not None])[0]
        return [f.result() for f in futures]

    def _sync_replicas(self) -> None:
        """Replicas take the master's parameters (after each optimiser step)."""
        self.replicas.sync()

    def _reduce_gradients(self) -> None:
        """Sum the replicas' parameter gradients into the master's (HongTu's all-reduce before the update)."""
        self.replicas.reduce()

    def _sweep(self, w: _Worker, load: Callable[[Chunk], T], body: Callable[[_Worker, Chunk, _Rows, T], None],
               *, src: Tensor | None = None, grad: Tensor | None = None, blocks: bool = True,
               transpose: bool = False) -> None:
        """Worker ``w``'s chunks in schedule order, batch by batch: ``load`` is prefetched, ``body`` computes.

        ``src`` is the host tensor whose rows the chunks read (a layer pass), ``grad`` the host gradient their
        source rows add into; the body reaches both through its :class:`_Rows`, deduplicated by the exchange
        when there is one. ``blocks=False``: the body reads destination rows only and needs no topology;
        ``transpose``: it backpropagates through the adjacency and needs the block's transpose.
        """
        ex = self.exchange if src is not None or grad is not None else None
        seq = self.sequence[w.index]

        def item(t: int) -> tuple[Any, Any, Block | None, Tensor | None, T]:
            j, k = seq[t]
            c = self.chunks[k]
            staged = ex.stage(w, j) if ex is not None and (t == 0 or seq[t - 1][0] != j) else None
            asm = ex.assembly(w, k) if ex is not None else None
            block = x_src = None
            if blocks:
                block, rows_dev = w.io.block(c, transpose)
                if src is not None and ex is None:
                    x_src = w.io.rows(src, c.rows, rows_dev)
                    w.count("rows_h2d", c.rows.numel(), src.shape[1])
            return staged, asm, block, x_src, load(c)

        current = None
        for t, (staged, asm, block, x_src, loaded) in w.io.prefetched(item, len(seq)):
            j, k = seq[t]
            c = self.chunks[k]
            if ex is not None and staged is not None:
                current = staged
                ex.begin_batch(w, j, staged)
            body(w, c, _Rows(self, w, k, c, block, x_src, asm, grad), loaded)
            if ex is not None and (t + 1 == len(seq) or seq[t + 1][0] != j):
                assert current is not None
                ex.end_batch(w, j, current)
        w.io.barrier()

    def _pass(self, fn: Callable[[_Worker], Any], *, src: Tensor | None = None,
              grad: Tensor | None = None) -> list[Any]:
        """One sweep on every worker, with the exchange's buffers for ``src``/``grad`` set up around it."""
        if src is not None:
            self._passes.append(src.shape[1])
        if self.exchange is not None and (src is not None or grad is not None):
            self.exchange.begin_pass(src, grad)
            try:
                return self._run(fn)
            finally:
                self.exchange.end_pass()
        return self._run(fn)

    # ------------------------------------------------------------------------------------------------ training
    def _counting(self) -> contextlib.AbstractContextManager[Any]:
        for w in self.workers:
            if w.counter is not None:
                w.counter.baseline = replica_baseline(w.model, w.index)
                w.counter.reset_peak()
        if self.counter is None:
            return contextlib.nullcontext()
        self.counter.baseline = self._resident
        self.counter.reset_peak()
        return self.counter

    def _input(self, l: int) -> Tensor:
        return self.x if l == 0 else self.h[l]

    def _prepare(self, w: _Worker, l: int, rows: Tensor, ids: Tensor, se: tuple[int, int] | None) -> Tensor:
        """Layer ``l``'s input from gathered rows: host ``h[l]`` already holds it (activation and dropout were applied
        once per vertex when it was written), the features still need layer 0's dropout."""
        return w.model.layer_input(0, rows, ids, se) if l == 0 else rows

    def _source(self, l: int) -> tuple[Tensor, Tensor | None]:
        """What layer ``l`` gathers per chunk (its input, or its projected rows) and the destination rows its
        UPDATE reads besides (projecting layers only)."""
        if l not in self.projected:
            return self._input(l), None
        return self.p[l], (self._input(l) if self.model.block_layers[l].update_uses_dst else None)

    def _dst(self, w: _Worker, c: Chunk, t: Tensor | None) -> Tensor | None:
        return None if t is None else w.io.slice(t, c.lo, c.hi)

    def _ids(self, w: _Worker, c: Chunk) -> Tensor:
        """The chunk's destinations' original ids (dropout keys) on ``w``'s device, for passes without a block."""
        assert c.block.src_ids is not None
        return w.io.index(c.block.src_ids[: c.num_dst])

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync_replicas()
        for w in self.workers:
            w.io.reset_counters()
            w.rows.clear()
        self._passes.clear()
        se = (self.config.seed, epoch)
        L = len(self.model.layers)
        try:
            with self._counting():
                for l in range(L - 1):
                    self._forward_layer(l, se)
                loss = self._last_layer_loss_backward(se)
                for l in range(L - 2, -1, -1):
                    self._backward_layer(l, se)
                self._reduce_gradients()
                self.optimizer.step()
        except BaseException:
            self._clear_gradients()
            raise
        h2d = {kind: sum(w.io.h2d[kind] for w in self.workers) for kind in H2D_KINDS}
        stats: dict[str, float] = {"loss": loss, "h2d_bytes": sum(h2d.values()),
                                   **{f"h2d_{kind}_bytes": v for kind, v in h2d.items()},
                                   "d2h_bytes": sum(w.io.d2h for w in self.workers),
                                   "chunks": self.num_chunks, "partitions": self.partitions,
                                   "devices": len(self.workers), **self._row_counters()}
        if self.counter is not None:
            stats["peak_device_bytes"] = self.counter.peak
        peaks = [w.counter.peak for w in self.workers if w.counter is not None]
        if peaks:
            stats["device_peak_bytes"] = peaks  # type: ignore[assignment]
            stats["peak_device_bytes"] = max(peaks)
        return stats

    def _clear_gradients(self) -> None:
        """After a failed epoch: host gradient buffers hold part of a pass; zero them (once every queued
        accumulation has landed) so the next epoch starts clean, as it would after a completed one."""
        for w in self.workers:
            w.io.barrier(raise_errors=False)
        for t in (*self.g.values(), *self.gp.values()):
            t.zero_()
        self.optimizer.zero_grad(set_to_none=True)

    def _row_counters(self) -> dict[str, int]:
        """The epoch's row counters, summed over its layer passes (see :mod:`gnnscale.partition.dedup`)."""
        vol, widths = self.plan.volume, self._passes
        out = {"layer_passes": len(widths),
               "rows_ori": vol.ori * len(widths), "rows_ori_bytes": vol.ori * 4 * sum(widths),
               "rows_p2p": vol.p2p * len(widths), "rows_p2p_bytes": vol.p2p * 4 * sum(widths)}
        for name in ("rows_h2d", "rows_reused", "rows_d2d"):
            for key in (name, name + "_bytes"):
                out[key] = sum(w.rows.get(key, 0) for w in self.workers)
        return out

    @torch.no_grad()
    def _project(self, l: int, se: tuple[int, int] | None) -> None:
        """``p[l] = project(input of layer l)``, once per vertex, chunk by chunk (destination rows only)."""

        def body(w: _Worker, c: Chunk, rows: _Rows, x_dst: Tensor | None) -> None:
            assert x_dst is not None
            layer = w.model.block_layers[l]
            w.io.store(self.p[l], c.lo, layer.project(self._prepare(w, l, x_dst, self._ids(w, c), se)))

        self._pass(lambda w: self._sweep(w, lambda c: self._dst(w, c, self._input(l)), body, blocks=False))

    def _project_backward(self, l: int, se: tuple[int, int]) -> None:
        """Backpropagate the accumulated ``dL/dp[l]`` through the projection, chunk by chunk."""

        def body(w: _Worker, c: Chunk, rows: _Rows, loaded: tuple[Tensor | None, Tensor | None]) -> None:
            x_dst, grad_p = loaded
            assert x_dst is not None and grad_p is not None
            x = self._prepare(w, l, x_dst, self._ids(w, c), se).detach().requires_grad_(l > 0)
            w.model.block_layers[l].project(x).backward(grad_p)
            if l > 0:
                assert x.grad is not None
                w.io.accumulate(self.g[l], c.rows[: c.num_dst], x.grad)

        self._pass(lambda w: self._sweep(
            w, lambda c: (self._dst(w, c, self._input(l)), self._dst(w, c, self.gp[l])), body, blocks=False))
        self.gp[l].zero_()

    def _apply(self, w: _Worker, l: int, c: Chunk, block: Block, x_src: Tensor, x_dst: Tensor | None,
               se: tuple[int, int] | None, cache: bool) -> Tensor:
        """Layer ``l`` on chunk ``c`` from its gathered rows (projected rows for a projecting layer); with ``cache``
        the aggregation is copied to host memory for backward."""
        layer = w.model.block_layers[l]
        ids = block.row_ids()
        if l in self.projected:
            a = layer.propagate(block, x_src)
            xd = None if x_dst is None else self._prepare(w, l, x_dst, ids[: c.num_dst], se)
        else:
            x = self._prepare(w, l, x_src, ids, se)
            if not cache:
                return layer(block, x)
            a, xd = layer.aggregate(block, x), x[: c.num_dst]
        if cache:
            w.io.store(self.agg[l], c.lo, a)
        return layer.update(a, xd)  # type: ignore[arg-type]  # None when UPDATE ignores x_dst

    @torch.no_grad()
    def _forward_layer(self, l: int, se: tuple[int, int] | None) -> None:
        """Layer ``l`` over all chunks into ``h[l+1]``; caches the aggregation when training."""
        if l in self.projected:
            self._project(l, se)
        cache = se is not None and l in self.cached
        src, dst_src = self._source(l)

        def body(w: _Worker, c: Chunk, rows: _Rows, x_dst: Tensor | None) -> None:
            block = rows.block
            y = self._apply(w, l, c, block, rows.gather(), x_dst, se, cache)
            # store the next layer's input, activation and dropout applied once per vertex (not once per copy)
            w.io.store(self.h[l + 1], c.lo, w.model.layer_input(l + 1, y, block.row_ids(c.num_dst), se))

        self._pass(lambda w: self._sweep(w, lambda c: self._dst(w, c, dst_src), body, src=src), src=src)

    def _last_layer_loss_backward(self, se: tuple[int, int]) -> float:
        L = len(self.model.layers)
        l = L - 1
        projected = l in self.projected
        if projected:
            self._project(l, se)
        src, dst_src = self._source(l)
        grad = self.gp[l] if projected else (self.g[l] if l > 0 else None)

        def body(w: _Worker, c: Chunk, rows: _Rows, loaded: tuple[Tensor | None, Tensor]) -> None:
            x_dst, total = loaded
            layer, block = w.model.block_layers[l], rows.block
            ids = block.row_ids()
            xd = None
            if projected:  # gradients flow into the projected rows (then the projection) and the dst rows
                x = rows.gather().detach().requires_grad_(True)
                if x_dst is not None:
                    xd = self._prepare(w, l, x_dst, ids[: c.num_dst], se).detach().requires_grad_(l > 0)
                logits = layer.update(layer.propagate(block, x), xd)  # type: ignore[arg-type]
            else:
                x = self._prepare(w, l, rows.gather(), ids, se).detach().requires_grad_(l > 0)
                logits = layer(block, x)  # [V, C]
            idx, y = w.io.index(c.train_local), w.io.index(c.y_train, kind="row")
            loss = F.cross_entropy(logits.index_select(0, idx), y, reduction="sum") / self.num_train
            loss.backward()
            total += loss.detach()
            if grad is not None:
                assert x.grad is not None
                rows.push(x.grad)
            if xd is not None and xd.grad is not None:
                w.io.accumulate(self.g[l], c.rows[: c.num_dst], xd.grad)

        # backward through the propagation needs the blocks' transposes (rows that require a gradient)
        transpose = self.model.block_layers[l].sparse_backward and (projected or l > 0)

        def run(w: _Worker) -> Tensor:
            total = torch.zeros((), device=w.device)
            self._sweep(w, lambda c: (self._dst(w, c, dst_src), total), body, src=src, grad=grad,
                        transpose=transpose)
            return total

        loss = sum(float(t) for t in self._pass(run, src=src, grad=grad))
        if projected:
            self._project_backward(l, se)
        return loss

    def _backward_layer(self, l: int, se: tuple[int, int]) -> None:
        """Recompute layer ``l`` per chunk and backpropagate ``dL/dx^{l+1}`` into ``g[l]`` and the parameters."""
        layer0, next_in = self.model.block_layers[l], self.g[l + 1]
        cached, projected = l in self.cached, l in self.projected
        dst_src = self._input(l) if cached and layer0.update_uses_dst else None
        src = None if cached else self._input(l)
        grad = self.gp[l] if projected else (self.g[l] if l > 0 else None)

        def load(w: _Worker, c: Chunk) -> tuple[Tensor | None, Tensor | None, Tensor]:
            a = w.io.slice(self.agg[l], c.lo, c.hi) if cached else None
            return a, self._dst(w, c, dst_src), w.io.slice(next_in, c.lo, c.hi)

        vjp = cached and (l > 0 or projected)  # gradients flow through the cached propagation to source rows
        blocks = not cached or vjp  # a cached layer 0 needs no topology: only its destinations' ids
        transpose = layer0.sparse_backward and (vjp or (not cached and l > 0))

        def body(w: _Worker, c: Chunk, rows: _Rows, loaded: tuple[Tensor | None, Tensor | None, Tensor]) -> None:
            a, x_dst, grad_next = loaded
            layer = w.model.block_layers[l]
            dst_ids = rows.dst_ids()
            xd = x = None
            if cached:  # recompute only UPDATE from the cached aggregation
                assert a is not None
                a = a.detach().requires_grad_(vjp)
                if x_dst is not None:
                    xd = self._prepare(w, l, x_dst, dst_ids, se).detach().requires_grad_(l > 0)
                y = layer.update(a, xd)  # type: ignore[arg-type]  # None when UPDATE ignores x_dst
            else:  # recompute the whole layer (GAT)
                block = rows.block
                x = self._prepare(w, l, rows.gather(), block.row_ids(), se).detach().requires_grad_(l > 0)
                y = layer(block, x)
            w.model.layer_input(l + 1, y, dst_ids, se).backward(grad_next)
            if vjp and a is not None and a.grad is not None:  # through the propagation to the source rows
                rows.push(layer.aggregate_vjp(rows.block, a.grad))
            elif not cached and l > 0:
                assert x is not None and x.grad is not None
                rows.push(x.grad)
            if xd is not None and xd.grad is not None:
                w.io.accumulate(self.g[l], c.rows[: c.num_dst], xd.grad)

        def run(w: _Worker) -> None:
            self._sweep(w, lambda c: load(w, c), body, src=src, grad=grad, blocks=blocks, transpose=transpose)

        self._pass(run, src=src, grad=grad)
        next_in.zero_()  # consumed: ready for the next epoch's accumulation
        if projected:
            self._project_backward(l, se)

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
        self._sync_replicas()
        L = len(self.model.layers)
        for l in range(L - 1):
            self._forward_layer(l, None)
        if L - 1 in self.projected:
            self._project(L - 1, None)
        pred = self._pred  # pinned on CUDA: predictions stream back without a sync per chunk
        src, dst_src = self._source(L - 1)

        def body(w: _Worker, c: Chunk, rows: _Rows, x_dst: Tensor | None) -> None:
            out = self._apply(w, L - 1, c, rows.block, rows.gather(), x_dst, None, False)
            w.io.store(pred, c.lo, out.argmax(dim=-1))

        self._pass(lambda w: self._sweep(w, lambda c: self._dst(w, c, dst_src), body, src=src), src=src)
        return pred

    def describe(self) -> str:
        return describe(self.plan)


@dataclass(eq=False)
class _Rows:
    """A chunk's source rows inside a sweep: gathered from host memory, or assembled from transition buffers."""

    engine: OffloadEngine
    worker: _Worker
    k: int
    chunk: Chunk
    block_: Block | None
    x_src: Tensor | None
    asm: _Assembly | None
    grad: Tensor | None

    @property
    def block(self) -> Block:
        assert self.block_ is not None
        return self.block_

    def dst_ids(self) -> Tensor:
        """Original ids of the chunk's destinations on the device: from the block when the pass has one."""
        if self.block_ is not None:
            return self.block_.row_ids(self.chunk.num_dst)
        return self.engine._ids(self.worker, self.chunk)

    def gather(self) -> Tensor:
        """``[R, F]`` rows of the pass's source tensor, in the chunk's row order."""
        if self.x_src is not None:
            return self.x_src
        ex = self.engine.exchange
        assert ex is not None and self.asm is not None
        return ex.assemble(self.worker, self.k, self.asm, self.chunk.rows.numel())

    def push(self, grad: Tensor) -> None:
        """Add ``grad`` (``[R, F]``, the source rows' gradients) into the pass's host gradient, through the exchange
        when there is one."""
        ex = self.engine.exchange
        if ex is None:
            assert self.grad is not None
            self.worker.io.accumulate(self.grad, self.chunk.rows, grad)
            return
        assert self.asm is not None
        ex.push(self.worker, self.asm, grad)


def worker_devices(config: TrainConfig, device: torch.device) -> list[torch.device]:
    """The devices partitions run on: ``config.devices``, else the training device."""
    return [torch.device(d) for d in config.devices] if config.devices else [device]


def _pin_exchange(plan: ExchangePlan) -> None:
    """Pin the exchange plan's index tensors in place, so their per-batch copies to the device are asynchronous."""
    for moves in plan.moves:
        for mv in moves:
            mv.new_rows, mv.new_slots = mv.new_rows.pin_memory(), mv.new_slots.pin_memory()
            mv.leave_rows, mv.leave_slots = mv.leave_rows.pin_memory(), mv.leave_slots.pin_memory()
    for asm in plan.assembly.values():
        asm.parts = [(d, None if pos is None else pos.pin_memory(), slots.pin_memory()) for d, pos, slots in asm.parts]
