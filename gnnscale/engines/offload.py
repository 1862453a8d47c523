"""HongTu's offload engine: full-graph training with every vertex's data in host memory (HongTu §4, Algorithm 1).

Per epoch, on one device, with the graph cut into ``partitions x chunks`` destination chunks
(:mod:`gnnscale.partition`):

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
4. One optimiser step.

Dropout masks are keyed by (seed, epoch, layer, *original* vertex id), so forward, recomputation and the in-memory
engine draw the same masks. The result is the in-memory engine's, up to floating-point summation order.

On CUDA the host buffers are pinned, the next chunk's rows and topology are loaded on a side stream while the
current chunk computes, and gradient accumulation into host memory runs on a worker thread; on CPU the same code
runs synchronously and ``peak_device_bytes`` is measured by :class:`~gnnscale.plan.memory.LiveBytesCounter`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.engines.base import Engine
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block, normalized_csr
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.model import GNN
from gnnscale.partition import chunk_halo, permute_csr
from gnnscale.plan.memory import LiveBytesCounter
from gnnscale.plan.offload import OffloadPlan, describe, plan_offload
from gnnscale.store import default_gather_method, gather_rows, scatter_add_rows, triton_available

if TYPE_CHECKING:
    from gnnscale.train import TrainConfig

T = TypeVar("T")


@dataclass(eq=False)
class Chunk:
    """One destination chunk: new ids ``[lo, hi)``, its source rows and its block (host side)."""

    lo: int
    hi: int
    rows: Tensor
    """``[R]`` int64 new ids of the source rows: ``lo..hi-1`` first, then the sorted outside in-neighbours."""
    block: Block
    """Local CSR (int64 row pointers, int32 source rows), globally normalised weights; ``src_ids`` are the
    *original* vertex ids (the dropout keys)."""
    train_local: Tensor
    """``[t]`` int64 positions in ``[0, V)`` of the chunk's training vertices."""

    @property
    def num_dst(self) -> int:
        return self.hi - self.lo


