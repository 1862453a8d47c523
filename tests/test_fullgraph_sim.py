"""The full-graph engines (offload, task-parallel) on the runtime's sim device: an accelerator simulated on the CPU
whose asynchronous copies read as NaN until they are waited for, whose memory is a bounded pool, and which
raises StreamOrderError when a stream touches memory another stream may still use (docs/runtime.md).

Every run trains two epochs and equals the in-memory reference on the CPU (losses, gradients, weights and
accuracies, within the tolerances of the CPU equivalence tests), with no NaN anywhere; the syncs and waits per
epoch are what the engines promise (engines/core/mover.py: two waits per chunk and one host sync per pass and per
accumulation into host memory for offload, one host sync per operation for taskparallel, none on the CPU); the
pools bound what the engines allocate. Removing any wait of the mover or the engines makes one of these tests
fail, and so does a copy into a buffer the compute stream still reads (the last tests show both on purpose).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import pytest
import torch
from torch import Tensor

import gnnscale.runtime as rt
from gnnscale import TrainConfig
from gnnscale.engines import InMemoryEngine, OffloadEngine, TaskParallelEngine
from gnnscale.engines.core.mover import RowMover
from gnnscale.engines.taskparallel.runner import Runner
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block, normalized_csr
from gnnscale.graph.csr import csr_rows
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.plan.offload import plan_offload
from gnnscale.store import FeatureSource

CPU = torch.device("cpu")
T = TypeVar("T")


@pytest.fixture(scope="module")
def graph() -> Graph:
    return csbm(nodes=300, features=12, avg_degree=6, classes=4, seed=3)


def _model(g: Graph, cfg: TrainConfig) -> Any:
    assert g.num_classes is not None
    return build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                       heads=cfg.heads, seed=cfg.seed)


def _assert_same(ref: torch.nn.Module, eng: torch.nn.Module, a: float, b: float, what: str) -> None:
    """Equal losses (1e-5 relative) and gradients (1e-4 of the largest), everything finite."""
    assert abs(a - b) <= 1e-5 * abs(a), f"{what}: loss {a} vs {b}"
    for (name, p), q in zip(ref.named_parameters(), eng.parameters(), strict=True):
        assert q.grad is not None and bool(torch.isfinite(q.grad).all()) and bool(torch.isfinite(q).all()), name
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        diff = float((g - q.grad).abs().max())
        assert diff <= 1e-4 * max(1.0, float(g.abs().max())), f"{what} {name}: grad diff {diff}"


def _assert_same_weights(ref: torch.nn.Module, eng: torch.nn.Module) -> None:
    for (name, p), q in zip(ref.named_parameters(), eng.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), name


class _Spy:
    """What each row mover did in an epoch: chunks handed out, passes (barriers), accumulations into host
    memory, operations run (task-parallel)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.counts: dict[str, Counter[str]] = {}
        prefetched, barrier, accumulate, run = RowMover.prefetched, RowMover.barrier, RowMover.accumulate, Runner._run
        spy = self

        def prefetched_(io: RowMover, load: Callable[[int], T], count: int) -> Iterator[T]:
            for item in prefetched(io, load, count):
                spy.of(io.device)["steps"] += 1
                yield item

        def barrier_(io: RowMover, raise_errors: bool = True) -> None:
            spy.of(io.device)["passes"] += 1
            barrier(io, raise_errors)

        def accumulate_(io: RowMover, host: Tensor, rows: Tensor, value: Tensor) -> None:
            spy.of(io.device)["accumulations"] += 1
            accumulate(io, host, rows, value)

        def run_(r: Runner, kind: str, fn: Callable[[], T], deps: list[Any]) -> T:
            spy.of(r.device)["operations"] += 1
            return run(r, kind, fn, deps)

        monkeypatch.setattr(RowMover, "prefetched", prefetched_)
        monkeypatch.setattr(RowMover, "barrier", barrier_)
        monkeypatch.setattr(RowMover, "accumulate", accumulate_)
        monkeypatch.setattr(Runner, "_run", run_)

    def of(self, device: rt.Device) -> Counter[str]:
        return self.counts.setdefault(str(device), Counter())

    def reset(self) -> None:
        self.counts.clear()
        rt.reset_counts()


# ------------------------------------------------------------------------------------------------ offload
OFFLOAD = dict(hidden=16, heads=2, dropout=0.5, engine="offload", partitions=2, chunks=3, seed=1, layers=2)


