"""What the task-parallel engine's operations compute (NeutronTask Algorithm 2), and the epoch's state they share.

The engine (:mod:`gnnscale.engines.taskparallel.engine`) decides the order and dependencies of the operations; each one
runs on its device's :class:`~gnnscale.engines.taskparallel.runner.Runner` and is one of:

* a T stage's forward, recomputation or backward for one subgraph (``t_forward``, ``t_refwd``, ``t_backward``),
  or its part in one of BatchNorm's passes (``t_partial``, ``t_grad_sums``:
  :mod:`~gnnscale.engines.taskparallel.norm`);
* a P task's forward or backward for one chunk (``p_forward``, ``p_backward``), reading the chunk's source rows
  from the rows its device cached this epoch (each chunk's rows received once), posting gradient shares into the
  epoch's mailbox for the chunks that own the rows.

Every hand-off between devices goes through the receiving runner's row mover, which counts its bytes by kind
(``t2p``, ``p2p``, ``p2t``, ``t2t``; zero on one device).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.engines.core.chunks import Chunk
from gnnscale.engines.taskparallel.runner import Runner
from gnnscale.graph.block import Block
from gnnscale.nn.decoupled import weighted
from gnnscale.nn.ops import spmm_t
from gnnscale.plan.taskparallel import Stage, TaskPlan
from gnnscale.store.features import FeatureSource
from gnnscale.store.sources import ReorderedRows

RowSource = Callable[[int], tuple[Tensor, Runner]]
"""Chunk ``j`` -> its rows of a layer's input ``H^l`` and the runner that holds them."""
Mail = tuple[Tensor | None, Tensor, Runner]
"""A gradient share: offsets in the receiving chunk (``None``: all its rows), the rows' gradients, the sender."""


