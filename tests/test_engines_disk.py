"""Every engine from disk through the one disk tier (issue #29 item 3): with ``--host-memory`` on a converted
directory, task-parallel, hybrid and distributed read the features of ``x.npy`` through a
:class:`~gnnscale.store.disk.DiskSource` (set up by :func:`gnnscale.engines.core.disk_tier.open_disk_tier`), train
exactly as from memory, and count what they read.

The mechanism checks: ``graph.x`` is a tensor that records every operation on it (:class:`Watched`), so a copy of
the whole matrix (``.float()``, an index, a pin) is seen, not inferred; the disk reads are spied on (each read's
physical runs never overlap: no row read twice in one read; no row of the host cache is ever read from disk: no read
bypasses the cache); a distributed rank's disk bytes are those of its own rows exactly.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

import gnnscale.engines.core.disk_tier as disk_tier
from gnnscale import TrainConfig
from gnnscale.engines import ENGINES
from gnnscale.graph import io
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.store.cache import DeviceCache
from gnnscale.store.disk import DiskSource
from gnnscale.store.partitioned import PartitionedFeatures
from gnnscale.store.sources import InMemorySource, ReorderedRows

CPU = torch.device("cpu")
BUDGET = "100KB"
"""--host-memory: a host cache of about 270 of the 1000 rows (128 bytes each), the rest read from disk."""
METADATA = {"shape", "dtype", "device", "dim", "ndim", "size", "numel", "element_size", "layout", "is_contiguous"}
"""What an engine may ask of ``graph.x`` when it reads from disk: nothing that reads the values."""


class Watched(torch.Tensor):
    """A view of the memory-mapped features that records the name of every operation on it."""

    seen: list[str] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        if name == "__get__":  # an attribute: its name (shape, dtype, data, ...)
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        cls.seen.append(name)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def gdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("engines_disk") / "g"
    io.save(csbm(nodes=1000, features=32, avg_degree=6, seed=5), out)
    return out


@pytest.fixture
def watched(gdir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``open(host_memory)``: the directory's graph with ``graph.x`` watched (the disk tier still finds its file)."""

    def open_graph() -> Any:
        g = io.open_dir(gdir)
        assert g.x is not None
        w = g.x.as_subclass(Watched)
        monkeypatch.setattr(disk_tier, "mapped_npy", lambda t: gdir / "x.npy" if t is w else None)
        g.x = w
        Watched.seen = []
        return g

    return open_graph


@pytest.fixture
def disk_reads(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, int]]]:
    """Every DiskSource read's physical runs ``(first row, rows)``, one list per read."""
    reads: list[list[tuple[int, int]]] = []
    gather, run = DiskSource._gather, DiskSource._read_run

    def spy_gather(self: DiskSource, ids: torch.Tensor, out: Any) -> Any:
        reads.append([])
        return gather(self, ids, out)

    def spy_run(self: DiskSource, view: Any, row: int, rows: int, at: int) -> None:
        reads[-1].append((row, rows))
        run(self, view, row, rows, at)

    monkeypatch.setattr(DiskSource, "_gather", spy_gather)
    monkeypatch.setattr(DiskSource, "_read_run", spy_run)
    return reads


def _engine(g: Any, engine: str, host_memory: str | None, **kw: Any) -> Any:
    cfg = TrainConfig(engine=engine, layers=2, hidden=16, seed=2, epochs=2, host_memory=host_memory, **kw)
    assert g.num_classes is not None
    net = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                      heads=cfg.heads, seed=cfg.seed)
    return ENGINES[engine](g, net, cfg, CPU)


def _rows_of(read: list[tuple[int, int]]) -> list[int]:
    return [r for row, n in read for r in range(row, row + n)]


def _check_reads(reads: list[list[tuple[int, int]]], cached: set[int]) -> set[int]:
    """No read reads a row twice, none reads a cached row; the rows read from disk."""
    seen: set[int] = set()
    for read in reads:
        rows = _rows_of(read)
        assert len(rows) == len(set(rows)), "a row read twice in one read"
        assert not cached & set(rows), "a row of the host cache read from disk"
        seen |= set(rows)
    return seen


def _cached_rows(source: Any) -> set[int]:
    assert isinstance(source, DeviceCache)
    return set(source.lookup.hot.tolist())  # type: ignore[attr-defined]


TP = {"model": "dgcn", "subgraphs": 2}
HY = {"model": "sage", "devices": ("cpu", "cpu:1"), "fanouts": (4, 3), "batch_size": 256, "drm": "off",
      "shares": (0.5, 0.5)}