class _Mover:
    """Host <-> device traffic of the engine, with byte counters; asynchronous on CUDA, synchronous on CPU."""

    def __init__(self, device: torch.device, gather: str):
        self.device, self.gather = device, gather
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnnscale-accumulate") if self.cuda else None
        self.pending: list[Future[None]] = []
        self.h2d = self.d2h = 0

    # -------------------------------------------------------------------------------------------- host -> device
    def rows(self, host: Tensor, chunk: Chunk, rows_dev: Tensor | None) -> Tensor:
        """``host[chunk.rows]`` on the device: ``[R, F]``."""
        R, F_ = chunk.rows.numel(), host.shape[1]
        self.h2d += R * F_ * host.element_size()
        if not self.cuda:
            return host.index_select(0, chunk.rows)  # a new tensor, like the device copy it stands for
        out = torch.empty(R, F_, dtype=host.dtype, device=self.device)
        if self.gather == "uva":
            assert rows_dev is not None
            return gather_rows(host, rows_dev, out, method="uva")
        staging = torch.empty(R, F_, dtype=host.dtype, pin_memory=True)  # caching host allocator: event-guarded
        return gather_rows(host, chunk.rows, out, method="index_select", staging=staging)

    def slice(self, host: Tensor, lo: int, hi: int) -> Tensor:
        """``host[lo:hi]`` on the device (a contiguous bulk copy)."""
        part = host[lo:hi]
        self.h2d += part.numel() * part.element_size()
        return part.to(self.device, non_blocking=True) if self.cuda else part.clone()

    def block(self, chunk: Chunk) -> tuple[Block, Tensor | None]:
        """The chunk's block on the device, and its row ids there when the UVA gather needs them."""
        b = chunk.block
        self.h2d += b.nbytes()
        if not self.cuda:  # copies, as on a GPU: measured as device bytes, and caches die with the chunk
            return Block(b.indptr.clone(), b.indices.clone(), b.num_src,
                         None if b.edge_weight is None else b.edge_weight.clone(),
                         None if b.src_ids is None else b.src_ids.clone()), None
        rows_dev = None
        if self.gather == "uva":
            rows_dev = chunk.rows.to(self.device, non_blocking=True)
            self.h2d += chunk.rows.numel() * 8
        return b.to(self.device, non_blocking=True), rows_dev

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
            scatter_add_rows(host, rows, value)
            return
        assert self.pool is not None
        staging = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        staging.copy_(value, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))

        def add() -> None:
            event.synchronize()
            scatter_add_rows(host, rows, staging)

        self.pending.append(self.pool.submit(add))

    def barrier(self) -> None:
        """Wait until every copy and accumulation into host memory has landed (between layers)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            for f in self.pending:
                f.result()
            self.pending.clear()


def _record_stream(item: Any, stream: Any) -> None:
    if isinstance(item, Tensor):
        item.record_stream(stream)
    elif isinstance(item, Block):
        for t in (item.indptr, item.indices, item.edge_weight, item.src_ids):
            if t is not None:
                t.record_stream(stream)
    elif isinstance(item, tuple | list):
        for x in item:
            _record_stream(x, stream)


class OffloadEngine(Engine):
    """Full-graph training with vertex data in host memory, chunk by chunk (HongTu Algorithm 1, one device)."""

    name = "offload"

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device) -> list[str]:
        reasons = []
        if config.gather == "uva" and not (device.type == "cuda" and triton_available()):
            reasons.append("--gather uva needs a CUDA device and Triton")
        try:
            plan_offload(graph, config, device)
        except ConfigError as exc:
            reasons.append(str(exc))
        return reasons

    def __init__(self, graph: Graph, model: GNN, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        self.plan: OffloadPlan = plan_offload(graph, config, device, model)
        part = self.plan.partition
        self.partitions, self.num_chunks = part.partitions, part.num_chunks
        gather = default_gather_method(device) if config.gather == "auto" else config.gather
        self.io = _Mover(device, gather)
        pin = device.type == "cuda"
        perm = part.perm

        def host(t: Tensor) -> Tensor:
            return t.pin_memory() if pin else t

        assert graph.x is not None and graph.y is not None
        self.x = host(graph.x.index_select(0, perm).float())  # [N, F0] features in the new order
        self.y = host(graph.y.index_select(0, perm))
        self.masks = {m: getattr(graph, m).index_select(0, perm) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.num_train = int(self.masks["train_mask"].sum())
        self.chunks = self._build_chunks(graph, host)
        n, L = graph.num_nodes, len(model.layers)
        widths = [layer.in_features for layer in model.block_layers]
        # h[l]: input of layer l (output of layer l-1 after activation and dropout); g[l]: dL/dh[l]
        self.h: dict[int, Tensor] = {l: host(torch.empty(n, widths[l])) for l in range(1, L)}
        self.g: dict[int, Tensor] = {l: host(torch.zeros(n, widths[l])) for l in range(1, L)}
        layers = model.block_layers
        # Projecting layers (GCN/SAGE wider in than out) project every vertex once into p[l] and move those
        # narrower rows; their propagation is then cached like a cacheable layer's aggregation.
        self.projected = {l for l in range(L) if layers[l].projects_first}
        self.cached = {l for l in range(L - 1) if layers[l].cacheable or l in self.projected}
        with torch.no_grad():
            agg_width = {l: layers[l].project(torch.zeros(1, widths[l])).shape[1] if l in self.projected
                         else widths[l] for l in range(L)}
        self.p: dict[int, Tensor] = {l: host(torch.empty(n, agg_width[l])) for l in self.projected}
        self.gp: dict[int, Tensor] = {l: host(torch.zeros(n, agg_width[l])) for l in self.projected}
        # a[l]: cached aggregation of layer l
        self.agg: dict[int, Tensor] = {l: host(torch.empty(n, agg_width[l])) for l in self.cached}
        self.counter = LiveBytesCounter() if device.type == "cpu" else None
        self._resident = sum(p.numel() * p.element_size() for p in model.parameters())

    def _build_chunks(self, graph: Graph, host: Callable[[Tensor], Tensor]) -> list[Chunk]:
        part = self.plan.partition
        indptr, indices, weight = normalized_csr(graph, self.model.adjacency)
        indptr, indices, weight = permute_csr(indptr, indices, weight, part.perm, part.inverse())
        n = graph.num_nodes
        mark = torch.zeros(n, dtype=torch.bool)
        pos = torch.empty(n, dtype=torch.int64)
        train = self.masks["train_mask"]
        chunks = []
        for k in range(part.num_chunks):
            lo, hi = part.chunk_range(k)
            halo = chunk_halo(indptr, indices, lo, hi, mark)
            V = hi - lo
            pos[lo:hi] = torch.arange(V)
            pos[halo] = torch.arange(V, V + halo.numel())
            e0, e1 = int(indptr[lo]), int(indptr[hi])
            rows = torch.cat([torch.arange(lo, hi), halo])
            block = Block(
                indptr=host(indptr[lo : hi + 1] - e0),
                indices=host(pos.index_select(0, indices[e0:e1]).to(torch.int32)),
                num_src=rows.numel(),
                edge_weight=None if weight is None else host(weight[e0:e1].contiguous()),
                src_ids=host(part.perm.index_select(0, rows)),  # original ids: the dropout keys
            )
            chunks.append(Chunk(lo, hi, rows, block, torch.nonzero(train[lo:hi]).view(-1)))
        return chunks

    # ------------------------------------------------------------------------------------------------ training
    def _counting(self) -> contextlib.AbstractContextManager[Any]:
        if self.counter is None:
            return contextlib.nullcontext()
        self.counter.baseline = self._resident
        self.counter.reset_peak()
        return self.counter

    def _loads(
        self, src: Tensor, dst_src: Tensor | None = None
    ) -> Callable[[int], tuple[Block, Tensor, Tensor | None]]:
        """Per-chunk load: the block, the chunk's source rows of ``src`` and, if given, its destination rows of
        ``dst_src``."""

        def load(k: int) -> tuple[Block, Tensor, Tensor | None]:
            chunk = self.chunks[k]
            block, rows_dev = self.io.block(chunk)
            x_dst = None if dst_src is None else self.io.slice(dst_src, chunk.lo, chunk.hi)
            return block, self.io.rows(src, chunk, rows_dev), x_dst

        return load

    def _dst_loads(self, *srcs: Tensor) -> Callable[[int], tuple[Tensor, ...]]:
        """Per-chunk load of the destination rows of each of ``srcs`` and the destinations' original ids."""

        def load(k: int) -> tuple[Tensor, ...]:
            c = self.chunks[k]
            assert c.block.src_ids is not None
            ids = c.block.src_ids[: c.num_dst]
            ids = ids.to(self.device, non_blocking=True) if self.io.cuda else ids
            return (ids, *(self.io.slice(t, c.lo, c.hi) for t in srcs))

        return load

    def _input(self, l: int) -> Tensor:
        return self.x if l == 0 else self.h[l]

    def _prepare(self, l: int, rows: Tensor, ids: Tensor, se: tuple[int, int] | None) -> Tensor:
        """Layer ``l``'s input from gathered rows: host ``h[l]`` already holds it (activation and dropout were applied
        once per vertex when it was written), the features still need layer 0's dropout."""
        return self.model.layer_input(0, rows, ids, se) if l == 0 else rows

    def _source(self, l: int) -> tuple[Tensor, Tensor | None]:
        """What layer ``l`` gathers per chunk (its input, or its projected rows) and the destination rows its
        UPDATE reads besides (projecting layers only)."""
        if l not in self.projected:
            return self._input(l), None
        return self.p[l], (self._input(l) if self.model.block_layers[l].update_uses_dst else None)

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.io.h2d = self.io.d2h = 0
        se = (self.config.seed, epoch)
        L = len(self.model.layers)
        with self._counting():
            for l in range(L - 1):
                self._forward_layer(l, se)
            loss = self._last_layer_loss_backward(se)
            for l in range(L - 2, -1, -1):
                self._backward_layer(l, se)
            self.optimizer.step()
        stats: dict[str, float] = {"loss": loss, "h2d_bytes": self.io.h2d, "d2h_bytes": self.io.d2h,
                                   "chunks": self.num_chunks, "partitions": self.partitions}
        if self.counter is not None:
            stats["peak_device_bytes"] = self.counter.peak
        return stats

    @torch.no_grad()
    def _project(self, l: int, se: tuple[int, int] | None) -> None:
        """``p[l] = project(input of layer l)``, once per vertex, chunk by chunk (destination rows only)."""
        layer = self.model.block_layers[l]
        for k, (ids, x_dst) in self.io.prefetched(self._dst_loads(self._input(l)), self.num_chunks):
            self.io.store(self.p[l], self.chunks[k].lo, layer.project(self._prepare(l, x_dst, ids, se)))
        self.io.barrier()

    def _project_backward(self, l: int, se: tuple[int, int]) -> None:
        """Backpropagate the accumulated ``dL/dp[l]`` through the projection, chunk by chunk."""
        layer = self.model.block_layers[l]
        for k, (ids, x_dst, grad_p) in self.io.prefetched(self._dst_loads(self._input(l), self.gp[l]),
                                                           self.num_chunks):
            c = self.chunks[k]
            x = self._prepare(l, x_dst, ids, se).detach().requires_grad_(l > 0)
            layer.project(x).backward(grad_p)
            if l > 0:
                assert x.grad is not None
                self.io.accumulate(self.g[l], c.rows[: c.num_dst], x.grad)
        self.io.barrier()
        self.gp[l].zero_()

    def _apply(self, l: int, c: Chunk, block: Block, x_src: Tensor, x_dst: Tensor | None,
               se: tuple[int, int] | None, cache: bool) -> Tensor:
        """Layer ``l`` on chunk ``c`` from its gathered rows (projected rows for a projecting layer); with ``cache``
        the aggregation is copied to host memory for backward."""
        layer = self.model.block_layers[l]
        ids = block.row_ids()
        if l in self.projected:
            a = layer.propagate(block, x_src)
            xd = None if x_dst is None else self._prepare(l, x_dst, ids[: c.num_dst], se)
        else:
            x = self._prepare(l, x_src, ids, se)
            if not cache:
                return layer(block, x)
            a, xd = layer.aggregate(block, x), x[: c.num_dst]
        if cache:
            self.io.store(self.agg[l], c.lo, a)
        return layer.update(a, xd)  # type: ignore[arg-type]  # None when UPDATE ignores x_dst

    @torch.no_grad()
    def _forward_layer(self, l: int, se: tuple[int, int] | None) -> None:
        """Layer ``l`` over all chunks into ``h[l+1]``; caches the aggregation when training."""
        if l in self.projected:
            self._project(l, se)
        cache = se is not None and l in self.cached
        for k, (block, x_src, x_dst) in self.io.prefetched(self._loads(*self._source(l)), self.num_chunks):
            c = self.chunks[k]
            y = self._apply(l, c, block, x_src, x_dst, se, cache)
            # store the next layer's input, activation and dropout applied once per vertex (not once per copy)
            self.io.store(self.h[l + 1], c.lo, self.model.layer_input(l + 1, y, block.row_ids(c.num_dst), se))
        self.io.barrier()

    def _last_layer_loss_backward(self, se: tuple[int, int]) -> float:
        L = len(self.model.layers)
        l, layer = L - 1, self.model.block_layers[L - 1]
        projected = l in self.projected
        if projected:
            self._project(l, se)
        total = torch.zeros((), device=self.device)
        for k, (block, x_src, x_dst) in self.io.prefetched(self._loads(*self._source(l)), self.num_chunks):
            c = self.chunks[k]
            ids = block.row_ids()
            xd = None
            if projected:  # gradients flow into the projected rows (then the projection) and the dst rows
                x = x_src.detach().requires_grad_(True)
                if x_dst is not None:
                    xd = self._prepare(l, x_dst, ids[: c.num_dst], se).detach().requires_grad_(l > 0)
                logits = layer.update(layer.propagate(block, x), xd)  # type: ignore[arg-type]
            else:
                x = self._prepare(l, x_src, ids, se).detach().requires_grad_(l > 0)
                logits = layer(block, x)  # [V, C]
            idx = c.train_local.to(self.device, non_blocking=True)
            y = self.y[c.lo : c.hi].to(self.device, non_blocking=True).index_select(0, idx)
            loss = F.cross_entropy(logits.index_select(0, idx), y, reduction="sum") / self.num_train
            loss.backward()
            total += loss.detach()
            if projected:
                assert x.grad is not None
                self.io.accumulate(self.gp[l], c.rows, x.grad)
            elif l > 0:
                assert x.grad is not None
                self.io.accumulate(self.g[l], c.rows, x.grad)
            if xd is not None and xd.grad is not None:
                self.io.accumulate(self.g[l], c.rows[: c.num_dst], xd.grad)
        self.io.barrier()
        if projected:
            self._project_backward(l, se)
        return float(total)

    def _backward_layer(self, l: int, se: tuple[int, int]) -> None:
        """Recompute layer ``l`` per chunk and backpropagate ``dL/dx^{l+1}`` into ``g[l]`` and the parameters."""
        layer, next_in = self.model.block_layers[l], self.g[l + 1]
        cached, projected = l in self.cached, l in self.projected
        dst_src = self._input(l) if cached and layer.update_uses_dst else None

        def load(k: int) -> tuple[Block, Tensor | None, Tensor | None, Tensor | None, Tensor]:
            c = self.chunks[k]
            block, rows_dev = self.io.block(c)
            x_src = None if cached else self.io.rows(self._input(l), c, rows_dev)
            x_dst = None if dst_src is None else self.io.slice(dst_src, c.lo, c.hi)
            a = self.io.slice(self.agg[l], c.lo, c.hi) if cached else None
            return block, x_src, a, x_dst, self.io.slice(next_in, c.lo, c.hi)

        for k, (block, x_src, a, x_dst, grad_next) in self.io.prefetched(load, self.num_chunks):
            c = self.chunks[k]
            ids = block.row_ids()
            xd = None
            if cached:  # recompute only UPDATE from the cached aggregation
                assert a is not None
                a = a.detach().requires_grad_(l > 0 or projected)
                if x_dst is not None:
                    xd = self._prepare(l, x_dst, ids[: c.num_dst], se).detach().requires_grad_(l > 0)
                y = layer.update(a, xd)  # type: ignore[arg-type]  # None when UPDATE ignores x_dst
            else:  # recompute the whole layer (GAT)
                assert x_src is not None
                x = self._prepare(l, x_src, ids, se).detach().requires_grad_(l > 0)
                y = layer(block, x)
            self.model.layer_input(l + 1, y, ids[: c.num_dst], se).backward(grad_next)
            if cached and a is not None and a.grad is not None:
                # through the propagation to the source rows: of the projection, or of the layer input
                self.io.accumulate(self.gp[l] if projected else self.g[l], c.rows, layer.aggregate_vjp(block, a.grad))
            elif not cached and l > 0:
                assert x.grad is not None
                self.io.accumulate(self.g[l], c.rows, x.grad)
            if xd is not None and xd.grad is not None:
                self.io.accumulate(self.g[l], c.rows[: c.num_dst], xd.grad)
        self.io.barrier()
        next_in.zero_()  # consumed: ready for the next epoch's accumulation
        if projected:
            self._project_backward(l, se)

    # ------------------------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        self.model.eval()
        L = len(self.model.layers)
        for l in range(L - 1):
            self._forward_layer(l, None)
        if L - 1 in self.projected:
            self._project(L - 1, None)
        pred = torch.empty(self.graph.num_nodes, dtype=torch.int64)
        for k, (block, x_src, x_dst) in self.io.prefetched(self._loads(*self._source(L - 1)), self.num_chunks):
            c = self.chunks[k]
            pred[c.lo : c.hi] = self._apply(L - 1, c, block, x_src, x_dst, None, False).argmax(dim=-1).cpu()
        return self.accuracies(pred, self.y, self.masks)

    def describe(self) -> str:
        return describe(self.plan)