class TaskOps:
    """The T and P operations over one engine's runners, chunks and features.

    Args:
        plan: the task plan (stages, devices, chunks per subgraph).
        runners: one per device of the plan.
        chunks: the plan's chunks, each with its sources located (:meth:`~gnnscale.engines.core.chunks.Chunk.
            with_sources`).
        x: ``[N, F]`` the features in host memory (pinned for a GPU), or a feature source on the host (the disk
            tier, ``--host-memory``): each runner reads it onto its device (:class:`~gnnscale.store.sources.
            ReorderedRows`), a subgraph's rows in one read.
    """

    def __init__(self, plan: TaskPlan, runners: list[Runner], chunks: list[Chunk], x: Tensor | FeatureSource, *,
                 num_train: int, width: int, dgat: bool, num_layers: int):
        self.runners, self.chunks = runners, chunks
        self.features: dict[int, FeatureSource] = {
            id(r): ReorderedRows(x, device=r.device) if isinstance(x, FeatureSource) else r.io.source(x)
            for r in runners}
        """Each runner's feature source over ``x`` (:meth:`RowMover.source`): every feature row is read through
        one, and counted by its read counters."""
        self.num_train, self.width, self.dgat, self.L = num_train, width, dgat, num_layers
        self.t_stages, self.p_stages = plan.t_stages, plan.p_stages
        self.p_stage_of = [next(s for s in self.p_stages if s.start <= l < s.stop) for l in range(num_layers)]
        self.trace: list[tuple[str, int, int]] | None = None
        """Set to a list to record ``(op, layer or stage, chunk or subgraph)`` as operations start (tests)."""
        self.hooks: dict[str, Callable[..., None]] = {}
        """Test hooks called at the start of an operation: ``t_forward(stage, subgraph)``, ``p_forward(subgraph)``."""
        self._lock = threading.Lock()
        # the epoch's state, set by start()
        self.subs: list[list[int]] = []
        self.sub_of: list[int] = []
        self._slot: list[int] = []
        self._sub_t = torch.zeros(0, dtype=torch.int64)
        self.skip = False
        self._offset: dict[int, int] = {}
        """Each chunk's first row in its subgraph's rows (the T stages run a subgraph's rows in member order)."""
        self._need: dict[tuple[int, int], Tensor] = {}
        self._mailbox: dict[tuple[int, int], list[Mail]] = {}
        """``(layer, chunk) -> gradient shares of dL/dH^{layer + 1}`` posted for the chunk's rows (``layer = -1``:
        the T side's ``H^0``; ``-2``: dgat's attention weights)."""
        self.losses: list[Tensor] = []
        self._alpha_owner: dict[int, Runner] = {}
        self._out_grads: dict[int, Tensor] = {}
        """``subgraph -> dL/dH^0`` of its rows, kept while BatchNorm's gradient-sums passes read it."""

    # ------------------------------------------------------------------------------------------- the epoch
    def start(self, order: tuple[list[list[int]], list[int], list[int]], skip: bool) -> None:
        """Begin an epoch: its subgraphs (chunk ids each), each chunk's subgraph and position in it; ``skip``:
        edges from subgraphs later in the order are dropped (``--dependency skip``)."""
        self.subs, self.sub_of, self._slot = order
        self._sub_t = torch.tensor(self.sub_of)  # [M] each chunk's subgraph
        self.skip = skip
        self._offset = {}
        for members in self.subs:
            off = 0
            for cidx in members:
                self._offset[cidx] = off
                off += self.chunks[cidx].num_dst
        self._need = self._needed_rows()
        self._mailbox = {}
        self.losses = []
        self._alpha_owner = {}
        self._out_grads = {}

    def t_runner(self, stage: Stage, s: int) -> Runner:
        return self.runners[stage.devices[s % len(stage.devices)]]

    def p_runner(self, l: int, chunk: int) -> Runner:
        stage = self.p_stage_of[l]
        return self.runners[stage.devices[self._slot[chunk] % len(stage.devices)]]

    def _log(self, op: str, a: int, b: int) -> None:
        if self.trace is not None:
            with self._lock:
                self.trace.append((op, a, b))

    def _needed_rows(self) -> dict[tuple[int, int], Tensor]:
        """This epoch's ``(device, source chunk) -> sorted offsets`` of the rows each member of a multi-device
        P group reads (its chunks are those whose slot in their subgraph falls to it): neighbour rows are
        replicated only as far as the group's members need them, as data parallelism over the group would."""
        offs: dict[tuple[int, int], list[Tensor]] = {}
        for stage in self.p_stages:
            if len(stage.devices) == 1:
                continue
            for c in self.chunks:
                r = self.p_runner(stage.start, c.k)
                for j, _, off in c.sources:
                    offs.setdefault((r.index, j), []).append(off)
        return {key: torch.unique(torch.cat(parts)) for key, parts in offs.items()}

    def epoch_block(self, r: Runner, c: Chunk) -> Block:
        """Chunk ``c``'s block for this epoch on ``r`` (``skip``: edges from later subgraphs dropped)."""
        b = r.epoch_blocks.get(c.k)
        if b is not None:
            return b
        base = r.block(c)
        if self.skip:
            assert c.edge_chunk is not None
            keep = self._sub_t.index_select(0, c.edge_chunk) <= self.sub_of[c.k]  # [E]
            counts = torch.zeros(c.num_dst, dtype=torch.int64).index_add_(
                0, c.block.dst_index(), keep.to(torch.int64))
            indptr = torch.zeros(c.num_dst + 1, dtype=torch.int64)
            torch.cumsum(counts, 0, out=indptr[1:])
            indptr = indptr.to(base.indptr.dtype)
            keep_d = keep.to(r.place)
            b = Block(indptr=indptr.to(r.place), indices=base.indices[keep_d], num_src=base.num_src,
                      edge_weight=None if base.edge_weight is None else base.edge_weight[keep_d],
                      src_ids=base.src_ids)
        else:
            b = base
        r.epoch_blocks[c.k] = b
        return b

    # ------------------------------------------------------------------------------------------- T tasks
    def _sub_ids(self, s: int) -> Tensor:
        return torch.cat([torch.arange(self.chunks[c].lo, self.chunks[c].hi) for c in self.subs[s]])

    def _stage_input(self, k: int, s: int, prev: Future[Any] | Tensor | None, r: Runner, ids: Tensor) -> Tensor:
        """Stage ``k``'s input for subgraph ``s`` on ``r``: the features from host memory (the first stage), else
        the previous stage's output (``prev``, or its future) handed over."""
        if prev is None:
            return r.io.rows(self.features[id(r)], ids).float()
        out = prev if isinstance(prev, Tensor) else prev.result()
        return r.receive(out, self.t_runner(self.t_stages[k - 1], s), "t2t")

    def t_forward(self, k: int, s: int, prev: Future[Any] | None, se: tuple[int, int] | None) -> Tensor:
        stage = self.t_stages[k]
        r = self.t_runner(stage, s)
        if "t_forward" in self.hooks:
            self.hooks["t_forward"](k, s)
        self._log("TF", k, s)
        ids = self._sub_ids(s)
        x = self._stage_input(k, s, prev, r, ids)
        with torch.no_grad():
            return r.model.transform(x, ids.to(r.place), se, stage.start, stage.stop)

    def t_refwd(self, k: int, s: int, prev: Future[Any] | None, se: tuple[int, int]) -> Tensor:
        """Stage ``k``'s recomputation for subgraph ``s``: its input is kept for its backward."""
        stage = self.t_stages[k]
        r = self.t_runner(stage, s)
        self._log("TR", k, s)
        ids = self._sub_ids(s)
        x = self._stage_input(k, s, prev, r, ids)
        r.saved[(k, s)] = x
        with torch.no_grad():
            return r.model.transform(x, ids.to(r.place), se, stage.start, stage.stop)

    def t_backward(self, k: int, s: int, grad: Callable[[Runner], Tensor], se: tuple[int, int]) -> Tensor | None:
        """Stage ``k``'s backward for subgraph ``s`` from its kept input (the first stage re-reads the features);
        ``grad(r)``: the gradient of its output on ``r``. Returns the gradient of its input."""
        stage = self.t_stages[k]
        r = self.t_runner(stage, s)
        self._log("TB", k, s)
        ids = self._sub_ids(s)
        x = r.saved.pop((k, s), None)
        if x is None:  # the first stage re-reads the features
            x = r.io.rows(self.features[id(r)], ids).float()
        x = x.detach().requires_grad_(k > 0)
        with torch.enable_grad():
            y = r.model.transform(x, ids.to(r.place), se, stage.start, stage.stop)
            y.backward(grad(r))
        return x.grad

    def subgraph_grad(self, s: int, r: Runner, keep: bool = False) -> Tensor:
        """``dL/dH^0`` of subgraph ``s``'s rows on ``r``, from the shares its chunks' rows received (``keep``: kept
        for the next call, as BatchNorm's gradient-sums passes read it before the backward)."""
        with self._lock:
            g = self._out_grads.get(s) if keep else self._out_grads.pop(s, None)
        if g is None:
            g = torch.cat([self.take((-1, j), self.chunks[j].num_dst, r) for j in self.subs[s]])
            if keep:
                with self._lock:
                    self._out_grads[s] = g
        return g

    # ------------------------------------------------------------------------------------------- BatchNorm passes
    def t_partial(self, k: int, s: int, prev: Tensor | None, se: tuple[int, int], norm: int | None
                  ) -> Tensor | None:
        """Stage ``k``'s forward for subgraph ``s`` in one of BatchNorm's passes, nothing kept: with ``norm`` (a
        statistics pass of ``norms[norm]``) its T tasks up to T task ``norm``, whose output the norm sums if the
        stage computes it (returning nothing); without, the whole stage (a gradient-sums pass recomputing)."""
        stage = self.t_stages[k]
        r = self.t_runner(stage, s)
        self._log("TS" if norm is not None else "TG", k, s)
        ids = self._sub_ids(s)
        x = self._stage_input(k, s, prev, r, ids)
        stop = stage.stop if norm is None else min(stage.stop, norm + 1)
        with torch.no_grad():
            h = r.model.transform(x, ids.to(r.place), se, stage.start, stop)
            if norm is None or stop <= norm:
                return h
            r.model.norms[norm](h)  # a statistics pass: the norm sums the rows' moments
        return None

    def t_grad_sums(self, k: int, s: int, prev: Tensor | None, grad: Callable[[Runner], Tensor],
                    se: tuple[int, int], norm: int) -> Tensor | None:
        """Stage ``k``'s part in the gradient-sums pass of ``norms[norm]`` for subgraph ``s`` (a stage at or after
        the one applying the norm): recomputed from its input with autograd and backpropagated from its output's
        gradient ``grad(r)``, no parameter's gradient touched, to its input (returned) or, in the stage applying the
        norm (at the start of T task ``norm + 1``), to the norm, which sums ``Σ dy`` and ``Σ dy·x̂`` and stops."""
        stage = self.t_stages[k]
        r = self.t_runner(stage, s)
        self._log("TG", k, s)
        ids = self._sub_ids(s)
        rows = ids.to(r.place)
        x = self._stage_input(k, s, prev, r, ids)
        g = grad(r)
        with torch.enable_grad():
            if stage.start <= norm + 1 < stage.stop:
                with torch.no_grad():
                    h = r.model.transform(x, rows, se, stage.start, norm + 1)
                y = r.model.transform(h, rows, se, norm + 1, stage.stop)
                weight = r.model.norms[norm].weight  # the norm's node: the backward stops there
                assert isinstance(weight, Tensor)
                torch.autograd.grad(y, [weight], g, allow_unused=True)
                return None
            x = x.detach().requires_grad_(True)
            y = r.model.transform(x, rows, se, stage.start, stage.stop)
            (gx,) = torch.autograd.grad(y, [x], g)
        return gx  # type: ignore[no-any-return]

    # ------------------------------------------------------------------------------------------- P tasks
    def source(self, l: int, t_out: dict[int, Future[Any]], p_out: dict[tuple[int, int], Future[Any]]
               ) -> RowSource:
        """Where chunk ``j``'s ``H^l`` rows are: the last T stage's output (``l = 0``) or P task ``l - 1``'s."""
        return partial(self._source_rows, l, t_out, p_out)

    def _source_rows(self, l: int, t_out: dict[int, Future[Any]], p_out: dict[tuple[int, int], Future[Any]],
                     j: int) -> tuple[Tensor, Runner]:
        if l == 0:
            s = self.sub_of[j]
            off = self._offset[j]
            return t_out[s].result()[off : off + self.chunks[j].num_dst], self.t_runner(self.t_stages[-1], s)
        return p_out[(l - 1, j)].result(), self.p_runner(l - 1, j)

    def _rows(self, r: Runner, l: int, c: Chunk, source: RowSource) -> Tensor:
        """Chunk ``c``'s source rows of ``H^l`` on ``r``, from its cache (each chunk's rows fetched once; inside a
        hybrid P group, only the rows of chunk ``j`` that this device's chunks read)."""
        x = torch.zeros(c.block.num_src, self.width, device=r.place)
        for j, pos, off in c.sources:
            if self.skip and self.sub_of[j] > self.sub_of[c.k]:
                continue  # a later subgraph's rows: skipped this epoch (Algorithm 1)
            need = self._need.get((r.index, j))
            cached = r.cache.get((l, j))
            if cached is None:
                t, owner = source(j)
                if need is not None:  # a P group member takes only the rows its own chunks read
                    t = t.index_select(0, need.to(t.device))
                cached = r.cache[(l, j)] = r.receive(t, owner, "t2p" if l == 0 else "p2p")
            if need is not None:
                off = torch.searchsorted(need, off)
            x.index_copy_(0, pos.to(r.place), cached.index_select(0, off.to(r.place)))
        return x

    def p_forward(self, l: int, c: Chunk, source: RowSource, train: bool) -> Tensor:
        """P task ``l`` on chunk ``c``: ``[V, C]`` propagated rows; the last task also takes the chunk's loss share
        and posts its gradient (training), or returns the predicted classes (inference)."""
        r = self.p_runner(l, c.k)
        if "p_forward" in self.hooks:
            self.hooks["p_forward"](self.sub_of[c.k])
        self._log("PF", l, c.k)
        with torch.no_grad():
            block = self.epoch_block(r, c)
            x = self._rows(r, l, c, source)
            if self.dgat:
                if l == 0:
                    alpha = r.model.edge_weights(block, x)
                    assert alpha is not None
                    self._alpha_owner[c.k] = r
                else:
                    owner = self._alpha_owner[c.k]
                    alpha = r.receive(owner.alpha[c.k], owner, "p2p")
                r.alpha[c.k] = alpha
                block = weighted(block, alpha)
            out = block.adj() @ x  # [V, C]
        if l == self.L - 1:
            if not train:
                return out.argmax(dim=-1)
            logits = out.detach().requires_grad_(True)
            idx, y = c.train_local.to(r.place), c.y_train.to(r.place)
            with torch.enable_grad():
                loss = F.cross_entropy(logits.index_select(0, idx), y, reduction="sum") / self.num_train
                (g,) = torch.autograd.grad(loss, logits)
            self._post((l, c.k), None, g, r)
            with self._lock:
                self.losses.append(loss.detach())
        return out

    def _post(self, key: tuple[int, int], off: Tensor | None, g: Tensor, r: Runner) -> None:
        with self._lock:
            self._mailbox.setdefault(key, []).append((off, g, r))

    def take(self, key: tuple[int, int], rows: int, r: Runner) -> Tensor:
        """The summed gradient shares posted for ``key`` (a chunk's rows), on ``r``."""
        with self._lock:
            parts = self._mailbox.pop(key, [])
        g = torch.zeros(rows, self.width, device=r.place)
        for off, part, owner in parts:
            part = r.receive(part, owner, "p2p" if key[0] >= 0 else "p2t")
            if off is None:
                g += part
            else:
                g.index_add_(0, off.to(r.place), part)
        return g

    def p_backward(self, l: int, c: Chunk, source: RowSource, se: tuple[int, int]) -> None:
        """P task ``l``'s backward on chunk ``c``: the sources' shares of ``dL/dH^l`` posted to their chunks."""
        r = self.p_runner(l, c.k)
        self._log("PB", l, c.k)
        g = self.take((l, c.k), c.num_dst, r)  # dL/dH^{l+1} of the chunk's rows, complete
        block = self.epoch_block(r, c)
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

    def _attention_backward(self, r: Runner, c: Chunk, block: Block, se: tuple[int, int],
                            source: RowSource) -> Tensor:
        """dgat: the edge task recomputed with autograd from ``H^0`` and backpropagated with the attention weights'
        gradient summed over every P task: edge parameters' gradients, and the sources' shares of ``dL/dH^0``."""
        with self._lock:
            parts = self._mailbox.pop((-2, c.k), [])
        d_alpha = torch.zeros(block.num_edges, device=r.place)
        for _, part, owner in parts:
            d_alpha += r.receive(part, owner, "p2p")
        x = self._rows(r, 0, c, source).requires_grad_(True)
        with torch.enable_grad():
            alpha = r.model.edge_weights(self.epoch_block(r, c), x)
            assert alpha is not None
            (alpha * d_alpha).sum().backward()
        assert x.grad is not None
        return x.grad

    def _scatter(self, l: int, c: Chunk, gin: Tensor, r: Runner) -> None:
        """Post the source rows' gradient shares to the chunks owning them (``l = -1``: the T side's ``H^0``)."""
        for j, pos, off in c.sources:
            if self.skip and self.sub_of[j] > self.sub_of[c.k]:
                continue
            self._post((l, j), off, gin.index_select(0, pos.to(r.place)), r)