@pytest.mark.parametrize("engine, kw", [("taskparallel", TP), ("hybrid", HY)])
def test_an_engine_from_disk_equals_its_ram_run(watched: Any, disk_reads: list[Any], engine: str,
                                                kw: dict[str, Any]) -> None:
    ram = _engine(watched(), engine, None, **kw)
    want = [ram.train_epoch(e) for e in (1, 2)]
    assert {"float", "index_select"} & set(Watched.seen)  # the watch sees a whole-matrix read (the RAM run's)
    disk_reads.clear()
    g = watched()
    eng = _engine(g, engine, BUDGET, **kw)
    got = [eng.train_epoch(e) for e in (1, 2)]
    assert set(Watched.seen) <= METADATA, sorted(set(Watched.seen) - METADATA)  # x.npy read by preadv only
    for a, b in zip(want, got, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["disk_read_bytes"] > 0 and b["host_cache_hits"] > 0 and b["anon_rss_bytes"] > 0
        assert b["disk_read_bytes"] == b["host_cache_misses"] * g.num_features * 4  # each distinct row once a read
    assert eng.evaluate() == ram.evaluate()
    chain = eng.disk if engine == "taskparallel" else eng.host_x
    cached = _cached_rows(chain)
    assert 0 < len(cached) < g.num_nodes
    read = _check_reads(disk_reads[1:], cached)  # the first read filled the cache
    assert read == set(range(g.num_nodes)) - cached  # every other row came from disk
    assert "x.npy" in eng.describe() or engine == "hybrid"


def test_taskparallel_reads_a_subgraph_s_rows_in_one_read(watched: Any, disk_reads: list[Any]) -> None:
    """An epoch's disk reads are the T tasks' subgraph reads: forward and the backward's re-read, one read per
    subgraph each, every read the subgraph's uncached rows."""
    eng = _engine(watched(), "taskparallel", BUDGET, **TP)
    disk_reads.clear()
    eng.train_epoch(1)
    cached = _cached_rows(eng.disk)
    subs = [set(eng.tasks._sub_ids(s).tolist()) - cached for s in range(len(eng.tasks.subs))]
    got = sorted(sorted(_rows_of(r)) for r in disk_reads)
    assert got == sorted(sorted(s) for s in subs * 2)


def test_the_note_when_the_features_are_not_a_directory(capsys: pytest.CaptureFixture[str]) -> None:
    g = csbm(nodes=200, features=8, avg_degree=4, seed=1)
    eng = _engine(g, "taskparallel", BUDGET, **TP)
    assert eng.tier is None and eng.disk is None
    err = capsys.readouterr().err
    assert "note: --host-memory" in err and "taskparallel keeps them in host memory" in err
    assert "disk_read_bytes" not in eng.train_epoch(1)


def test_reordered_rows_read_another_order_without_a_copy() -> None:
    x = torch.arange(20.0).view(10, 2)
    src = InMemorySource(x)
    perm = torch.tensor([3, 1, 4, 1, 5])
    rows = ReorderedRows(src, perm)
    assert rows.num_rows == 5 and rows.read_stats().total_rows == 0
    assert torch.equal(rows.gather(torch.tensor([4, 0, 2])), x[torch.tensor([5, 3, 4])])
    assert rows.read_stats().rows["host"] == 3  # counted once, by the source it reads
    assert torch.equal(ReorderedRows(src).gather(torch.tensor([9, 0])), x[torch.tensor([9, 0])])
    with pytest.raises(IndexError):
        ReorderedRows(src, torch.tensor([10]))


def test_a_partition_reads_its_rows_from_disk_once(gdir: Path) -> None:
    """A rank's part read through the disk tier: the bytes of its own rows exactly, never the file's."""
    g = io.open_dir(gdir)
    assert g.x is not None
    owner = torch.arange(g.num_nodes) % 4
    disk = DiskSource(gdir / "x.npy")
    part = PartitionedFeatures(disk, owner, 1)
    own = owner == 1
    assert disk.read_stats().bytes["disk"] == int(own.sum()) * 32 * 4 == part.nbytes
    assert part.rows_read == int(own.sum())
    assert torch.equal(part.rows, g.x[own])
    assert torch.equal(part.local(torch.tensor([1, 5, 997])), g.x[torch.tensor([1, 5, 997])])


# --------------------------------------------------------------------------------------------- distributed
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, gdir: str, out: str) -> None:
    """One rank: an epoch from memory, then one from disk with ``graph.x`` watched."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    kw = {"model": "sage", "fanouts": (4, 3), "batch_size": 100, "partition_method": "range",
          "plan_dir": str(Path(out) / "plans")}
    records = []
    for host_memory in (None, BUDGET):
        g = io.open_dir(gdir)
        if host_memory is not None:
            assert g.x is not None
            w = g.x.as_subclass(Watched)
            disk_tier.mapped_npy = lambda t, w=w: Path(gdir) / "x.npy" if t is w else None  # type: ignore
            g.x = w
            Watched.seen = []
        eng = _engine(g, "distributed", host_memory, **kw)
        read = eng.disk_read_bytes  # this rank's, at set-up
        records.append(eng.train_epoch(1))
        records[-1].update(own_bytes=eng.features.nbytes, rank_disk_read_bytes=read)
    eng.comm.close()  # the second engine joined the first one's process group
    records[-1]["seen"] = sorted(set(Watched.seen))
    torch.save(records, Path(out) / f"rank{rank}.pt")


def test_distributed_ranks_read_only_their_rows_from_disk(gdir: Path, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(2, _free_port(), str(gdir), str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    whole = 1000 * 32 * 4
    for ram, disk in ranks:
        assert disk["loss"] == pytest.approx(ram["loss"], rel=1e-5)
        assert set(disk["seen"]) <= METADATA, disk["seen"]
        assert disk["rank_disk_read_bytes"] == disk["own_bytes"] < whole  # this rank's rows, each once
        assert disk["disk_read_bytes"] == sum(disk["rank_feature_bytes"]) == whole  # the ranks' rows, summed
        assert max(disk["rank_feature_bytes"]) < whole and disk["anon_rss_bytes"] > 0
        assert "disk_read_bytes" not in ram
