"""NeutronTask's task-parallel engine: decoupled T and P tasks on different devices (NeutronTask §4-5).

The model is a :class:`~gnnscale.nn.decoupled.DecoupledGNN`: ``L`` vertex T tasks (an MLP), for dgat one edge
task, then ``L`` P tasks (propagations). :func:`~gnnscale.plan.taskparallel.plan_taskparallel` assigns them to
devices (one device; same-type tasks grouped; one task per device; hybrid groups) and cuts the vertex ids into
``M = S * k`` chunks. Every epoch the chunks are shuffled and every ``k`` form a subgraph (Algorithm 1, line 3).

Each device is driven by one thread (a :class:`_Runner`), which runs the operations submitted to it in order;
an operation first waits for the operations whose results it reads. Everything is submitted in one order that
respects those dependencies, so no device waits for work queued behind it. Per epoch (Algorithm 2):

1. **T forward**, subgraph by subgraph through the T stages (features from host memory on the first; each
   stage's output handed to the next device); the last stage's output ``H^0`` of a subgraph goes to the P
   devices. A stage runs at most :data:`QUEUE_DEPTH` subgraphs ahead of the next one (a bounded queue). Nothing
   is kept for backward: the T tasks are recomputed there (§5.1).
2. **P forward**, chunk by chunk: a P device caches the rows it receives once per epoch and task (cross-subgraph
   reuse: a row of an earlier subgraph is never fetched twice), assembles each chunk's source rows from that cache
   and propagates. dgat's edge task scores the chunk's edges beside ``p1``. The last P task computes the chunk's
   loss share and its gradient at once. With ``--dependency exact`` the first P task waits for every T task and
   each P task for the whole previous one: the in-memory model exactly. With ``skip`` a subgraph runs through all
   P tasks as soon as its T output arrives, and edges from subgraphs later in this epoch's order are skipped
   (Algorithm 1), so T and P devices overlap.
3. **P backward** in reverse (``skip``: subgraph by subgraph from the last), each chunk sending its sources'
   gradient shares to their owners; dgat's attention gradients are finished per chunk by recomputing the edge
   task. **T backward** for a subgraph starts as soon as its rows' gradients are complete (``skip``: right after
   that subgraph's P backward): the T stages recompute their forward from the features, then backpropagate.
4. Parameter gradients summed over the devices' replicas, one optimiser step.

Dropout masks are keyed by (seed, epoch, layer, vertex id), so recomputation and the in-memory engine draw the same
masks. On CPU every device thread counts the bytes it allocates (:class:`~gnnscale.plan.memory.LiveBytesCounter`):
``device_peak_bytes`` per device, measured, not modelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale import progress
from gnnscale.engines.base import Engine
from gnnscale.engines.replicas import Replicas
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block, cut_block, normalized_csr
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.decoupled import DECOUPLED_MODELS, DecoupledGNN, weighted
from gnnscale.nn.model import GNN
from gnnscale.nn.ops import spmm_t
from gnnscale.partition.dedup import chunk_rows
from gnnscale.plan.memory import LiveBytesCounter, replica_baseline
from gnnscale.plan.taskparallel import Stage, TaskPlan, epoch_subgraphs, plan_taskparallel
from gnnscale.units import format_bytes

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

QUEUE_DEPTH = 2
"""Subgraphs a T stage may run ahead of the stage it feeds."""
OPS = ("TF", "TR", "TB", "PF", "PB")
"""Operation kinds timed per device: T forward, T recomputation, T backward, P forward, P backward."""


class _Runner:
    """One device's thread: runs submitted operations in order, times them by kind and (on CPU) counts the bytes
    they allocate. On CUDA each runner issues its kernels on its own stream and an operation's future resolves
    once its work is done on the device, so a consumer on another stream (or GPU) reads finished data."""

    def __init__(self, index: int, device: torch.device, model: DecoupledGNN):
        self.index, self.device, self.model = index, device, model
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"gnnscale-task{index}")
        self.counter = LiveBytesCounter() if device.type == "cpu" else None
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.busy = dict.fromkeys(OPS, 0.0)
        self.blocks: dict[int, Block] = {}
        """Chunk blocks moved here once and kept (topology is read every epoch)."""
        self.shared_bytes = 0
        """Bytes of host blocks this (first, CPU) device uses in place: counted as its memory, not copied."""
        self.cache: dict[tuple[int, int], Tensor] = {}
        """``(layer, chunk) -> H^layer`` rows of the chunk received this epoch (cross-subgraph reuse)."""
        self.epoch_blocks: dict[int, Block] = {}
        """This epoch's blocks (``skip``: with the later subgraphs' edges dropped)."""
        self.alpha: dict[int, Tensor] = {}
        """dgat: attention weights of the chunks this device propagates."""
        self.saved: dict[tuple[int, int], Tensor] = {}
        """T stage inputs of the recomputation, kept between re-forward and backward."""
        self.trace: list[tuple[str, int, int]] | None = None

    def submit(self, kind: str, fn: Callable[[], Any], deps: Iterable[Future[Any]] = ()) -> Future[Any]:
        deps = list(deps)

        def run() -> Any:
            for d in deps:
                d.result()
            t0 = time.perf_counter()
            try:
                if self.stream is not None:
                    with torch.cuda.stream(self.stream):
                        out = fn()
                    self.stream.synchronize()  # this thread waits; the other devices' threads go on
                    return out
                if self.counter is None:
                    return fn()
                with self.counter:
                    return fn()
            finally:
                self.busy[kind] += time.perf_counter() - t0

        return self.pool.submit(run)

    def clear_epoch(self) -> None:
        self.cache.clear()
        self.epoch_blocks.clear()
        self.alpha.clear()
        self.saved.clear()


class _Chunk:
    """A destination chunk ``[lo, hi)``: its source rows, block and where those rows come from."""

    def __init__(self, k: int, lo: int, hi: int, rows: Tensor, block: Block, chunk_ptr: Tensor, train: Tensor,
                 y: Tensor):
        self.k, self.lo, self.hi, self.rows, self.block = k, lo, hi, rows, block
        owner = torch.searchsorted(chunk_ptr, rows, right=True) - 1  # [R] chunk of each source row
        self.edge_chunk = owner.index_select(0, block.indices.long())  # [E] chunk of each edge's source
        order = torch.sort(owner, stable=True)
        parts, start = [], 0
        counts = torch.bincount(owner, minlength=chunk_ptr.numel() - 1).tolist()
        for j, c in enumerate(counts):
            if c:
                pos = order.indices[start : start + c]
                parts.append((j, pos, rows.index_select(0, pos) - int(chunk_ptr[j])))
                start += c
        self.parts: list[tuple[int, Tensor, Tensor]] = parts
        """Per source chunk ``j``: positions in ``rows`` and offsets inside chunk ``j``."""
        self.train_local = torch.nonzero(train[lo:hi]).view(-1)
        self.y_train = y[lo:hi].index_select(0, self.train_local)

    @property
    def num_dst(self) -> int:
        return self.hi - self.lo


class TaskParallelEngine(Engine):
    """Decoupled T/P tasks over devices, pipelined over subgraphs (NeutronTask §4-5)."""

    name = "taskparallel"

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device) -> list[str]:
        if config.model not in DECOUPLED_MODELS:
            return [f"runs decoupled models ({', '.join(DECOUPLED_MODELS)}), not {config.model}"]
        try:
            plan_taskparallel(graph, config, device)
        except ConfigError as exc:
            return [str(exc)]
        return []

    def __init__(self, graph: Graph, model: GNN, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        assert isinstance(model, DecoupledGNN)
        with progress.stage("plan", self.timings):
            self.plan: TaskPlan = plan_taskparallel(graph, config, device)
        self.dgat = model.kind == "dgat"
        self.L = model.num_t_tasks
        self._width = model.width
        devices = [torch.device(d) for d in self.plan.devices]
        self.replicas = Replicas(model, devices)
        self.runners = [_Runner(i, d, self.replicas.models[i]) for i, d in enumerate(devices)]  # type: ignore[arg-type]
        pin = devices[0].type == "cuda"
        assert graph.x is not None and graph.y is not None
        self.x = graph.x.float().pin_memory() if pin else graph.x.float()
        self.y = graph.y
        self.masks = {m: getattr(graph, m) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.num_train = int(self.masks["train_mask"].sum())
        self.ptr = self.plan.chunk_ptr
        self.chunks = self._build_chunks(graph)
        self.t_stages, self.p_stages = self.plan.t_stages, self.plan.p_stages
        self.p_stage_of = [next(s for s in self.p_stages if s.start <= l < s.stop) for l in range(self.L)]
        self.moved: dict[str, int] = {}
        self.trace: list[tuple[str, int, int]] | None = None
        """Set to a list to record ``(op, layer or stage, chunk or subgraph)`` as operations start (tests)."""
        self.hooks: dict[str, Callable[..., None]] = {}
        """Test hooks called at the start of an operation: ``t_forward(stage, subgraph)``, ``p_forward(subgraph)``."""
        self._lock = threading.Lock()

    def _build_chunks(self, graph: Graph) -> list[_Chunk]:
        indptr, indices, weight = normalized_csr(graph, self.model.adjacency)
        ptr = self.ptr
        rows = chunk_rows(indptr, indices, ptr)
        train = self.masks["train_mask"]
        small = graph.num_nodes < 2**31
        pos = torch.empty(graph.num_nodes, dtype=torch.int32 if small else torch.int64)
        out = []
        for k in range(ptr.numel() - 1):
            lo, hi = int(ptr[k]), int(ptr[k + 1])
            r = rows[k]
            block = cut_block(indptr, indices, weight, lo, hi, r, pos, r.to(torch.int32) if small else r)
            if not self.dgat and self.config.dependency == "exact":
                block.with_transpose()
            out.append(_Chunk(k, lo, hi, r, block, ptr, train, self.y))
        return out

    # ------------------------------------------------------------------------------------------- helpers
    def _move(self, t: Tensor, src: _Runner | None, dst: _Runner, kind: str) -> Tensor:
        """``t`` (made on ``src``; ``None``: host memory) on ``dst``'s device: shared when it is the same runner, a
        copy otherwise (on CPU too, so the receiving device's counter sees it); bytes counted by ``kind``."""
        if src is dst:
            return t
        with self._lock:
            self.moved[kind] = self.moved.get(kind, 0) + t.numel() * t.element_size()
        if dst.device.type == "cpu":
            return t.clone()
        out = t.to(dst.device, non_blocking=True)
        if dst.stream is not None and out.device == t.device:
            out.record_stream(dst.stream)  # two runners on one GPU share the tensor: keep it until dst is done
        return out

    def _order(self, epoch: int) -> tuple[list[list[int]], list[int], list[int]]:
        """This epoch's subgraphs (``k`` shuffled chunks each), each chunk's subgraph and position in it."""
        return epoch_subgraphs(self.plan.num_chunks, self.plan.chunks_per_subgraph, self.config.seed, epoch)

    def subgraph_of_vertex(self, epoch: int) -> Tensor:
        """``[N]`` this epoch's subgraph of every vertex (``skip`` drops the edges ``u -> v`` with
        ``sub[u] > sub[v]``)."""
        _, sub_of, _ = self._order(epoch)
        sizes = self.ptr[1:] - self.ptr[:-1]
        return torch.repeat_interleave(torch.tensor(sub_of), sizes)

    def _t_runner(self, stage: Stage, s: int) -> _Runner:
        return self.runners[stage.devices[s % len(stage.devices)]]

    def _p_runner(self, l: int, chunk: int) -> _Runner:
        stage = self.p_stage_of[l]
        return self.runners[stage.devices[self._slot[chunk] % len(stage.devices)]]

    def _block(self, r: _Runner, c: _Chunk) -> Block:
        """Chunk ``c``'s block for this epoch on ``r`` (``skip``: edges from later subgraphs dropped)."""
        b = r.epoch_blocks.get(c.k)
        if b is not None:
            return b
        base = r.blocks.get(c.k)
        if base is None:
            if r.device.type == "cpu" and r.index == 0:  # the host's block serves the first CPU device as is
                base = r.blocks[c.k] = c.block
                r.shared_bytes += c.block.nbytes()  # ... and counts as that device's memory
                if r.counter is not None:
                    r.counter.baseline += c.block.nbytes()
                    r.counter.peak = max(r.counter.peak, r.counter.baseline + r.counter.current)
            else:
                base = r.blocks[c.k] = self._copy_block(c, r)
        if self._skip:
            keep = self._sub_t.index_select(0, c.edge_chunk) <= self._sub_of[c.k]  # [E]
            counts = torch.zeros(c.num_dst, dtype=torch.int64).index_add_(
                0, c.block.dst_index(), keep.to(torch.int64))
            indptr = torch.zeros(c.num_dst + 1, dtype=torch.int64)
            torch.cumsum(counts, 0, out=indptr[1:])
            indptr = indptr.to(base.indptr.dtype)
            keep_d = keep.to(r.device)
            b = Block(indptr=indptr.to(r.device), indices=base.indices[keep_d], num_src=base.num_src,
                      edge_weight=None if base.edge_weight is None else base.edge_weight[keep_d],
                      src_ids=base.src_ids)
        else:
            b = base
        r.epoch_blocks[c.k] = b
        return b

    def _copy_block(self, c: _Chunk, r: _Runner) -> Block:
        with self._lock:
            self.moved["topology"] = self.moved.get("topology", 0) + c.block.nbytes()
        if r.device.type == "cpu":
            return c.block.map(torch.clone)
        return c.block.to(r.device, non_blocking=True)

    # ------------------------------------------------------------------------------------------- T tasks
    def _sub_ids(self, s: int) -> Tensor:
        return torch.cat([torch.arange(self.chunks[c].lo, self.chunks[c].hi) for c in self._subs[s]])

    def _t_forward(self, k: int, s: int, prev: Future[Any] | None, se: tuple[int, int] | None) -> Tensor:
        stage = self.t_stages[k]
        r = self._t_runner(stage, s)
        if "t_forward" in self.hooks:
            self.hooks["t_forward"](k, s)
        self._log("TF", k, s)
        ids = self._sub_ids(s)
        x = self._features(r, ids) if prev is None else self._move(prev.result(), self._t_runner(
            self.t_stages[k - 1], s), r, "t2t")
        with torch.no_grad():
            return r.model.transform(x, ids.to(r.device), se, stage.start, stage.stop)

    def _features(self, r: _Runner, ids: Tensor) -> Tensor:
        rows = self.x.index_select(0, ids)
        with self._lock:
            self.moved["h2d"] = self.moved.get("h2d", 0) + rows.numel() * rows.element_size()
        return rows if r.device.type == "cpu" else rows.to(r.device, non_blocking=True)

    def _t_refwd(self, k: int, s: int, prev: Future[Any] | None, se: tuple[int, int]) -> Tensor:
        """Stage ``k``'s recomputation for subgraph ``s``: its input is kept for its backward."""
        stage = self.t_stages[k]
        r = self._t_runner(stage, s)
        self._log("TR", k, s)
        ids = self._sub_ids(s)
        x = self._features(r, ids) if prev is None else self._move(prev.result(), self._t_runner(
            self.t_stages[k - 1], s), r, "t2t")
        r.saved[(k, s)] = x
        with torch.no_grad():
            return r.model.transform(x, ids.to(r.device), se, stage.start, stage.stop)

    def _t_backward(self, k: int, s: int, grad: Callable[[_Runner], Tensor], se: tuple[int, int]) -> Tensor | None:
        stage = self.t_stages[k]
        r = self._t_runner(stage, s)
        self._log("TB", k, s)
        ids = self._sub_ids(s)
        x = r.saved.pop((k, s), None)
        if x is None:  # the first stage re-reads the features
            x = self._features(r, ids)
        x = x.detach().requires_grad_(k > 0)
        with torch.enable_grad():
            y = r.model.transform(x, ids.to(r.device), se, stage.start, stage.stop)
            y.backward(grad(r))
        return x.grad

    # ------------------------------------------------------------------------------------------- P tasks
    def _rows(self, r: _Runner, l: int, c: _Chunk, source: Callable[[int], tuple[Tensor, _Runner]]) -> Tensor:
        """Chunk ``c``'s source rows of ``H^l`` on ``r``, from its cache (each chunk's rows fetched once; inside a
        hybrid P group, only the rows of chunk ``j`` that this device's chunks read)."""
        x = torch.zeros(c.block.num_src, self._width, device=r.device)
        for j, pos, off in c.parts:
            if self._skip and self._sub_of[j] > self._sub_of[c.k]:
                continue  # a later subgraph's rows: skipped this epoch (Algorithm 1)
            need = self._need.get((r.index, j))
            cached = r.cache.get((l, j))
            if cached is None:
                t, owner = source(j)
                if need is not None:  # a P group member takes only the rows its own chunks read
                    t = t.index_select(0, need.to(t.device))
                cached = r.cache[(l, j)] = self._move(t, owner, r, "t2p" if l == 0 else "p2p")
            if need is not None:
                off = torch.searchsorted(need, off)
            x.index_copy_(0, pos.to(r.device), cached.index_select(0, off.to(r.device)))
        return x

    def _source(self, l: int, t_out: dict[int, Future[Any]], p_out: dict[tuple[int, int], Future[Any]]
                ) -> Callable[[int], tuple[Tensor, _Runner]]:
        """Where chunk ``j``'s ``H^l`` rows are: the last T stage's output (``l = 0``) or P task ``l - 1``'s."""
        last = self.t_stages[-1]

        def get(j: int) -> tuple[Tensor, _Runner]:
            if l == 0:
                s = self._sub_of[j]
                off = self._offset[j]
                return t_out[s].result()[off : off + self.chunks[j].num_dst], self._t_runner(last, s)
            return p_out[(l - 1, j)].result(), self._p_runner(l - 1, j)

        return get

    def _p_forward(self, l: int, c: _Chunk, source: Callable[[int], tuple[Tensor, _Runner]],
                   train: bool) -> Tensor:
        r = self._p_runner(l, c.k)
        if "p_forward" in self.hooks:
            self.hooks["p_forward"](self._sub_of[c.k])
        self._log("PF", l, c.k)
        with torch.no_grad():
            block = self._block(r, c)
            x = self._rows(r, l, c, source)
            if self.dgat:
                if l == 0:
                    alpha = r.model.edge_weights(block, x)
                    assert alpha is not None
                    self._alpha_owner[c.k] = r
                else:
                    alpha = self._move(self._alpha_owner[c.k].alpha[c.k], self._alpha_owner[c.k], r, "p2p")
                r.alpha[c.k] = alpha
                block = weighted(block, alpha)
            out = block.adj() @ x  # [V, C]
        if l == self.L - 1:
            if not train:
                return out.argmax(dim=-1)
            logits = out.detach().requires_grad_(True)
            idx, y = c.train_local.to(r.device), c.y_train.to(r.device)
            with torch.enable_grad():
                loss = F.cross_entropy(logits.index_select(0, idx), y, reduction="sum") / self.num_train
                (g,) = torch.autograd.grad(loss, logits)
            self._post((l, c.k), None, g, r)
            with self._lock:
                self._losses.append(loss.detach())
        return out

    def _post(self, key: tuple[int, int], off: Tensor | None, g: Tensor, r: _Runner) -> None:
        with self._lock:
            self._gbox.setdefault(key, []).append((off, g, r))

    def _take(self, key: tuple[int, int], rows: int, r: _Runner) -> Tensor:
        """The summed gradient shares posted for ``key`` (a chunk's rows), on ``r``."""
        with self._lock:
            parts = self._gbox.pop(key, [])
        g = torch.zeros(rows, self._width, device=r.device)
        for off, part, owner in parts:
            part = self._move(part, owner, r, "p2p" if key[0] >= 0 else "p2t")
            if off is None:
                g += part
            else:
                g.index_add_(0, off.to(r.device), part)
        return g

    def _p_backward(self, l: int, c: _Chunk, source: Callable[[int], tuple[Tensor, _Runner]],
                    se: tuple[int, int]) -> None:
        r = self._p_runner(l, c.k)
        self._log("PB", l, c.k)
        g = self._take((l, c.k), c.num_dst, r)  # dL/dH^{l+1} of the chunk's rows, complete
        block = self._block(r, c)
        x = None
        if self.dgat:
            x = self._rows(r, l, c, source)  # H^l (cached): the attention weights' gradient reads it
            src, dst = block.indices.long(), block.dst_index()
            d_alpha = (g.index_select(0, dst) * x.index_select(0, src)).sum(-1)  # [E]
            self._post((-2, c.k), None, d_alpha, r)
            block = weighted(block, r.alpha[c.k])
        with torch.no_grad():
            gin = spmm_t(block, g)  # [R, C] the sources' shares
        if self.dgat and l == 0:
            gin = gin + self._attention_backward(r, c, block, se, source)
        self._scatter(l - 1, c, gin, r)

    def _attention_backward(self, r: _Runner, c: _Chunk, block: Block, se: tuple[int, int],
                            source: Callable[[int], tuple[Tensor, _Runner]]) -> Tensor:
        """dgat: the edge task recomputed with autograd from ``H^0`` and backpropagated with the attention weights'
        gradient summed over every P task: edge parameters' gradients, and the sources' shares of ``dL/dH^0``."""
        with self._lock:
            parts = self._gbox.pop((-2, c.k), [])
        d_alpha = torch.zeros(block.num_edges, device=r.device)
        for _, part, owner in parts:
            d_alpha += self._move(part, owner, r, "p2p")
        x = self._rows(r, 0, c, source).requires_grad_(True)
        with torch.enable_grad():
            alpha = r.model.edge_weights(self._block(r, c), x)
            assert alpha is not None
            (alpha * d_alpha).sum().backward()
        assert x.grad is not None
        return x.grad

    def _scatter(self, l: int, c: _Chunk, gin: Tensor, r: _Runner) -> None:
        """Post the source rows' gradient shares to the chunks owning them (``l = -1``: the T side's ``H^0``)."""
        for j, pos, off in c.parts:
            if self._skip and self._sub_of[j] > self._sub_of[c.k]:
                continue
            self._post((l, j), off, gin.index_select(0, pos.to(r.device)), r)

    # ------------------------------------------------------------------------------------------- an epoch
    def _log(self, op: str, a: int, b: int) -> None:
        if self.trace is not None:
            with self._lock:
                self.trace.append((op, a, b))

    def _start(self, epoch: int, skip: bool) -> None:
        self._subs, self._sub_of, self._slot = self._order(epoch)
        self._sub_t = torch.tensor(self._sub_of)
        self._skip = skip
        self._offset: dict[int, int] = {}
        for members in self._subs:
            off = 0
            for cidx in members:
                self._offset[cidx] = off
                off += self.chunks[cidx].num_dst
        self._need = self._needed_rows()
        self._gbox: dict[tuple[int, int], list[tuple[Tensor | None, Tensor, _Runner]]] = {}
        self._losses: list[Tensor] = []
        self._alpha_owner: dict[int, _Runner] = {}
        self.moved = {}
        for r in self.runners:
            r.clear_epoch()
            r.busy = dict.fromkeys(OPS, 0.0)

    def _needed_rows(self) -> dict[tuple[int, int], Tensor]:
        """This epoch's ``(device, source chunk) -> sorted offsets`` of the rows each member of a multi-device
        P group reads (its chunks are those whose slot in their subgraph falls to it): neighbour rows are
        replicated only as far as the group's members need them, as data parallelism over the group would."""
        offs: dict[tuple[int, int], list[Tensor]] = {}
        for stage in self.p_stages:
            if len(stage.devices) == 1:
                continue
            for c in self.chunks:
                r = self._p_runner(stage.start, c.k)
                for j, _, off in c.parts:
                    offs.setdefault((r.index, j), []).append(off)
        return {key: torch.unique(torch.cat(parts)) for key, parts in offs.items()}

    def _forward(self, se: tuple[int, int] | None, train: bool) -> tuple[dict[int, Future[Any]],
                                                                          dict[tuple[int, int], Future[Any]]]:
        """Submit the T and P forward operations; returns the last T stage's and every P task's futures."""
        S, K = len(self._subs), len(self.t_stages)
        t_out: dict[int, Future[Any]] = {}
        p_out: dict[tuple[int, int], Future[Any]] = {}
        tf: dict[tuple[int, int], Future[Any]] = {}
        pipelined = self._skip

        def submit_t(s: int) -> None:
            for k, stage in enumerate(self.t_stages):
                deps = [tf[(k - 1, s)]] if k else []
                if k + 1 < K and s >= QUEUE_DEPTH:
                    deps.append(tf[(k + 1, s - QUEUE_DEPTH)])  # bounded queue between stages
                prev = tf[(k - 1, s)] if k else None
                tf[(k, s)] = self._t_runner(stage, s).submit(
                    "TF", partial(self._t_forward, k, s, prev, se), deps)
            t_out[s] = tf[(K - 1, s)]

        def submit_p(l: int, cidx: int, deps: list[Future[Any]]) -> None:
            src = self._source(l, t_out, p_out)
            p_out[(l, cidx)] = self._p_runner(l, cidx).submit(
                "PF", lambda: self._p_forward(l, self.chunks[cidx], src, train), deps)

        if pipelined:  # a subgraph through every P task as soon as its T output is there
            for s in range(S):
                submit_t(s)
                for l in range(self.L):
                    for cidx in self._subs[s]:
                        before = [x for s2 in range(s + 1) for x in
                                  ([t_out[s2]] if l == 0 else [p_out[(l - 1, j)] for j in self._subs[s2]])]
                        submit_p(l, cidx, before)
        else:
            for s in range(S):
                submit_t(s)
            for l in range(self.L):
                deps = list(t_out.values()) if l == 0 else [p_out[(l - 1, j)] for j in range(self.plan.num_chunks)]
                for s in range(S):
                    for cidx in self._subs[s]:
                        submit_p(l, cidx, deps)
        return t_out, p_out

    def _backward(self, se: tuple[int, int], t_out: dict[int, Future[Any]],
                  p_out: dict[tuple[int, int], Future[Any]]) -> list[Future[Any]]:
        S, K, L = len(self._subs), len(self.t_stages), self.L
        pb: dict[tuple[int, int], Future[Any]] = {}
        futures: list[Future[Any]] = []

        def submit_pb(l: int, cidx: int) -> None:
            s = self._sub_of[cidx]
            later = range(s, S) if self._skip else range(S)
            deps = [p_out[(L - 1, cidx)]] if l == L - 1 else [pb[(l + 1, j)] for s2 in later for j in self._subs[s2]]
            src = self._source(l, t_out, p_out)
            pb[(l, cidx)] = self._p_runner(l, cidx).submit(
                "PB", lambda: self._p_backward(l, self.chunks[cidx], src, se), deps)

        def submit_t(s: int) -> None:
            later = range(s, S) if self._skip else range(S)
            ready = [pb[(0, j)] for s2 in later for j in self._subs[s2]]
            rf: dict[int, Future[Any]] = {}
            for k in range(K - 1):
                prev = rf.get(k - 1)
                rf[k] = self._t_runner(self.t_stages[k], s).submit(
                    "TR", partial(self._t_refwd, k, s, prev, se), [prev] if prev else [])
            last = self._t_runner(self.t_stages[-1], s)

            def g0(r: _Runner) -> Tensor:
                return torch.cat([self._take((-1, j), self.chunks[j].num_dst, r) for j in self._subs[s]])

            def grad_from(fut: Future[Any], k: int) -> Callable[[_Runner], Tensor]:
                return lambda r: self._move(fut.result(), self._t_runner(self.t_stages[k + 1], s), r, "t2t")

            if K > 1:
                # the last stage's input is the previous stage's recomputed output
                prev_out = rf[K - 2]
                last_stage = self.t_stages[-1]

                def tb_last() -> Tensor | None:
                    last.saved[(K - 1, s)] = self._move(prev_out.result(), self._t_runner(self.t_stages[K - 2], s),
                                                        last, "t2t")
                    return self._t_backward(K - 1, s, g0, se)

                del last_stage
                fut = last.submit("TB", tb_last, [*ready, prev_out])
            else:
                fut = last.submit("TB", lambda: self._t_backward(0, s, g0, se), ready)
            for k in range(K - 2, -1, -1):
                gf = grad_from(fut, k)
                fut = self._t_runner(self.t_stages[k], s).submit(
                    "TB", partial(self._t_backward, k, s, gf, se), [fut, rf[k]])
            futures.append(fut)

        if self._skip:
            for s in range(S - 1, -1, -1):
                for l in range(L - 1, -1, -1):
                    for cidx in self._subs[s]:
                        submit_pb(l, cidx)
                submit_t(s)
        else:
            for l in range(L - 1, -1, -1):
                for s in range(S - 1, -1, -1):
                    for cidx in self._subs[s]:
                        submit_pb(l, cidx)
            for s in range(S - 1, -1, -1):
                submit_t(s)
        return [*pb.values(), *futures]

    def _wait(self, futures: Iterable[Future[Any]]) -> None:
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.replicas.sync()
        se = (self.config.seed, epoch)
        self._start(epoch, self.config.dependency == "skip")
        for r in self.runners:
            if r.counter is not None:
                r.counter.baseline = replica_baseline(r.model, r.index) + r.shared_bytes
                r.counter.reset_peak()
            elif r.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(r.device)
        t0 = time.perf_counter()
        try:
            t_out, p_out = self._forward(se, True)
            rest = self._backward(se, t_out, p_out)
            self._wait([*t_out.values(), *p_out.values(), *rest])
            self.replicas.reduce()
            self.optimizer.step()
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            for r in self.runners:
                r.model.zero_grad(set_to_none=True)
            raise
        finally:
            for r in self.runners:
                r.clear_epoch()
        wall = time.perf_counter() - t0
        loss = float(sum(float(x) for x in self._losses))
        stats: dict[str, Any] = {
            "loss": loss, "subgraphs": len(self._subs), "chunks": self.plan.num_chunks,
            "devices": len(self.runners), "pipeline_wall_s": wall,
            "t_busy_s": sum(v for r in self.runners for op, v in r.busy.items() if op[0] == "T"),
            "p_busy_s": sum(v for r in self.runners for op, v in r.busy.items() if op[0] == "P"),
            "t_forward_s": sum(r.busy["TF"] for r in self.runners),
            "p_forward_s": sum(r.busy["PF"] for r in self.runners),
            **{f"{k}_bytes": v for k, v in sorted(self.moved.items())},
        }
        peaks = [r.counter.peak if r.counter is not None else int(torch.cuda.max_memory_allocated(r.device))
                 for r in self.runners if r.counter is not None or r.device.type == "cuda"]
        if peaks:
            stats["device_peak_bytes"] = peaks
            stats["peak_device_bytes"] = max(peaks)
        if self.plan.predicted:
            stats["predicted_t_s"] = self.plan.predicted["t_s"]
            stats["predicted_p_s"] = self.plan.predicted["p_s"]
        return stats

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        return self.accuracies(self.predict(), self.y, self.masks)

    def predict(self) -> Tensor:
        self.model.eval()
        self.replicas.sync()
        self._start(0, False)
        try:
            t_out, p_out = self._forward(None, False)
            self._wait([*t_out.values(), *p_out.values()])
            pred = torch.empty(self.graph.num_nodes, dtype=torch.int64)
            for c in self.chunks:
                pred[c.lo : c.hi] = p_out[(self.L - 1, c.k)].result().cpu()
        finally:
            for r in self.runners:
                r.clear_epoch()
        return pred

    def describe(self) -> str:
        text = self.plan.describe(self.dgat) + f"; --dependency {self.config.dependency}"
        if self.plan.predicted:
            p = self.plan.predicted
            text += f"; Eq. 5-6 predict T {p['t_s']:.3g}s, P {p['p_s']:.3g}s per epoch"
        return text

    def close(self) -> None:
        for r in self.runners:
            r.pool.shutdown(wait=True)


def format_peaks(peaks: list[int]) -> str:
    return ", ".join(format_bytes(p) for p in peaks)
