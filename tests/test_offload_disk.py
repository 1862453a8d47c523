"""Offload with --host-memory from a converted directory (issue #29): features read from x.npy through the engine's
vertex order, host buffers past the budget spilled to unlinked files in --scratch; bit-exact with the RAM run."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.cli import main
from gnnscale.engines import OffloadEngine
from gnnscale.engines.offload import engine as offload_module
from gnnscale.engines.offload import workers as offload_workers
from gnnscale.engines.offload.engine import chunk_file_bytes
from gnnscale.engines.offload.layers import LayerPasses
from gnnscale.engines.offload.rows import HostRows
from gnnscale.errors import ConfigError
from gnnscale.graph import io
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def gdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("offload_disk") / "g"
    io.save(csbm(nodes=1000, features=32, avg_degree=6, seed=5), out)
    return out


def _engine(gdir: Path, host_memory: str | None = None, scratch: str | None = None, model: str = "gcn",
            hidden: int = 16, layers: int = 2) -> OffloadEngine:
    g = io.open_dir(gdir)
    cfg = TrainConfig(model=model, layers=layers, hidden=hidden, engine="offload", chunks=3, epochs=2,
                      host_memory=host_memory, scratch=scratch)
    assert g.num_classes is not None
    net = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                      dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return OffloadEngine(g, net, cfg, CPU)


def _losses(eng: OffloadEngine) -> list[dict[str, float]]:
    return [eng.train_epoch(e) for e in (1, 2)]


def _deleted_maps(folder: Path) -> dict[int, int]:
    """``{start address: size}`` of the mappings of deleted files that lay in ``folder``."""
    out = {}
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(str(folder)) and parts[5].rstrip().endswith("(deleted)"):
                lo, hi = (int(a, 16) for a in parts[0].split("-"))
                out[lo] = hi - lo
    return out


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_spilled_run_equals_the_ram_run(gdir: Path, tmp_path: Path, model: str) -> None:
    plain = _losses(_engine(gdir, model=model, layers=3))
    scratch = tmp_path / "scr"
    eng = _engine(gdir, {"gcn": "1MB", "sage": "1200KB"}[model], str(scratch), model=model, layers=3)
    assert eng.spill is not None and eng.disk
    assert list(scratch.iterdir()) == []  # unlinked at once: nothing in the folder, even while training
    spilled = _losses(eng)
    assert [r["loss"] for r in spilled] == [r["loss"] for r in plain]  # bit-exact
    assert "disk_read_bytes" not in plain[0] and "spill_bytes" not in plain[0]
    for r in spilled:
        assert r["disk_read_bytes"] > 0 and r["spill_bytes"] > 0
        assert r["disk_read_bytes"] % (32 * 4) == 0
    assert list(scratch.iterdir()) == []


def test_spill_is_file_backed_and_within_budget(gdir: Path, tmp_path: Path) -> None:
    eng = _engine(gdir, "750KB", str(tmp_path))
    spill = eng.spill
    assert spill is not None
    bufs = eng.host.buffers()
    total = sum(t.numel() * 4 for t in bufs)
    assert total == HostRows.buffer_bytes(eng.model, 1000)
    # a budget overrun, counted: the RAM-resident buffers stay within what the planner left them (the budget less
    # the model, the vertex arrays, the read buffers and the chunk's working set)
    plan = eng.host_plan
    assert plan is not None and plan.budget == 750_000 and plan.activation_bytes == total
    assert spill.ram_bytes <= plan.ram_activation_bytes == plan.budget - plan.fixed_bytes
    assert spill.ram_bytes + spill.spill_bytes == total
    assert eng.train_epoch(1)["host_rows_ram_bytes"] == spill.ram_bytes
    # every spilled buffer is a shared map of a (deleted) file of exactly its bytes, in the scratch folder
    maps = _deleted_maps(tmp_path)
    spilled = [t for t in bufs if t.data_ptr() in maps]
    assert len(spilled) == len(spill.fds) > 0
    assert sum(t.numel() * 4 for t in spilled) == spill.spill_bytes
    assert all(maps[t.data_ptr()] >= t.numel() * 4 for t in spilled)


def test_values_go_through_the_spill_files(gdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant that zeroes the spill files (through their descriptors, not the tensors) between the forward and the
    backward changes the loss of the next epoch: the buffers are read back from the files."""
    ref = _losses(_engine(gdir, "750KB", str(tmp_path)))
    eng = _engine(gdir, "750KB", str(tmp_path))
    assert eng.spill is not None
    real = LayerPasses.loss_and_last_backward

    def zeroing(self: LayerPasses, key: tuple[int, int]) -> float:
        for fd in eng.spill.fds:  # type: ignore[union-attr]
            size = os.fstat(fd).st_size
            os.pwrite(fd, bytes(size), 0)
        return real(self, key)

    monkeypatch.setattr(LayerPasses, "loss_and_last_backward", zeroing)
    mutant = _losses(eng)
    assert mutant[1]["loss"] != ref[1]["loss"]


