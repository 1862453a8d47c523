"""The disk tier (issue #29 item 2): positional reads of a converted directory's x.npy behind a bounded host cache,
and the mini-batch engine reading through it under --host-memory. Mechanisms are checked by counts, not times."""

from __future__ import annotations

import gc
import json
import os
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.cli import main
from gnnscale.engines import MiniBatchEngine
from gnnscale.graph import io, mapped
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.store import DeviceCache, FeatureSourceError, InMemorySource
from gnnscale.store.disk import DiskSource, Upcast, host_cached, hot_rows_fitting, mapped_npy, npy_layout
from gnnscale.units import parse_budget

CPU = torch.device("cpu")


@pytest.fixture
def table(tmp_path: Path) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((500, 12)).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


@pytest.mark.parametrize(("buffer_bytes", "threads"), [(1 << 20, 1), (48 * 7, 1), (48 * 7, 3)])
def test_disk_reads_equal_memory_and_read_each_distinct_row_once(table: tuple[Path, np.ndarray],
                                                                  buffer_bytes: int, threads: int) -> None:
    path, x = table
    disk, mem = DiskSource(path, buffer_bytes=buffer_bytes, threads=threads), InMemorySource(torch.from_numpy(x))
    ids = torch.randint(0, 500, (800,), generator=torch.Generator().manual_seed(1))  # many repeats
    assert torch.equal(disk.gather(ids), mem.gather(ids))
    distinct = torch.unique(ids).numel()
    st = disk.read_stats()
    assert st.rows["disk"] == distinct and st.bytes["disk"] == distinct * 12 * 4  # a repeated row is read once
    out = torch.empty(900, 12)
    assert torch.equal(disk.gather(ids, out=out), mem.gather(ids)) and disk.gather(ids, out=out).data_ptr() == \
        out.data_ptr()
    disk.close()


def test_adjacent_rows_are_one_read(table: tuple[Path, np.ndarray]) -> None:
    disk = DiskSource(table[0])
    disk.gather(torch.tensor([9, 3, 4, 5, 3, 10, 100]))  # runs 3-5, 9-10, 100
    assert disk.preads == 3


def test_host_cache_serves_hot_rows_without_disk_reads(table: tuple[Path, np.ndarray]) -> None:
    path, x = table
    ranked = torch.randperm(500, generator=torch.Generator().manual_seed(2))
    budget = 40 * (48 + 8)  # 40 rows and their ids
    src = host_cached(DiskSource(path), ranked, budget)
    assert isinstance(src, DeviceCache) and src.cache.num_rows == hot_rows_fitting(budget, 48) == 40
    assert src.read_stats().total_bytes == 0  # building it is not counted as reads
    hot = ranked[:40][torch.randint(0, 40, (100,))]
    assert torch.equal(src.gather(hot), torch.from_numpy(x)[hot])
    st = src.reset_stats()
    assert st.bytes["disk"] == 0 and st.rows["host-cache"] == 100  # a read that bypasses the cache fails here
    cold = ranked[40:60]
    assert torch.equal(src.gather(torch.cat([hot[:5], cold])), torch.from_numpy(x)[torch.cat([hot[:5], cold])])
    st = src.read_stats()
    assert st.rows["disk"] == 20 and st.rows["host-cache"] == 5


@pytest.mark.parametrize("budget", [0, 100, 56 * 17 + 55, 10**9])
def test_host_cache_never_holds_more_than_its_budget(table: tuple[Path, np.ndarray], budget: int) -> None:
    src = host_cached(DiskSource(table[0]), torch.arange(500), budget)
    held = 0
    if isinstance(src, DeviceCache):
        cache = src.cache
        held = cache.num_rows * cache.row_bytes + cache.num_rows * 8  # rows and their ids in the lookup
    assert held <= budget