def _offload_run(g: Graph, cfg: TrainConfig, device: rt.Device, spy: _Spy | None = None) -> OffloadEngine:
    """Two epochs of the offload engine on ``device`` against the in-memory engine on the CPU; with a spy, the
    syncs and waits of each epoch against the engine's promise. Returns the engine."""
    ref = InMemoryEngine(g, _model(g, cfg), cfg, CPU)
    eng = OffloadEngine(g, _model(g, cfg), cfg, device)
    for epoch in (1, 2):
        a = ref.train_epoch(epoch)["loss"]
        if spy is not None:
            spy.reset()
        stats = eng.train_epoch(epoch)
        _assert_same(ref.model, eng.model, a, stats["loss"], f"epoch {epoch}")
        if spy is not None:
            _assert_offload_counts(eng, spy)
        assert 0 < stats["peak_device_bytes"] <= max(rt.mem_get_info(w.device)[1] for w in eng.workers)
    _assert_same_weights(ref.model, eng.model)
    assert ref.evaluate() == eng.evaluate()
    return eng


def _assert_offload_counts(eng: OffloadEngine, spy: _Spy) -> None:
    """Per device and pass: each chunk handed out after two stream waits (the copy stream for the compute
    stream, the compute stream for the chunk's loads); the host waits once per pass (the barrier) and once per
    accumulation into host memory (the adding thread, for the copy's event); nothing else waits."""
    for w in eng.workers:
        seen = spy.of(w.device)
        passes, steps = seen["passes"], seen["steps"]
        # forward and backward of every layer but the last, the fused loss (and projections): each pass every chunk
        assert passes >= 2 * len(eng.model.layers) - 1 and steps == passes * len(eng.sweep.sequence[w.index])
        assert rt.wait_count(w.device) == 2 * steps, (str(w.device), rt.wait_count(w.device), steps)
        assert rt.sync_count(w.device) == passes + seen["accumulations"], (str(w.device), seen)


