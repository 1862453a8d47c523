"""Outputs under faults (issue #44): a full disk keeps the model and the metrics, two runs on one output are refused
while the first lives (and not after it died), and a killed writer's temporaries are cleaned by the next save to
that path, only those."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pytest

import gnnscale.checkpoint as checkpoint_mod
from gnnscale import TrainConfig
from gnnscale.checkpoint import load_checkpoint
from gnnscale.cli import main
from gnnscale.errors import ConfigError
from gnnscale.fsutil import atomic_file
from gnnscale.graph.generators import csbm
from gnnscale.predict import load_model
from gnnscale.saved_model import save_model

SMALL = "csbm:nodes=200,avg_degree=4,features=8"
TRAIN = ["train", "--dataset", SMALL, "--hidden", "8", "--epochs", "2", "--quiet", "--device", "cpu"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class _FullDisk:
    """A file on a full disk: the first ``room`` bytes go in, then every write is ``ENOSPC``."""

    def __init__(self, fh: BinaryIO, room: int = 512):
        self.fh, self.room = fh, room

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if n > self.room:
            self.fh.write(bytes(memoryview(data).cast("B")[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= n
        return int(self.fh.write(data))

    def flush(self) -> None:
        self.fh.flush()


def _full_under(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves of models and checkpoints under ``folder`` hit a full disk (torch.save gets a file whose writes fail
    with ENOSPC part-way, as on a real full disk); elsewhere they work."""
    real = checkpoint_mod.atomic_file

    @contextmanager
    def atomic(path: Any, **kw: Any) -> Iterator[Any]:
        with real(path, **kw) as fh:
            yield _FullDisk(fh) if Path(path).resolve().is_relative_to(folder.resolve()) else fh

    monkeypatch.setattr(checkpoint_mod, "atomic_file", atomic)