def test_scratch_is_empty_after_an_error(gdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scr"

    def boom(self: LayerPasses, layer: int, key: tuple[int, int]) -> None:
        raise RuntimeError("mid-epoch")

    monkeypatch.setattr(LayerPasses, "backward", boom)
    eng = _engine(gdir, "750KB", str(scratch))
    with pytest.raises(RuntimeError, match="mid-epoch"):
        eng.train_epoch(1)
    assert list(scratch.iterdir()) == []
    # an error while allocating leaves nothing either
    monkeypatch.setattr(torch, "from_file", lambda *a, **k: (_ for _ in ()).throw(OSError("no room")))
    with pytest.raises(OSError):
        _engine(gdir, "750KB", str(scratch))
    assert list(scratch.iterdir()) == []


def test_scratch_without_room_is_refused(gdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 0))  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="--scratch"):
        _engine(gdir, "750KB", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_cli_scratch(gdir: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    scratch = tmp_path / "scr"
    args = ["train", "--dataset", str(gdir), "--engine", "offload", "--chunks", "3", "--hidden", "16", "--epochs",
            "2", "--quiet", "--metrics"]
    assert main([*args, str(tmp_path / "plain.jsonl")]) == 0
    assert main([*args, str(metrics), "--host-memory", "750KB", "--scratch", str(scratch)]) == 0
    plain = [r["loss"] for r in _epochs(tmp_path / "plain.jsonl")]
    recs = _epochs(metrics)
    assert [r["loss"] for r in recs] == plain
    assert recs[0]["spill_bytes"] > 0 and recs[0]["disk_read_bytes"] > 0
    assert list(scratch.iterdir()) == []


def _epochs(path: Path) -> list[dict[str, float]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if "loss" in r]


def test_without_scratch_the_planner_spills_to_the_temporary_folder(gdir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plain = _losses(_engine(gdir))
    capsys.readouterr()
    eng = _engine(gdir, "750KB")  # no --scratch: what the budget cannot hold still leaves RAM
    assert "spilled to files in " + str(tmp_path) in capsys.readouterr().err
    assert eng.spill is not None and eng.spill.spill_bytes > 0 and list(tmp_path.iterdir()) == []
    assert [r["loss"] for r in _losses(eng)] == [r["loss"] for r in plain]
    roomy = _engine(gdir, "1GB")  # a budget that holds every buffer spills nothing
    assert roomy.spill is None and roomy.host_plan is not None and not roomy.host_plan.spills


def test_a_spill_the_disk_cannot_hold_is_refused_before_the_run(gdir: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The engine check prices the spill against the scratch folder's free space, so a graph whose activations
    cannot fit anywhere is refused in one line before partitioning, chunking or reading features."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=10_000))
    planned: list[object] = []
    monkeypatch.setattr(offload_module, "plan_offload", lambda *a, **k: planned.append(a))  # must not run
    args = ["train", "--dataset", str(gdir), "--engine", "offload", "--epochs", "1", "--quiet", "--scratch",
            str(tmp_path), "--host-memory"]
    capsys.readouterr()
    assert main([*args, "100KB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spills about" in err[0] and str(tmp_path) in err[0]
    assert planned == []  # refused before the engine's own planning (which partitions the whole graph)
    monkeypatch.undo()
    assert main([*args, "750KB"]) == 0


def test_chunk_topology_past_the_budget_is_file_backed(gdir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget whose activations already spill keeps the chunks' blocks in files (every tensor here, with the
    size floor lowered): they are mapped from the scratch folder, the losses are the RAM run's, and the folder is
    empty (the files are unlinked as soon as they are mapped)."""
    monkeypatch.setattr(offload_workers, "FILE_MIN_BYTES", 0)
    plain = _losses(_engine(gdir))
    scratch = tmp_path / "scr"
    eng = _engine(gdir, "750KB", str(scratch))
    assert eng.spill is not None and eng.spill.file_bytes > 0
    for chunk in eng.chunks:
        for t in (chunk.rows, chunk.block.indptr, chunk.block.indices):
            assert t.untyped_storage().filename is not None, "a chunk's block in anonymous memory"
    assert eng.spill.file_bytes <= chunk_file_bytes(eng.model, eng.plan, eng.graph.num_nodes, eng.graph.num_edges)
    assert [r["loss"] for r in _losses(eng)] == [r["loss"] for r in plain]
    assert list(scratch.iterdir()) == []
    roomy = _engine(gdir, "1GB")  # the budget holds the blocks beside every buffer: nothing in files
    assert roomy.spill is None and roomy.chunks[0].block.indices.untyped_storage().filename is None


def test_spill_files_have_their_blocks_allocated(gdir: Path, tmp_path: Path) -> None:
    """A spill file is reserved (posix_fallocate), not sparse: a disk that fills after the free-space check cannot
    end the run with SIGBUS when a mapped page is written back (issue #44, item 11)."""
    eng = _engine(gdir, "750KB", str(tmp_path / "scr"))
    assert eng.spill is not None and eng.spill.fds
    for fd in eng.spill.fds:
        st = os.fstat(fd)
        assert st.st_size > 0 and st.st_blocks * 512 >= st.st_size


def test_a_disk_that_cannot_reserve_a_spill_file_is_one_error_line(gdir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    calls: list[int] = []

    def full(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    scratch = tmp_path / "scr"
    args = ["train", "--dataset", str(gdir), "--engine", "offload", "--chunks", "3", "--hidden", "16", "--epochs",
            "1", "--quiet", "--host-memory", "750KB", "--scratch", str(scratch)]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert calls and len(err) == 1 and err[0].startswith("error: --scratch") and "no room" in err[0]
    assert list(scratch.iterdir()) == []  # nothing half-written left behind
