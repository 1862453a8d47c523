"""Every feature read of an engine goes through a feature source (:mod:`gnnscale.store.features`), and the source's
read counters agree with the engine's metrics: the offload engine's layer-0 rows (gathered per chunk, staged into
the transition buffers, or read as a chunk's destination range), and the rows the distributed engine fetches
(:class:`~gnnscale.store.partitioned.FetchedRows`; the multi-rank checks are in ``tests/test_distributed.py``).
A source that refuses to read makes the engine fail: nothing reads the feature table around it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

import gnnscale.runtime as rt
from gnnscale import TrainConfig
from gnnscale.engines import OffloadEngine, TaskParallelEngine
from gnnscale.engines.core.mover import RowMover
from gnnscale.engines.offload.workers import Features
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.store import FeatureIndexError, FeatureSource, InMemorySource, MmapSource, PinnedHostSource
from gnnscale.store.partitioned import FetchedRows, PartitionedFeatures

CPU = torch.device("cpu")


def _graph(features: int) -> Graph:
    return csbm(nodes=240, features=features, avg_degree=6, classes=4, seed=3)


def _offload(g: Graph, device: rt.Device, **options: Any) -> OffloadEngine:
    cfg = TrainConfig(**{"model": "gat", "layers": 2, "hidden": 8, "heads": 2, "dropout": 0.5, "engine": "offload",
                         "partitions": 2, "chunks": 3, "seed": 1, **options})  # type: ignore[arg-type]
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return OffloadEngine(g, model, cfg, device)


DEVICES = {"cpu": lambda: CPU, "sim": lambda: rt.SimDevice(0, 1 << 26)}


@pytest.mark.parametrize("dedup", ["none", "full"])
@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_offload_gathers_every_feature_row_through_its_source(device: str, dedup: str) -> None:
    """GAT reads the features by chunk rows twice an epoch (layer 0's forward and its recomputation): the source
    counts exactly the rows and bytes of those passes (``rows_h2d`` per pass, the passes of the features'
    width), under its tier (``host`` on the CPU, ``pinned`` on an accelerator)."""
    g = _graph(12)
    eng = _offload(g, DEVICES[device](), dedup=dedup)
    tier = "host" if device == "cpu" else "pinned"
    assert all(isinstance(s, InMemorySource if device == "cpu" else PinnedHostSource) for s in eng.features.sources)
    for epoch in (1, 2):
        eng.features.reset_stats()
        rec = eng.train_epoch(epoch)
        read = eng.features.read_stats()
        widths = eng.sweep.pass_widths
        feature_passes = widths.count(g.num_features)
        assert feature_passes == 2 and len(widths) == 3 and len(set(widths)) == 2
        per_pass = rec["rows_h2d"] // len(widths)  # every pass moves the same rows (the same plan)
        assert per_pass * len(widths) == rec["rows_h2d"]
        assert dict(read.rows) == {tier: feature_passes * per_pass}
        assert read.bytes[tier] == feature_passes * per_pass * g.num_features * 4
        # the rows the engine reports moving include them: h2d_row_bytes = features + activations + labels
        assert rec["h2d_row_bytes"] >= read.bytes[tier]


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_offload_reads_a_projecting_layer_s_features_as_ranges_through_its_source(device: str) -> None:
    """GCN with more features than hidden units projects layer 0 first: the features are read as each chunk's
    destination range, once for the projection and once for its backward -- 2N rows an epoch, none by index."""
    g = _graph(24)
    eng = _offload(g, DEVICES[device](), model="gcn")
    assert 0 in eng.host.projecting
    eng.train_epoch(1)
    read = eng.features.reset_stats()
    assert read.total_rows == 2 * g.num_nodes and read.total_bytes == 2 * g.num_nodes * 24 * 4
    assert g.num_features not in eng.sweep.pass_widths  # no pass gathered feature rows by index


class Refusing(FeatureSource):
    """A wrapper over a source that refuses every read."""

    def __init__(self, inner: FeatureSource):
        super().__init__("refusing")
        self.inner = inner

    num_rows = property(lambda self: self.inner.num_rows)  # type: ignore[assignment]
    dim = property(lambda self: self.inner.dim)  # type: ignore[assignment]
    dtype = property(lambda self: self.inner.dtype)  # type: ignore[assignment]
    device = property(lambda self: self.inner.device)  # type: ignore[assignment]

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        raise RuntimeError("feature read refused")

    def gather_range(self, lo: int, hi: int) -> Tensor:
        raise RuntimeError("feature read refused")


@pytest.mark.parametrize(("model", "features", "dedup"),
                         [("gat", 12, "none"), ("gat", 12, "full"), ("gcn", 24, "none")])
@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_an_offload_engine_whose_feature_source_refuses_fails(device: str, model: str, features: int,
                                                              dedup: str) -> None:
    eng = _offload(_graph(features), DEVICES[device](), model=model, dedup=dedup)
    eng.host.x = Features(tuple(Refusing(s) for s in eng.features.sources))
    with pytest.raises(RuntimeError, match="feature read refused"):
        eng.train_epoch(1)


# ------------------------------------------------------------------------------------------------ the store parts
def test_a_range_read_is_one_copy_counted_like_a_gather(tmp_path: Any) -> None:
    x = torch.arange(40, dtype=torch.float32).view(10, 4)
    np.save(tmp_path / "x.npy", x.numpy())
    sim = rt.SimDevice(0, 1 << 20)
    sources = [InMemorySource(x), PinnedHostSource(x, sim), MmapSource(tmp_path / "x.npy")]
    for s in sources:
        got = s.gather_range(2, 5)
        if s.device is sim:
            rt.synchronize(sim)
        assert torch.equal(got, x[2:5]) and got.data_ptr() != x[2:5].data_ptr()  # a new tensor, not a view
        assert s.read_stats().rows[s.tier] == 3 and s.read_stats().bytes[s.tier] == 3 * 16
        with pytest.raises(FeatureIndexError):
            s.gather_range(8, 11)


def test_a_view_read_is_a_view_only_where_the_table_already_is(tmp_path: Any) -> None:
    """``view_range``: a CPU table read on the CPU is a view (no copy, the offload engine's destination slices on
    the CPU); a table read onto another device (the sim device) or a file is a copy; each is counted like a
    gather, and rows out of range are an error."""
    x = torch.arange(40, dtype=torch.float32).view(10, 4)
    np.save(tmp_path / "x.npy", x.numpy())
    sim = rt.SimDevice(0, 1 << 20)
    for s, view in [(InMemorySource(x), True), (PinnedHostSource(x, torch.device("cpu")), True),
                    (PinnedHostSource(x, sim), False), (MmapSource(tmp_path / "x.npy"), False)]:
        got = s.view_range(2, 5)
        if s.device is sim:
            rt.synchronize(sim)
        assert torch.equal(got, x[2:5]) and (got.data_ptr() == x[2:5].data_ptr()) == view, s
        assert s.read_stats().rows[s.tier] == 3 and s.read_stats().bytes[s.tier] == 3 * 16
        with pytest.raises(FeatureIndexError):
            s.view_range(8, 11)


def test_the_cpu_mover_reads_slices_in_place_and_counts_them() -> None:
    """On the CPU a chunk's destination rows are views of the host rows (nothing copied: the host is the device),
    counted as row bytes all the same; on a sim device they are copies."""
    host = torch.randn(100, 8)
    cpu, sim = RowMover(torch.device("cpu")), RowMover(rt.SimDevice(0, 1 << 20))
    part = cpu.slice(host, 10, 30)
    assert part.data_ptr() == host[10].data_ptr() and cpu.moved == {"row": 20 * 8 * 4}
    src = cpu.source(host)
    assert src.view_range(0, 5).data_ptr() == host.data_ptr()
    copied = sim.slice(host, 10, 30)
    rt.synchronize(sim.device)
    assert copied.data_ptr() != host[10].data_ptr() and torch.equal(copied, host[10:30])
    assert sim.moved == {"row": 20 * 8 * 4}


class _TwoRanks:
    """An exchange between two parts in one process: the peer serves the rows it owns."""

    def __init__(self) -> None:
        self.peer: PartitionedFeatures | None = None
        self.calls = 0

    def exchange(self, ids: Tensor, owner: Tensor, serve: Any, width: int, dtype: torch.dtype,
                 what: str = "") -> Tensor:
        self.calls += 1
        assert self.peer is not None and bool((owner[ids] == self.peer.rank).all())
        return self.peer.local(ids).to(dtype).reshape(-1, width)


def test_fetched_rows_serve_own_and_fetched_rows_counted_per_tier() -> None:
    x = torch.randn(12, 3)
    owner = torch.tensor([0, 1] * 6)
    ex = _TwoRanks()
    part = PartitionedFeatures(x, owner, 0, exchange=ex)
    ex.peer = PartitionedFeatures(x, owner, 1)
    ids = torch.tensor([5, 0, 3, 2, 5, 7])
    fetched = part.fetch(ids)
    assert ex.calls == 1 and part.read_stats().rows["remote"] == 3  # 3, 5, 7: each distinct one once
    got = fetched.gather(torch.tensor([7, 2, 5]))
    assert torch.equal(got, x[[7, 2, 5]]) and ex.calls == 1  # no exchange of its own
    assert dict(fetched.read_stats().rows) == {"local": 1, "fetched": 2}
    with pytest.raises(FeatureIndexError, match="not fetched"):
        fetched.gather(torch.tensor([9]))
    activations = torch.randn(6, 2)  # a layer's rows of the rank's own vertices, in part.own order
    other = FetchedRows(part, torch.tensor([1, 3]), torch.randn(2, 2), own=activations)
    assert torch.equal(other.gather(torch.tensor([4]))[0], activations[2])  # vertex 4 is the third own vertex
    # the gather path: the same exchange inside the read, the rows counted as served
    before = part.read_stats()
    assert torch.equal(part.gather(ids), x[ids]) and ex.calls == 2
    assert dict((part.read_stats() - before).rows) == {"local": 2, "remote": 4}


def _taskparallel(g: Graph, devices: tuple[str, ...]) -> TaskParallelEngine:
    cfg = TrainConfig(model="dgcn", layers=2, hidden=8, engine="taskparallel", devices=devices, subgraphs=2, seed=1)
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return TaskParallelEngine(g, model, cfg, CPU)


def test_taskparallel_reads_every_feature_row_through_its_runners_sources() -> None:
    """The T tasks' first stage reads the features (forward, recomputation and backward) only through each
    runner's source: the sources count exactly the feature rows the engine reports moving host -> device."""
    g = _graph(12)
    eng = _taskparallel(g, ("cpu", "cpu"))
    sources = list(eng.tasks.features.values())
    assert len(sources) == 2 and all(isinstance(s, InMemorySource) for s in sources)
    for epoch in (1, 2):
        for s in sources:
            s.reset_stats()
        rec = eng.train_epoch(epoch)
        read = sum(s.read_stats().total_bytes for s in sources)
        assert read > 0 and read % (g.num_features * 4) == 0
        assert read == rec["h2d_row_bytes"]


def test_a_taskparallel_engine_whose_feature_source_refuses_fails() -> None:
    eng = _taskparallel(_graph(12), ("cpu", "cpu"))
    eng.tasks.features = {k: Refusing(s) for k, s in eng.tasks.features.items()}
    with pytest.raises(RuntimeError, match="feature read refused"):
        eng.train_epoch(1)
