"""NeutronTask's task-parallel engine: decoupled T and P tasks on different devices (NeutronTask §4-5).

The model is a :class:`~gnnscale.nn.decoupled.DecoupledGNN`: ``L`` vertex T tasks (an MLP), for dgat one edge
task, then ``L`` P tasks (propagations). :func:`~gnnscale.plan.taskparallel.plan_taskparallel` assigns them to
devices (one device; same-type tasks grouped; one task per device; hybrid groups) and cuts the vertex ids into
``M = S * k`` chunks. Every epoch the chunks are shuffled and every ``k`` form a subgraph (Algorithm 1, line 3).

Each device is driven by one thread (a :class:`~gnnscale.engines.taskparallel.runner.Runner`), which runs the
operations submitted to it in order; an operation first waits for the operations whose results it reads. This
module submits everything in one order that respects those dependencies, so no device waits for work queued behind
it; what each operation computes is :mod:`~gnnscale.engines.taskparallel.tasks`. Per epoch (Algorithm 2):

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

With ``--norm batch`` the T tasks' BatchNorms span every vertex, not a subgraph's: a statistics pass per norm before
step 1 and a gradient-sums pass per norm between steps 3's P and T backward, barriers over every subgraph
(:mod:`~gnnscale.engines.taskparallel.norm`), so the epoch is the in-memory engine's.

Dropout masks are keyed by (seed, epoch, layer, vertex id), so recomputation and the in-memory engine draw the same
masks. On the CPU every device thread counts the bytes it allocates (:class:`~gnnscale.plan.memory.LiveBytesCounter`):
``device_peak_bytes`` per device, measured, not modelled; on an accelerator (a GPU, the runtime's sim device) they
are the device's allocation peaks. Every device operation goes through :mod:`gnnscale.runtime` (in the row mover):
the host waits once per operation for its device's work stream, and nothing else waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnscale import progress
from gnnscale import runtime as rt
from gnnscale.config import ChunkOptions, TaskParallelOptions
from gnnscale.engines.core.base import Engine
from gnnscale.engines.core.chunks import Chunk, cut_chunks
from gnnscale.engines.core.disk_tier import host_plan, open_disk_tier, tier_metrics
from gnnscale.engines.core.replicas import Replicas
from gnnscale.engines.taskparallel.norm import NormPasses
from gnnscale.engines.taskparallel.runner import OPS, Runner
from gnnscale.engines.taskparallel.tasks import TaskOps
from gnnscale.errors import ConfigError
from gnnscale.graph.block import normalized_csr
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.decoupled import DecoupledGNN
from gnnscale.nn.stack import Stack
from gnnscale.partition.dedup import chunk_rows
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.fullgraph_time import predict_taskparallel
from gnnscale.plan.rates import Rates
from gnnscale.plan.taskparallel import TaskPlan, epoch_subgraphs, plan_taskparallel
from gnnscale.store.disk import host_cached
from gnnscale.store.features import FeatureSource
from gnnscale.units import format_bytes

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

QUEUE_DEPTH = 2
"""Subgraphs a T stage may run ahead of the stage it feeds."""


@dataclass
class _Submitted:
    """The futures of an epoch's operations."""

    t_forward: dict[tuple[int, int], Future[Any]] = field(default_factory=dict)
    """``(T stage, subgraph)``."""
    t_out: dict[int, Future[Any]] = field(default_factory=dict)
    """``subgraph -> H^0`` of its rows (the last T stage's output)."""
    p_out: dict[tuple[int, int], Future[Any]] = field(default_factory=dict)
    """``(P task, chunk) -> H^{l+1}`` of the chunk's rows."""
    p_backward: dict[tuple[int, int], Future[Any]] = field(default_factory=dict)
    t_backward: list[Future[Any]] = field(default_factory=list)
    """Each subgraph's first T stage backward (the last operation of its chain)."""