# ------------------------------------------------------------------------------------------------ full disk
def _full_disk_and_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A folder whose saves hit a full disk, and the working folder (where the model's copy goes)."""
    full, here = tmp_path / "full", tmp_path / "cwd"
    full.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    _full_under(full, monkeypatch)
    return full, here


def _one_error_line(flags: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Training with ``flags`` ends in exit status 2 and one line on stderr (no traceback)."""
    assert main([*TRAIN, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_save_model_on_a_full_disk_keeps_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    full, here = _full_disk_and_cwd(tmp_path, monkeypatch)
    err = _one_error_line(["--save-model", str(full / "m.pt")], capsys)
    assert err.startswith(f"error: could not write {full / 'm.pt'} (--save-model: No space left on device); the "
                          f"model is at {here / 'm.pt'}"), err
    model, _ = load_model(here / "m.pt")  # the copy is whole
    assert model.num_classes == 5
    assert sorted(p.name for p in full.iterdir()) == []  # no temporary left on the full disk


def test_a_checkpoint_on_a_full_disk_keeps_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    full, here = _full_disk_and_cwd(tmp_path, monkeypatch)
    err = _one_error_line(["--checkpoint", str(full / "ck")], capsys)
    assert err.startswith(f"error: could not write the checkpoint in {full / 'ck'} (No space left on device)"), err
    assert f"the model is at {here / 'model.interrupted.pt'}" in err, err
    assert load_model(here / "model.interrupted.pt")[0] is not None


def test_a_full_disk_under_metrics_keeps_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    m = tmp_path / "m.jsonl"
    m.symlink_to("/dev/full")  # every write: ENOSPC
    assert main([*TRAIN, "--metrics", str(m), "--save-model", str(tmp_path / "model.pt")]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "Traceback" not in err, err  # once when it failed, once where the records are
    assert warnings[0].startswith(f"warning: could not write --metrics {m} (No space left on device): training "
                                  "goes on"), err
    assert f"all 3 are in {here / 'm.jsonl'}" in warnings[1], err
    records = [json.loads(line) for line in (here / "m.jsonl").read_text().splitlines()]
    assert [r.get("epoch") for r in records[:2]] == [1, 2] and records[2]["summary"]
    assert load_model(tmp_path / "model.pt")[0] is not None  # the model is not lost with the metrics


def test_metrics_written_when_the_disk_has_room_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import gnnscale.cli.common as common

    real = common.write_all
    calls = {"n": 0}

    def full_at_first(fd: int, data: bytes) -> None:  # the first record's write tears its line, the next fails
        calls["n"] += 1
        if calls["n"] <= 2:
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(common, "write_all", full_at_first)
    m = tmp_path / "m.jsonl"
    assert main([*TRAIN, "--epochs", "3", "--metrics", str(m)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "training goes on" in err, err
    records = [json.loads(line) for line in m.read_text().splitlines()]  # no torn line is left in the file
    assert [r.get("epoch") for r in records] == [1, 2, 3, None] and records[-1]["summary"]


# ------------------------------------------------------------------------------------------------ locks
@contextmanager
def _held(lock_file: Path) -> Iterator[None]:
    """A first run's lock, as gnnscale takes it: ``flock`` on the file, its pid in it (in this process: each open
    file is its own holder)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        lock_file.unlink(missing_ok=True)
        os.close(fd)


def test_a_second_run_on_the_same_outputs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    with _held(ck / ".checkpoint.pt.lock"):
        assert main([*TRAIN, "--checkpoint", str(ck)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: --checkpoint {ck} is in use by another gnnscale run (pid {os.getpid()}); wait for "
                       "it to end, or give another path\n"), err
        assert load_checkpoint(ck) is None  # the second run wrote nothing
    with _held(tmp_path / ".m.jsonl.lock"):
        assert main([*TRAIN, "--metrics", str(m)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --metrics {m} is in use by another gnnscale run (pid {os.getpid()})"), err
        assert err.count("\n") == 1 and not m.exists()
    assert main([*TRAIN, "--checkpoint", str(ck), "--metrics", str(m)]) == 0  # released: the next run goes on
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "m.jsonl"]  # no lock file stays behind
    assert sorted(p.name for p in ck.iterdir()) == ["checkpoint.pt", "model.pt"]
    from gnnscale.checkpoint import lock_checkpoint

    with lock_checkpoint(ck), pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
        lock_checkpoint(ck)  # the library's own lock, twice


def test_the_lock_goes_when_its_process_dies(tmp_path: Path) -> None:
    from gnnscale.fsutil import lock_output, lock_path

    m = tmp_path / "m.jsonl"
    holder = subprocess.Popen(  # a run that holds the lock as gnnscale takes it: flock, its pid in the file
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, str(os.getpid()).encode())\nprint('held', flush=True)\ntime.sleep(600)\n", str(lock_path(m))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=rf"is in use by another gnnscale run \(pid {holder.pid}\)"):
            lock_output(m, "--metrics")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_output(m, "--metrics"):  # the kernel let it go with the process
        assert lock_path(m).read_text() == f"{os.getpid()}\n"
    assert not lock_path(m).exists()


# ------------------------------------------------------------------------------------------------ temporaries
def test_the_next_save_removes_a_killed_writer_s_temporaries_only(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "m.pt"
    dead, legacy = f".m.pt.gnnscale-{_dead_pid()}-k2j4.tmp", ".m.pt.k2j4h5l6.tmp"
    kept = [f".m.pt.gnnscale-{os.getpid()}-live.tmp",  # a writer still running (this process)
            ".m.pt.backup.tmp",  # someone else's file
            ".n.pt.k2j4h5l6.tmp", "m.pt.k2j4h5l6.tmp"]  # another target's; not hidden: not ours
    for name in [dead, legacy, *kept]:
        (tmp_path / name).write_bytes(b"\0" * 4096)
    g = csbm(nodes=50, avg_degree=3, features=4, seed=0)
    cfg = TrainConfig(hidden=4, epochs=1)
    from gnnscale.nn import build_model

    model = build_model(cfg.model, 4, cfg.hidden, 5, **cfg.model_kwargs())
    _full_under(tmp_path, monkeypatch)  # the next save fails (the disk is full): it still cleans up first
    with pytest.raises((OSError, RuntimeError)):  # (what torch.save raises is the full-disk tests' matter)
        save_model(target, model, cfg, g)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    monkeypatch.undo()
    save_model(target, model, cfg, g)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "m.pt"])


def test_a_temporary_carries_its_writer_s_pid(tmp_path: Path) -> None:
    with atomic_file(tmp_path / "x.bin") as fh:
        fh.write(b"1")
        (name,) = [p.name for p in tmp_path.iterdir()]
        assert name.startswith(f".x.bin.gnnscale-{os.getpid()}-") and name.endswith(".tmp")
    assert (tmp_path / "x.bin").read_bytes() == b"1"