def test_bad_files_are_one_line(tmp_path: Path, table: tuple[Path, np.ndarray]) -> None:
    with pytest.raises(FeatureSourceError, match="cannot read") as e:
        DiskSource(tmp_path / "gone.npy")
    assert "\n" not in str(e.value)
    np.save(tmp_path / "o.npy", np.array([[object()]], dtype=object), allow_pickle=True)
    with pytest.raises(FeatureSourceError, match="objects"):
        DiskSource(tmp_path / "o.npy")
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((3, 4), np.float32)))
    with pytest.raises(FeatureSourceError, match="Fortran"):
        DiskSource(tmp_path / "f.npy")
    # a file that shrinks (or whose directory is rewritten) while training reads it: one line, naming the file
    path, _ = table
    disk = DiskSource(path)
    os.truncate(path, npy_layout(path)[0] + 10 * 48)
    with pytest.raises(FeatureSourceError, match="short read") as e:
        disk.gather(torch.tensor([400]))
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_mapped_npy_finds_only_a_whole_memory_map(tmp_path: Path) -> None:
    """The registry of open_dir's maps (no /proc): the mapped tensor itself, and nothing else -- not a copy, a
    slice, a view, a tensor in memory, a numpy map made elsewhere, the tensor once written to, or once its file was
    replaced; an entry goes when its tensor is freed, and an entry whose referent is another tensor is ignored."""
    g0 = csbm(nodes=200, features=12, seed=4)
    io.save(g0, tmp_path / "g")
    path = (tmp_path / "g" / "x.npy").resolve()
    g = io.open_dir(tmp_path / "g")
    assert g.x is not None and g0.x is not None
    assert mapped_npy(g.x) == path
    assert mapped_npy(g.x.clone()) is None and mapped_npy(g.x[1:]) is None and mapped_npy(g.x[:, :6]) is None
    assert mapped_npy(g.x.view(200, 12)) is None and mapped_npy(g0.x) is None
    assert mapped_npy(torch.from_numpy(np.load(path, mmap_mode="c"))) is None  # a map open_dir did not make
    fake = torch.zeros(200, 12)  # an entry whose weak reference points elsewhere (a reused id) is not this tensor
    mapped._MAPPED[id(fake)] = (mapped._MAPPED[id(g.x)][0], weakref.ref(g.x), fake._version)
    assert mapped_npy(fake) is None
    del mapped._MAPPED[id(fake)]
    before = set(mapped._MAPPED)
    h = io.open_dir(tmp_path / "g")
    added = set(mapped._MAPPED) - before  # h's maps (other tests' freed tensors may leave meanwhile)
    assert h.x is not None and mapped_npy(h.x) == path and id(h.x) in added
    h.x[0, 0] += 1  # copy-on-write: its values are no longer the file's
    assert mapped_npy(h.x) is None
    del h
    gc.collect()
    assert not added & set(mapped._MAPPED)  # the freed tensors' entries are gone
    os.replace(tmp_path / "g" / "x.npy", tmp_path / "old.npy")  # the directory rewritten under the map
    np.save(tmp_path / "g" / "x.npy", np.load(tmp_path / "old.npy"))
    assert mapped_npy(g.x) is None