class TaskParallelEngine(Engine):
    """Decoupled T/P tasks over devices, pipelined over subgraphs (NeutronTask §4-5)."""

    name = "taskparallel"
    host_layer_copies = 2
    plan_kind = "tasks"
    mode = "full"
    trains_layered, trains_decoupled = False, True
    options = (ChunkOptions, TaskParallelOptions)
    also_reads = ("host_memory",)  # a converted directory's features read from disk, subgraph by subgraph

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: rt.Device, *,
                               model: Stack | None = None) -> list[str]:
        try:
            plan_taskparallel(graph, config, device)
        except ConfigError as exc:
            return [str(exc)]
        return []

    @classmethod
    def batch_norm_reason(cls, config: TrainConfig) -> str | None:
        """BatchNorm between the T tasks, its statistics and gradient sums over every subgraph (passes)."""
        del config
        return None

    @classmethod
    def estimate(cls, graph: Graph, config: TrainConfig, device: rt.Device, *, model: Stack | None = None) -> str:
        plan = plan_taskparallel(graph, config, device)
        return (f"{plan.n_t} T / {plan.n_p} P device(s) ({plan.regime}), {plan.subgraphs} subgraph(s) x "
                f"{plan.chunks_per_subgraph} chunk(s), about {format_bytes(max(plan.estimate))} on the busiest "
                "device")

    @classmethod
    def predict_epoch(cls, graph: Graph, config: TrainConfig, device: rt.Device, rates: Rates, *,
                      model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime | None:
        """NeutronTask's model on the planner's assignment (:func:`~gnnscale.plan.fullgraph_time.
        predict_taskparallel`)."""
        del cluster
        return predict_taskparallel(graph, config, device, rates, plan_taskparallel(graph, config, device),
                                    model=model)

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: rt.Device):
        super().__init__(graph, model, config, rt.torch_device(device))
        self.device = device  # type: ignore[assignment]  # a runtime device: the model is where its tensors are
        assert isinstance(model, DecoupledGNN)
        with progress.stage("plan", self.timings):
            self.plan: TaskPlan = plan_taskparallel(graph, config, device)
        self.dgat = model.kind == "dgat"
        self.L = model.num_t_tasks
        self._width = model.width
        devices = [rt.resolve_device(d) for d in config.devices] if config.devices else [device]
        self.replicas = Replicas(model, devices)
        self.runners = [Runner(i, d, self.replicas.models[i]) for i, d in enumerate(devices)]  # type: ignore[arg-type]
        assert graph.x is not None and graph.y is not None
        self.tier = open_disk_tier(graph, host_plan(graph, config, model), self.name)
        self.disk: FeatureSource | None = None
        """With the disk tier: the features as the runners read them (a host cache of the highest-degree rows in
        front of the directory's ``x.npy``); each subgraph's rows are read from it, never the whole matrix."""
        x: Tensor | FeatureSource
        if self.tier is not None:
            hottest = torch.sort(-graph.out_degree().double(), stable=True).indices
            x = self.disk = host_cached(self.tier.source, hottest, self.tier.cache_bytes)
        else:
            x = graph.x.float()
            if rt.needs_pinning(devices[0]):
                x = rt.pinned_empty(x.shape, dtype=x.dtype, device=devices[0]).copy_(x)
        self.y = graph.y
        self.masks = {m: getattr(graph, m) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.num_train = int(self.masks["train_mask"].sum())
        self.ptr = self.plan.chunk_ptr
        self.chunks = self._build_chunks(graph)
        self.t_stages, self.p_stages = self.plan.t_stages, self.plan.p_stages
        self.tasks = TaskOps(self.plan, self.runners, self.chunks, x, num_train=self.num_train, width=self._width,
                             dgat=self.dgat, num_layers=self.L)
        self.norms = NormPasses(self.tasks, self.runners, QUEUE_DEPTH)
        """BatchNorm's passes over the T tasks (inactive without ``--norm batch``)."""

    def _build_chunks(self, graph: Graph) -> list[Chunk]:
        """The chunks of the plan's edge-balanced cut, each knowing which chunks own its source rows."""
        indptr, indices, weight = normalized_csr(graph, self.model.adjacency)
        ptr = self.ptr
        bounds = list(zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True))
        chunks = cut_chunks(indptr, indices, weight, bounds, chunk_rows(indptr, indices, ptr),
                            train=self.masks["train_mask"], y=self.y,
                            transpose=not self.dgat and self.config.dependency == "exact")
        return [c.with_sources(ptr) for c in chunks]

    def _order(self, epoch: int) -> tuple[list[list[int]], list[int], list[int]]:
        """This epoch's subgraphs (``k`` shuffled chunks each), each chunk's subgraph and position in it."""
        return epoch_subgraphs(self.plan.num_chunks, self.plan.chunks_per_subgraph, self.config.seed, epoch)

    def subgraph_of_vertex(self, epoch: int) -> Tensor:
        """``[N]`` this epoch's subgraph of every vertex (``skip`` drops the edges ``u -> v`` with
        ``sub[u] > sub[v]``)."""
        _, sub_of, _ = self._order(epoch)
        sizes = self.ptr[1:] - self.ptr[:-1]
        return torch.repeat_interleave(torch.tensor(sub_of), sizes)

    # ------------------------------------------------------------------------------------------- forward
    def _forward(self, se: tuple[int, int] | None, train: bool) -> _Submitted:
        """Submit the T and P forward operations of the epoch."""
        ops = _Submitted()
        subs = self.tasks.subs
        if self.tasks.skip:  # a subgraph through every P task as soon as its T output is there
            for s in range(len(subs)):
                self._submit_t_forward(ops, s, se)
                for l in range(self.L):
                    for cidx in subs[s]:
                        before = [x for s2 in range(s + 1) for x in
                                  ([ops.t_out[s2]] if l == 0 else [ops.p_out[(l - 1, j)] for j in subs[s2]])]
                        self._submit_p_forward(ops, l, cidx, before, train)
        else:
            for s in range(len(subs)):
                self._submit_t_forward(ops, s, se)
            for l in range(self.L):
                deps = list(ops.t_out.values()) if l == 0 else [ops.p_out[(l - 1, j)]
                                                                for j in range(self.plan.num_chunks)]
                for members in subs:
                    for cidx in members:
                        self._submit_p_forward(ops, l, cidx, deps, train)
        return ops

    def _submit_t_forward(self, ops: _Submitted, s: int, se: tuple[int, int] | None) -> None:
        """Subgraph ``s`` through the T stages, each after the previous stage's output and at most
        :data:`QUEUE_DEPTH` subgraphs ahead of the next stage."""
        tf, K = ops.t_forward, len(self.t_stages)
        for k, stage in enumerate(self.t_stages):
            deps = [tf[(k - 1, s)]] if k else []
            if k + 1 < K and s >= QUEUE_DEPTH:
                deps.append(tf[(k + 1, s - QUEUE_DEPTH)])  # bounded queue between stages
            prev = tf[(k - 1, s)] if k else None
            tf[(k, s)] = self.tasks.t_runner(stage, s).submit(
                "TF", partial(self.tasks.t_forward, k, s, prev, se), deps)
        ops.t_out[s] = tf[(K - 1, s)]

    def _submit_p_forward(self, ops: _Submitted, l: int, cidx: int, deps: list[Future[Any]], train: bool) -> None:
        source = self.tasks.source(l, ops.t_out, ops.p_out)
        ops.p_out[(l, cidx)] = self.tasks.p_runner(l, cidx).submit(
            "PF", partial(self.tasks.p_forward, l, self.chunks[cidx], source, train), deps)

    # ------------------------------------------------------------------------------------------- backward
    def _backward(self, se: tuple[int, int], ops: _Submitted) -> list[Future[Any]]:
        """Submit the P and T backward operations of the epoch; returns their futures. With BatchNorm every P
        backward is done, then the gradient-sums passes, before any T backward is submitted."""
        subs, L = self.tasks.subs, self.L
        norms = self.norms.active
        if self.tasks.skip:  # subgraph by subgraph from the last: its T backward right after its P backward
            for s in range(len(subs) - 1, -1, -1):
                for l in range(L - 1, -1, -1):
                    for cidx in subs[s]:
                        self._submit_p_backward(ops, l, cidx, se)
                if not norms:
                    self._submit_t_backward(ops, s, se)
        else:
            for l in range(L - 1, -1, -1):
                for s in range(len(subs) - 1, -1, -1):
                    for cidx in subs[s]:
                        self._submit_p_backward(ops, l, cidx, se)
        if norms or not self.tasks.skip:
            if norms:
                self._wait(ops.p_backward.values())
                self.norms.gradient_sums(se)
            for s in range(len(subs) - 1, -1, -1):
                self._submit_t_backward(ops, s, se)
        return [*ops.p_backward.values(), *ops.t_backward]

    def _later(self, s: int) -> range:
        """The subgraphs whose gradients subgraph ``s``'s rows receive (``skip``: none before ``s``)."""
        return range(s, len(self.tasks.subs)) if self.tasks.skip else range(len(self.tasks.subs))

    def _submit_p_backward(self, ops: _Submitted, l: int, cidx: int, se: tuple[int, int]) -> None:
        subs = self.tasks.subs
        if l == self.L - 1:
            deps = [ops.p_out[(l, cidx)]]
        else:
            deps = [ops.p_backward[(l + 1, j)] for s2 in self._later(self.tasks.sub_of[cidx]) for j in subs[s2]]
        source = self.tasks.source(l, ops.t_out, ops.p_out)
        ops.p_backward[(l, cidx)] = self.tasks.p_runner(l, cidx).submit(
            "PB", partial(self.tasks.p_backward, l, self.chunks[cidx], source, se), deps)

    def _submit_t_backward(self, ops: _Submitted, s: int, se: tuple[int, int]) -> None:
        """Subgraph ``s``'s T stages recomputed (each keeping its input) and backpropagated, last stage first, once
        its rows' gradients are complete."""
        tasks, K = self.tasks, len(self.t_stages)
        ready = [ops.p_backward[(0, j)] for s2 in self._later(s) for j in tasks.subs[s2]]
        refwd: dict[int, Future[Any]] = {}
        for k in range(K - 1):
            prev = refwd.get(k - 1)
            refwd[k] = tasks.t_runner(self.t_stages[k], s).submit(
                "TR", partial(tasks.t_refwd, k, s, prev, se), [prev] if prev else [])
        last = tasks.t_runner(self.t_stages[-1], s)
        grad = partial(tasks.subgraph_grad, s)
        if K > 1:  # the last stage's input is the previous stage's recomputed output
            fut = last.submit("TB", partial(self._last_t_backward, s, refwd[K - 2], grad, se), [*ready, refwd[K - 2]])
        else:
            fut = last.submit("TB", partial(tasks.t_backward, 0, s, grad, se), ready)
        for k in range(K - 2, -1, -1):
            fut = tasks.t_runner(self.t_stages[k], s).submit(
                "TB", partial(tasks.t_backward, k, s, partial(self._output_grad, fut, k, s), se), [fut, refwd[k]])
        ops.t_backward.append(fut)

    def _last_t_backward(self, s: int, recomputed: Future[Any], grad: Callable[[Runner], Tensor],
                         se: tuple[int, int]) -> Tensor | None:
        K = len(self.t_stages)
        last = self.tasks.t_runner(self.t_stages[-1], s)
        last.saved[(K - 1, s)] = last.receive(recomputed.result(), self.tasks.t_runner(self.t_stages[K - 2], s), "t2t")
        return self.tasks.t_backward(K - 1, s, grad, se)

    def _output_grad(self, fut: Future[Any], k: int, s: int, r: Runner) -> Tensor:
        """Stage ``k``'s output gradient on ``r``: stage ``k + 1``'s input gradient (``fut``) handed over."""
        return r.receive(fut.result(), self.tasks.t_runner(self.t_stages[k + 1], s), "t2t")

    # ------------------------------------------------------------------------------------------- an epoch
    def _start(self, epoch: int, skip: bool) -> None:
        self.tasks.start(self._order(epoch), skip)
        self.norms.start()
        if self.disk is not None:
            self.disk.reset_stats()
        for r in self.runners:
            r.clear_epoch()
            r.busy = dict.fromkeys(OPS, 0.0)
            r.io.reset_counters()

    @staticmethod
    def _wait(futures: Iterable[Future[Any]]) -> None:
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.replicas.sync()
        self.norms.sync_buffers()
        se = (self.config.seed, epoch)
        self._start(epoch, self.config.dependency == "skip")
        for r in self.runners:
            r.start_epoch()
        t0 = time.perf_counter()
        try:
            if self.norms.active:
                self.norms.statistics(se)
            ops = self._forward(se, True)
            rest = self._backward(se, ops)
            self._wait([*ops.t_out.values(), *ops.p_out.values(), *rest])
            self.replicas.reduce()
            self.optimizer.step()
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            for r in self.runners:
                r.model.zero_grad(set_to_none=True)
            raise
        finally:
            self.norms.release()
            for r in self.runners:
                r.clear_epoch()
        wall = time.perf_counter() - t0
        return self._epoch_stats(wall)

    def _epoch_stats(self, wall: float) -> dict[str, Any]:
        moved: dict[str, int] = {}
        for r in self.runners:
            for kind, n in r.io.moved.items():
                moved[kind] = moved.get(kind, 0) + n
        h2d = {"h2d_row_bytes": moved.pop("row", 0), "h2d_topology_bytes": moved.pop("topology", 0)}
        stats: dict[str, Any] = {
            "loss": float(sum(float(x) for x in self.tasks.losses)), "subgraphs": len(self.tasks.subs),
            "chunks": self.plan.num_chunks, "devices": len(self.runners), "pipeline_wall_s": wall,
            "h2d_bytes": sum(h2d.values()), **h2d,
            "t_busy_s": sum(v for r in self.runners for op, v in r.busy.items() if op[0] == "T"),
            "p_busy_s": sum(v for r in self.runners for op, v in r.busy.items() if op[0] == "P"),
            "t_forward_s": sum(r.busy["TF"] for r in self.runners),
            "p_forward_s": sum(r.busy["PF"] for r in self.runners),
            **{f"{kind}_bytes": v for kind, v in sorted(moved.items())},
        }
        if self.disk is not None:
            stats.update(tier_metrics(self.disk.read_stats()))
        if self.norms.active:
            stats["norm_passes"] = self.norms.passes
            stats["norm_reduced_bytes"] = self.norms.reduced_bytes
        peaks = [p for p in (r.peak() for r in self.runners) if p is not None]
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
        self.norms.sync_buffers()
        self._start(0, False)
        try:
            ops = self._forward(None, False)
            self._wait([*ops.t_out.values(), *ops.p_out.values()])
            pred = torch.empty(self.graph.num_nodes, dtype=torch.int64)
            for c in self.chunks:
                pred[c.lo : c.hi] = rt.to_host(ops.p_out[(self.L - 1, c.k)].result(), blocking=True)
        finally:
            for r in self.runners:
                r.clear_epoch()
        return pred

    def describe(self) -> str:
        text = self.plan.describe(self.dgat) + f"; --dependency {self.config.dependency}"
        if self.norms.active:
            text += (f"; BatchNorm over every vertex: {len(self.norms.ids)} statistics and gradient-sums pass(es) "
                     "over the subgraphs an epoch")
        if self.plan.predicted:
            p = self.plan.predicted
            text += f"; Eq. 5-6 predict T {p['t_s']:.3g}s, P {p['p_s']:.3g}s per epoch"
        if self.tier is not None:
            text += f"; features read from {self.tier.source.path} by subgraph (a host cache in front)"
        return text

    def close(self) -> None:
        for r in self.runners:
            r.pool.shutdown(wait=True)
        if self.tier is not None:
            self.tier.close()


def format_peaks(peaks: list[int]) -> str:
    return ", ".join(format_bytes(p) for p in peaks)
