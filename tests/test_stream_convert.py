"""Streaming convert (issue #29 item 1): ``gnnscale convert --dataset kronecker:...`` writes the directory block by
block: byte for byte the in-memory convert's, blocks bounded by --host-memory, nothing left behind on failure."""

from __future__ import annotations

import filecmp
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gnnscale.cli import main
from gnnscale.errors import DatasetError
from gnnscale.graph import io, stream
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import kronecker_edge_block


def _same_dirs(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), name


def _small_blocks(monkeypatch: pytest.MonkeyPatch, edges: int, buckets: int, rows: int) -> None:
    monkeypatch.setattr(stream, "plan_blocks", lambda *a: stream.Blocks(edges=edges, buckets=buckets, rows=rows))


@pytest.mark.parametrize(("spec", "dtype", "seed"), [("kronecker:scale=10,features=8", None, 0),
                                                     ("kronecker:scale=11,features=5,edgefactor=4,seed=3", "bf16", 1),
                                                     ("kronecker:scale=9,classes=3,feature_dtype=bf16", None, 2)])
def test_streamed_directory_equals_the_in_memory_convert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str,
                                                         dtype: str | None, seed: int) -> None:
    io.save(load_dataset(spec, seed=seed, feature_dtype=dtype), tmp_path / "mem")
    _small_blocks(monkeypatch, edges=1000, buckets=7, rows=100)  # many blocks, ragged last ones
    w = stream.convert(spec, tmp_path / "stream", host_memory=1 << 30, seed=seed, feature_dtype=dtype)
    _same_dirs(tmp_path / "mem", tmp_path / "stream")
    g = io.open_dir(tmp_path / "stream")
    assert (w.nodes, w.edges, w.nbytes) == (g.num_nodes, g.num_edges, g.nbytes()["total"])
    assert g.meta["made_up"] == ["features", "labels"]


def test_edge_blocks_are_the_generators_numbers() -> None:
    start = np.random.default_rng(5).bit_generator
    whole = kronecker_edge_block(start, 8, 4096, 0, 4096)
    parts = [kronecker_edge_block(start, 8, 4096, lo, min(4096, lo + 1000)) for lo in range(0, 4096, 1000)]
    for i in (0, 1):
        np.testing.assert_array_equal(whole[i], np.concatenate([p[i] for p in parts]))


def test_no_block_exceeds_the_planned_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count, not time: every array the writer materialises passes through _materialised; with small blocks the
    largest is bounded by the blocks, far below the graph's edge arrays."""
    seen: list[int] = []

    def record(arr: np.ndarray) -> np.ndarray:
        seen.append(arr.nbytes)
        return arr

    monkeypatch.setattr(stream, "_materialised", record)
    _small_blocks(monkeypatch, edges=2048, buckets=16, rows=256)
    w = stream.convert("kronecker:scale=12,features=16", tmp_path / "g", host_memory=1 << 30)
    edge_bytes = 2 * 2048 * 8  # one block's keys, both directions
    bucket_bytes = 2 * (16 << 12) * 8 // 16 * 3 // 2  # a sixteenth of the directed edges, with skew
    assert max(seen) <= max(edge_bytes, bucket_bytes, 256 * 16 * 4)
    assert max(seen) < w.edges * 8 // 4  # never the whole indices array


def test_blocks_follow_the_budget() -> None:
    small, large = (stream.plan_blocks(budget, 1 << 16, 16 << 16, 64) for budget in (16 << 20, 1 << 30))
    assert small.edges < large.edges and small.buckets > large.buckets and small.rows < large.rows
    assert large.buckets == 1
    with pytest.raises(DatasetError, match="too small"):
        stream.plan_blocks(1 << 20, 1 << 20, 16 << 20, 64)


def _fail_after(monkeypatch: pytest.MonkeyPatch, calls: int, exc: BaseException) -> None:
    real = stream._materialised
    count = {"n": 0}

    def boom(arr: np.ndarray) -> np.ndarray:
        count["n"] += 1
        if count["n"] > calls:
            raise exc
        return real(arr)

    monkeypatch.setattr(stream, "_materialised", boom)


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
@pytest.mark.parametrize("calls", [3, 50])  # while bucketing the edges; while writing the features
def test_failure_mid_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  exc: BaseException, calls: int) -> None:
    _small_blocks(monkeypatch, edges=1000, buckets=4, rows=64)
    _fail_after(monkeypatch, calls, exc)
    with pytest.raises(type(exc)):
        stream.convert("kronecker:scale=10,features=4", tmp_path / "g", host_memory=1 << 30)
    assert list(tmp_path.iterdir()) == []


def test_cli_convert_streams_kronecker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "kronecker:scale=10,features=8"
    assert main(["convert", "--dataset", spec, "--out", str(tmp_path / "s"), "--host-memory", "64MB"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "1,024 nodes" in out and "float32 features" in out
    io.save(load_dataset(spec), tmp_path / "m")
    _same_dirs(tmp_path / "m", tmp_path / "s")


def test_cli_convert_refuses_without_disk_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    class Usage:
        free = 1000

    def usage(path: Any) -> Usage:
        return Usage()

    monkeypatch.setattr(stream.shutil, "disk_usage", usage)
    assert main(["convert", "--dataset", "kronecker:scale=10", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "disk space" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_cli_convert_host_memory_too_small_is_one_error_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "--dataset", "kronecker:scale=16", "--out", str(tmp_path / "s"),
                 "--host-memory", "1MB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "too small" in err[0]
    assert list(tmp_path.iterdir()) == []