@pytest.mark.parametrize(("model", "dedup"), [("gcn", "full"), ("gat", "full"), ("sage", "none"), ("gcn", "reuse")])
def test_offload_on_a_sim_device_equals_the_reference(graph: Graph, sims: list[rt.SimDevice], model: str,
                                                      dedup: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several chunks of two partitions on one sim device, prefetched; GCN caches layer 0 and projects the last
    layer, GAT recomputes, SAGE reads its destinations' rows; transition buffers (full, reuse) or per-chunk
    gathers (none)."""
    cfg = TrainConfig(**{**OFFLOAD, "model": model, "dedup": dedup})  # type: ignore[arg-type]
    spy = _Spy(monkeypatch)
    dev = rt.SimDevice(0, 1 << 26)
    _offload_run(graph, cfg, dev, spy)
    assert dev.copies_issued > 0 and dev.copies_completed == dev.copies_issued  # every copy really deferred, then run


def test_offload_on_two_sim_devices_equals_the_reference(graph: Graph, sims: list[rt.SimDevice],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two partitions on two sim devices (one worker thread each): chunks assemble rows from both devices'
    transition buffers and push gradients into both."""
    cfg = TrainConfig(**{**OFFLOAD, "devices": ("sim:0", "sim:1")})  # type: ignore[arg-type]
    spy = _Spy(monkeypatch)
    eng = _offload_run(graph, cfg, sims[0], spy)
    assert [w.device for w in eng.workers] == sims[:2]
    stats: dict[str, Any] = eng.train_epoch(3)
    assert stats["rows_d2d"] > 0 and len(stats["device_peak_bytes"]) == 2


def test_offload_on_the_cpu_counts_no_sync_and_no_wait(graph: Graph) -> None:
    """The CPU path is synchronous: no stream, no event, no host sync counted."""
    eng = OffloadEngine(graph, _model(graph, TrainConfig(**OFFLOAD)), TrainConfig(**OFFLOAD), CPU)  # type: ignore[arg-type]
    rt.reset_counts()
    eng.train_epoch(1)
    assert rt.sync_count(CPU) == 0 and rt.wait_count(CPU) == 0


def test_offload_fits_the_pool_its_planner_sized(graph: Graph) -> None:
    """A sim pool of the planner's estimate for 4 chunks per partition: the engine plans against the pool's free
    memory and trains without going over it; its counted peak is the pool's."""
    for model in ("gcn", "gat"):
        cfg = TrainConfig(**{**OFFLOAD, "model": model, "chunks": 4, "memory_budget": 1 << 40})  # type: ignore[arg-type]
        capacity = plan_offload(graph, cfg, CPU).estimate
        dev = rt.SimDevice(0, capacity)
        eng = OffloadEngine(graph, _model(graph, cfg), replace(cfg, chunks=None, memory_budget=None), dev)
        assert eng.plan.budget == capacity
        for epoch in (1, 2):
            stats = eng.train_epoch(epoch)
            assert 0 < stats["peak_device_bytes"] == dev.pool.peak <= capacity


def test_offload_over_the_pool_raises_a_clear_error(graph: Graph) -> None:
    """A pool the planner cannot fit: its error names the minimum. A budget the pool does not have (a wrong
    --gpu-memory): the device's out-of-memory error, in one line."""
    tiny = rt.SimDevice(0, 4 << 10)
    cfg = TrainConfig(**{**OFFLOAD, "chunks": None})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs at least"):
        OffloadEngine(graph, _model(graph, cfg), cfg, tiny)
    lying = replace(cfg, memory_budget=1 << 30)
    eng = OffloadEngine(graph, _model(graph, lying), lying, tiny)
    with pytest.raises(rt.DeviceOutOfMemory, match="out of memory on sim:0"):
        eng.train_epoch(1)


# ------------------------------------------------------------------------------------------------ task-parallel
def _masked_block(g: Graph, model: Any, sub: Tensor) -> Block:
    """The whole graph's normalised block without the edges ``u -> v`` whose ``sub[u] > sub[v]`` (skip mode)."""
    indptr, indices, weight = normalized_csr(g, model.adjacency)
    dst = csr_rows(indptr, indices.numel())
    keep = sub[indices] <= sub[dst]
    counts = torch.zeros(g.num_nodes, dtype=torch.int64).index_add_(0, dst[keep], torch.ones_like(dst[keep]))
    ptr = torch.zeros(g.num_nodes + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=ptr[1:])
    return Block(indptr=ptr, indices=indices[keep], num_src=g.num_nodes,
                 edge_weight=None if weight is None else weight[keep])


def _taskparallel_run(g: Graph, cfg: TrainConfig, device: rt.Device, spy: _Spy) -> TaskParallelEngine:
    """Two epochs against the in-memory engine on the CPU (``skip``: on each epoch's masked adjacency), with the
    syncs per epoch: one per operation a device runs, and no stream wait."""
    ref = InMemoryEngine(g, _model(g, cfg), cfg, CPU)
    eng = TaskParallelEngine(g, _model(g, cfg), cfg, device)
    full = ref.block
    for epoch in (1, 2):
        if cfg.dependency == "skip":
            ref.block = _masked_block(g, ref.model, eng.subgraph_of_vertex(epoch))
        a = ref.train_epoch(epoch)["loss"]
        spy.reset()
        stats: dict[str, Any] = eng.train_epoch(epoch)
        _assert_same(ref.model, eng.model, a, stats["loss"], f"epoch {epoch}")
        for r in eng.runners:
            ops = spy.of(r.device)["operations"]
            assert ops > 0 and rt.sync_count(r.device) == ops and rt.wait_count(r.device) == 0, (str(r.device), ops)
        assert len(stats["device_peak_bytes"]) == len(eng.runners) and min(stats["device_peak_bytes"]) > 0
        assert stats["h2d_bytes"] == stats["h2d_row_bytes"] + stats["h2d_topology_bytes"]
    _assert_same_weights(ref.model, eng.model)
    ref.block = full
    assert ref.evaluate() == eng.evaluate()
    return eng


@pytest.mark.parametrize("dependency", ["exact", "skip"])
@pytest.mark.parametrize(("kind", "devices"), [("dgcn", 3), ("dgat", 2)])
def test_taskparallel_on_sim_devices_equals_the_reference(graph: Graph, sims: list[rt.SimDevice], kind: str,
                                                          devices: int, dependency: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """T and P tasks on 2-3 sim devices: features and blocks copied to the devices, rows, gradients and dgat's
    attention weights handed between them on their work streams."""
    names = tuple(f"sim:{i}" for i in range(devices))
    cfg = TrainConfig(model=kind, layers=2, hidden=16, dropout=0.5, engine="taskparallel", devices=names,
                      subgraphs=3, dependency=dependency)
    eng = _taskparallel_run(graph, cfg, sims[0], _Spy(monkeypatch))
    assert [r.device for r in eng.runners] == sims[:devices]
    moved = eng.train_epoch(3)
    assert moved["t2p_bytes"] > 0 and moved["h2d_row_bytes"] > 0


def test_taskparallel_over_the_pool_raises_a_clear_error(graph: Graph, sims: list[rt.SimDevice]) -> None:
    """A pool the planner cannot fit: its error names the minimum per device. A budget the pool does not have:
    the device's out-of-memory error."""
    cfg = TrainConfig(model="dgcn", layers=2, hidden=16, engine="taskparallel", devices=("sim:0", "sim:1"))
    capacity = sims[1].capacity
    sims[1].pool.resize(max(sims[1].pool.used, 8 << 10))
    try:
        with pytest.raises(ConfigError, match="needs at least"):
            TaskParallelEngine(graph, _model(graph, cfg), cfg, sims[1])
        lying = replace(cfg, memory_budget=1 << 30)
        eng = TaskParallelEngine(graph, _model(graph, lying), lying, sims[0])
        with pytest.raises(rt.DeviceOutOfMemory, match="out of memory on sim:1"):
            eng.train_epoch(1)
    finally:
        sims[1].pool.resize(capacity)


# ------------------------------------------------------------------------------------------------ mistakes caught
@pytest.mark.parametrize("removed", ["wait_event", "event_sync", "device_sync"])
def test_a_missing_wait_of_the_offload_engine_fails(graph: Graph, removed: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the compute stream's wait for a chunk's loads, the host's wait for an accumulation's copy, or the
    host's wait for the device after a pass, the epoch raises StreamOrderError or reads NaN."""
    synchronize = rt.synchronize
    if removed == "wait_event":
        monkeypatch.setattr(rt, "wait_event", lambda event, stream: None)
    else:
        skipped = rt.SimEvent if removed == "event_sync" else rt.SimDevice
        monkeypatch.setattr(rt, "synchronize", lambda t: None if isinstance(t, skipped) else synchronize(t))
    cfg = TrainConfig(**OFFLOAD)  # type: ignore[arg-type]
    eng = OffloadEngine(graph, _model(graph, cfg), cfg, rt.SimDevice(0, 1 << 26))
    with pytest.raises((rt.StreamOrderError, AssertionError), match="has not waited|NaN in the loss or the weights"):
        for epoch in (1, 2):
            loss = eng.train_epoch(epoch)["loss"]
            finite = math.isfinite(loss) and all(bool(torch.isfinite(p).all()) for p in eng.model.parameters())
            assert finite, "NaN in the loss or the weights"


def _reusing_rows(num_rows: int) -> Callable[..., Tensor]:
    """A mutant ``RowMover.rows``: each gather lands in one of two device buffers of ``num_rows`` rows per mover
    and row width, reused in turn (a double buffer), so a load refills the buffer chunk ``k - 1`` was computed
    from."""
    rings: dict[tuple[int, int], list[Tensor]] = {}
    turn = Counter[tuple[int, int]]()

    def rows(io: RowMover, host: Tensor | FeatureSource, ids: Tensor, rows_dev: Tensor | None = None,
             kind: str = "row") -> Tensor:
        R, F = ids.numel(), (host.dim if isinstance(host, FeatureSource) else host.shape[1])
        io.count(kind, R * F * 4)
        key = (id(io), F)
        if key not in rings:
            rings[key] = [rt.empty((num_rows, F), device=io.device) for _ in range(2)]
        out = rings[key][turn[key] % 2][:R]
        turn[key] += 1
        # the features are read through their source (on the sim device: onto the device), the rest by index
        got = host.gather_unchecked(ids) if isinstance(host, FeatureSource) else host.index_select(0, ids)
        return rt.copy_async(out, got)  # on the copy stream: the mover issues loads there

    return rows


@pytest.mark.parametrize("wait", [True, False])
def test_a_copy_into_a_buffer_the_compute_stream_still_reads_fails(graph: Graph, wait: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With loads into reused buffers, the copy stream's wait for the compute stream (RowMover._issue) is what
    keeps chunk ``k + 1``'s rows from overwriting the buffer chunk ``k - 1`` was read from: with it the epoch
    equals the reference, without it the copy raises StreamOrderError."""
    monkeypatch.setattr(RowMover, "rows", _reusing_rows(graph.num_nodes))
    if not wait:
        monkeypatch.setattr(rt, "wait_stream", lambda stream, other: None)
    cfg = TrainConfig(**{**OFFLOAD, "dedup": "none"})  # type: ignore[arg-type]
    if wait:
        _offload_run(graph, cfg, rt.SimDevice(0, 1 << 26))
        return
    eng = OffloadEngine(graph, _model(graph, cfg), cfg, rt.SimDevice(0, 1 << 26))
    with pytest.raises(rt.StreamOrderError, match="may still read"):
        eng.train_epoch(1)


def test_a_missing_host_sync_of_a_task_runner_fails(graph: Graph, sims: list[rt.SimDevice],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the host's wait for a runner's work stream after each operation (``RowMover.run``), another device's
    runner reads a result that stream is still writing: StreamOrderError (the sim device marks an op's result as
    written by its stream), not only a wrong sync count."""
    cfg = TrainConfig(model="dgcn", layers=2, hidden=16, engine="taskparallel", devices=("sim:0", "sim:1"),
                      subgraphs=3)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, sims[0])
    work = {id(r.io.work_stream) for r in eng.runners}
    synchronize = rt.synchronize
    monkeypatch.setattr(rt, "synchronize", lambda t: None if id(t) in work else synchronize(t))
    try:
        with pytest.raises(rt.StreamOrderError, match="has not waited"):
            eng.train_epoch(1)
    finally:
        eng.close()