def test_bf16_directory_reads_bfloat16_rows_at_two_bytes(tmp_path: Path) -> None:
    assert main(["convert", "--dataset", "csbm:nodes=500,features=12,seed=4", "--feature-dtype", "bf16",
                 "--out", str(tmp_path / "b")]) == 0
    g = io.open_dir(tmp_path / "b")
    assert g.x is not None and g.x.dtype == torch.bfloat16
    path = mapped_npy(g.x)
    assert path == (tmp_path / "b" / "x.npy").resolve()
    disk = DiskSource(path, buffer_bytes=24 * 7)  # several passes
    assert disk.dtype == torch.bfloat16 and disk.row_bytes == 24
    ids = torch.randint(0, 500, (800,), generator=torch.Generator().manual_seed(1))
    got = disk.gather(ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), g.x[ids].view(torch.int16))
    distinct = torch.unique(ids).numel()
    assert disk.read_stats().bytes["disk"] == distinct * 12 * 2  # 2 bytes an element read
    # the host cache holds bf16 rows: twice the rows of float32 ones for the same budget
    budget = 40 * (48 + 8)
    ranked = torch.randperm(500, generator=torch.Generator().manual_seed(2))
    src = host_cached(DiskSource(path), ranked, budget)
    assert isinstance(src, DeviceCache) and src.cache.dtype == torch.bfloat16
    assert src.cache.num_rows == hot_rows_fitting(budget, 24) == 70 and hot_rows_fitting(budget, 48) == 40
    hot = ranked[:70]
    assert torch.equal(src.gather(hot).view(torch.int16), g.x[hot].view(torch.int16))
    assert src.read_stats().rows["host-cache"] == 70 and src.read_stats().bytes["disk"] == 0
    # the dtype is the directory's (meta.json), or given; a file that cannot hold it is one error
    assert DiskSource(path, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(FeatureSourceError, match="cannot be read as torch.float32"):
        DiskSource(path, dtype=torch.float32)
    np.save(tmp_path / "f.npy", np.ones((3, 4), np.float32))
    with pytest.raises(FeatureSourceError, match="cannot be read as torch.bfloat16"):
        DiskSource(tmp_path / "f.npy", dtype=torch.bfloat16)
    up = Upcast(DiskSource(path))  # cast after the read; the reads counted at their 2 bytes
    assert up.dtype == torch.float32 and torch.equal(up.gather(ids), g.x[ids].float())
    assert up.read_stats().bytes["disk"] == distinct * 24
    out = torch.empty(900, 12)
    assert up.gather(ids, out=out).data_ptr() == out.data_ptr() and torch.equal(out[:800], g.x[ids].float())


def _run(g_dir: Path, cache: str | None, devices: tuple[str, ...] | None = None) -> list[dict[str, float]]:
    """Two epochs of minibatch from ``g_dir``, in RAM (``cache`` None) or under the --host-memory that leaves
    about ``cache`` (less the model and vertex arrays) beside the working set and the read buffer."""
    g = io.open_dir(g_dir)
    cfg = TrainConfig(model="sage", layers=2, hidden=16, engine="minibatch", batch_size=64, fanouts=(5, 3),
                      epochs=2, devices=devices)
    if cache is not None:
        work = MiniBatchEngine.working_bytes(g, cfg, len(devices or (1,)))
        cfg = replace(cfg, host_memory=-(-(work + parse_budget(cache)) * 8 // 7))  # the read buffer: an eighth
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    eng = MiniBatchEngine(g, model, cfg, CPU)
    return [eng.train_epoch(e) for e in (1, 2)]


def test_minibatch_from_disk_trains_like_from_memory(tmp_path: Path) -> None:
    g = csbm(nodes=1500, features=32, avg_degree=8, seed=3)
    io.save(g, tmp_path / "g")
    plain, disk = _run(tmp_path / "g", None), _run(tmp_path / "g", "100KB")
    assert [r["loss"] for r in disk] == [r["loss"] for r in plain]  # keyed sampling: the same steps
    assert "disk_read_bytes" not in plain[0]  # without --host-memory nothing changes
    for r in disk:
        assert r["disk_read_bytes"] > 0 and r["host_cache_hits"] > 0 and r["host_cache_misses"] > 0
        assert r["disk_read_bytes"] == r["host_cache_misses"] * 32 * 4
        assert r["anon_rss_bytes"] is None or r["anon_rss_bytes"] > 0
    # two trainers share the disk tier (one buffer, serialised) and still train alike
    two = ("cpu", "cpu:1")
    alike = [r["loss"] for r in _run(tmp_path / "g", None, two)]
    assert [r["loss"] for r in _run(tmp_path / "g", "100KB", two)] == alike


def test_minibatch_from_a_bf16_directory_reads_half_the_bytes(tmp_path: Path) -> None:
    g = csbm(nodes=1500, features=32, avg_degree=8, seed=3)
    io.save(g, tmp_path / "f")
    io.save(g.with_feature_dtype(torch.bfloat16), tmp_path / "b")
    plain, disk = _run(tmp_path / "b", None), _run(tmp_path / "b", "100KB")
    assert [r["loss"] for r in disk] == [r["loss"] for r in plain]  # the bf16 rows from disk, upcast on the device
    full = _run(tmp_path / "f", "100KB")
    for r, f in zip(disk, full, strict=True):
        assert r["disk_read_bytes"] == r["host_cache_misses"] * 32 * 2 > 0  # 2 bytes an element read
        # the same 30 KB cache holds more bf16 rows: more hits, fewer misses, under half the bytes read
        assert r["host_cache_hits"] > f["host_cache_hits"] and r["disk_read_bytes"] < f["disk_read_bytes"] / 2


def test_cli_host_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    io.save(csbm(nodes=600, features=8, seed=1), tmp_path / "g")
    metrics = tmp_path / "m.jsonl"
    args = ["train", "--dataset", str(tmp_path / "g"), "--engine", "minibatch", "--fanouts", "4,3",
            "--batch-size", "50", "--hidden", "8", "--epochs", "1", "--quiet", "--metrics", str(metrics)]
    capsys.readouterr()
    assert main([*args, "--host-memory", "20KB"]) == 2  # below the model, vertex arrays, read buffer, batches
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the minibatch engine cannot train") and "--host-memory" in err[0]
    assert "give at least" in err[0]
    assert not metrics.exists()
    assert main([*args, "--host-memory", "310KB"]) == 0  # a cache of a few KB beside the batches
    rec = json.loads(metrics.read_text().splitlines()[0])
    assert rec["disk_read_bytes"] > 0 and "anon_rss_bytes" in rec
    assert TrainConfig(host_memory="32MB").host_memory == 32 * 10**6
    assert TrainConfig(host_memory="1").host_memory == 2**30  # a plain number is GiB, as --gpu-memory


@pytest.mark.parametrize("spec", ["csbm:nodes=300,features=8", "DIR:feature_dtype=bf16"])
def test_host_memory_without_a_disk_table_says_the_features_stay_in_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str) -> None:
    io.save(csbm(nodes=300, features=8, seed=1), tmp_path / "g")
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", spec.replace("DIR", str(tmp_path / "g")), "--engine", "minibatch",
                 "--epochs", "1", "--quiet", "--host-memory", "1MB", "--metrics", str(metrics)]) == 0
    err = capsys.readouterr().err
    assert "--host-memory: the features of" in err and "in host memory" in err
    assert "disk_read_bytes" not in json.loads(metrics.read_text().splitlines()[0])
