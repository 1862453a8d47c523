"""Issue #28 (what a new user ran into, round 2), the output and safety items: output paths checked before any
work and a late write that keeps the work (6), a model saved on Ctrl-C / SIGTERM (7), a report on a metrics file
whose last line was cut (9), model files and Planetoid pickles that cannot run code on load and a ``--ranks`` job
on loopback only (10), a report figure fit for a paper (12), and ``report --format md --out`` (21)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gnnscale import _compat
from gnnscale.cli import main, train_cmd
from gnnscale.errors import DatasetError
from gnnscale.graph.datasets import load_dataset
from gnnscale.predict import load_model
from gnnscale.report import build_panels, read_run

ROOT = Path(__file__).resolve().parents[1]
SMALL = "csbm:nodes=200,avg_degree=4,features=8"
TRAIN = ["train", "--dataset", SMALL, "--hidden", "8", "--epochs", "1", "--device", "cpu", "--quiet"]
PLANETOID = ROOT.parent / "shared" / "datasets" / "planetoid"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _metrics(tmp: Path, name: str = "m.jsonl", **summary: Any) -> Path:
    recs: list[dict[str, Any]] = [
        {"epoch": e, "loss": 1.0 / e, "train_acc": 0.5, "val_acc": 0.4, "test_acc": 0.3, "epoch_time_s": 0.1,
         "peak_device_bytes": 2**20} for e in (1, 2, 3)]
    if summary:
        recs.append({"summary": True, **summary})
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _model(tmp: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp / "model.pt"
    assert main([*TRAIN, "--save-model", str(path)]) == 0
    capsys.readouterr()
    return path


# ------------------------------------------------------------------------------------------------ item 6
def _blocked(tmp: Path) -> Path:
    """A path no one can write: its parent folder is a file."""
    (tmp / "blocker").write_text("a file, not a folder")
    return tmp / "blocker" / "sub"


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
@pytest.mark.parametrize("flag", ["--save-model", "--checkpoint", "--metrics", "convert", "predict", "report"])
def test_every_output_path_is_checked_before_any_work(flag: str, where: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    base = _blocked(tmp_path) if where == "under-a-file" else Path("/proc/gnnscale-no-such-folder")
    if where == "proc" and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    metrics = _metrics(tmp_path)
    model = tmp_path / "no-model.pt"  # predict must refuse the --out before it looks at the model
    argv = {
        "--save-model": [*TRAIN, "--save-model", str(base / "m.pt")],
        "--checkpoint": [*TRAIN, "--checkpoint", str(base / "ck")],
        "--metrics": [*TRAIN, "--metrics", str(base / "m.jsonl")],
        "convert": ["convert", "--dataset", SMALL, "--out", str(base / "conv")],
        "predict": ["predict", "--dataset", SMALL, "--model", str(model), "--out", str(base / "p.npy")],
        "report": ["report", str(metrics), "--format", "md", "--out", str(base / "r.md")],
    }[flag]
    code, out, err = _run(argv, capsys)
    assert code == 2
    line = _one_error(err, "sub" if where == "under-a-file" else "/proc")
    assert "--out" in line or flag in line or flag in ("convert", "predict", "report")
    assert "epoch" not in out and "wrote" not in out and "dataset" not in out  # nothing ran
    assert not list(tmp_path.glob("**/conv*")) and not (tmp_path / "blocker").is_dir()


def test_missing_parent_folders_are_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, ck, metrics = tmp_path / "a/b/m.pt", tmp_path / "c/d/ck", tmp_path / "e/f/m.jsonl"
    code, out, err = _run([*TRAIN, "--save-model", str(model), "--checkpoint", str(ck), "--metrics", str(metrics)],
                          capsys)
    assert code == 0, err
    assert model.is_file() and (ck / "checkpoint.pt").is_file() and metrics.is_file()
    pred, md, conv = tmp_path / "g/h/p.npy", tmp_path / "i/j/r.md", tmp_path / "k/l/conv"
    assert _run(["predict", "--dataset", SMALL, "--model", str(model), "--out", str(pred)], capsys)[0] == 0
    assert _run(["report", str(metrics), "--format", "md", "--out", str(md)], capsys)[0] == 0
    assert _run(["convert", "--dataset", SMALL, "--out", str(conv)], capsys)[0] == 0
    assert pred.is_file() and md.is_file() and (conv / "meta.json").is_file()


def test_a_model_save_that_fails_late_keeps_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out_dir, cwd = tmp_path / "out", tmp_path / "cwd"
    out_dir.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    real = train_cmd.train

    def train_then_lose_the_folder(*a: Any, **kw: Any) -> Any:
        result = real(*a, **kw)
        shutil.rmtree(out_dir)  # the folder goes away while the run trains (a full disk, an unmounted share ...)
        out_dir.write_text("now a file")
        return result

    monkeypatch.setattr(train_cmd, "train", train_then_lose_the_folder)
    metrics = tmp_path / "m.jsonl"
    code, _, err = _run([*TRAIN, "--save-model", str(out_dir / "m.pt"), "--metrics", str(metrics)], capsys)
    assert code == 2
    line = _one_error(err, f"could not write {out_dir / 'm.pt'}", "the model is at ")
    kept = Path(line.split("the model is at ")[1].strip())
    assert kept.is_file()
    net, config = load_model(kept)
    assert config.hidden == 8
    assert json.loads(metrics.read_text().splitlines()[-1]).get("summary")  # the summary is written all the same


# ------------------------------------------------------------------------------------------------ item 7
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_run_saves_the_model_as_it_stands(sig: int, tmp_path: Path) -> None:
    model, metrics = tmp_path / "m.pt", tmp_path / "m.jsonl"
    argv = [sys.executable, "-m", "gnnscale.cli", "train", "--dataset", SMALL, "--hidden", "8", "--epochs", "100000",
            "--device", "cpu", "--quiet", "--save-model", str(model), "--metrics", str(metrics)]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text().count("\n") >= 1):  # the first epoch is done
            assert proc.poll() is None and time.monotonic() < deadline, "no epoch record in 120 s"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    saved = model.with_name("m.interrupted.pt")
    assert str(saved) in err and not model.exists()  # a finished run's model is never mistaken for this one
    state = torch.load(saved, weights_only=True)
    assert state["interrupted"] is True and state["epochs_done"] >= 1
    net, _ = load_model(saved)
    assert net.num_classes == state["num_classes"]


# ------------------------------------------------------------------------------------------------ item 9
def test_report_skips_a_cut_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _metrics(tmp_path)
    with path.open("a") as fh:
        fh.write('{"epoch": 4, "loss": 0.2, "train_a')  # the run was killed while writing epoch 4
    code, out, err = _run(["report", str(path), "--format", "md"], capsys)
    assert code == 0, err
    assert [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "epoch" not in line] \
        == ["1", "2", "3"]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: ") and "skipped" in lines[0] and "line 4" in lines[0]
    # a bad line that is not the last is still an error
    text = path.read_text()
    path.write_text(text + "\n" + json.dumps({"epoch": 5, "loss": 0.1}) + "\n")
    with pytest.raises(DatasetError, match="m.jsonl:4"):
        read_run(path)


# ------------------------------------------------------------------------------------------------ item 10
class _Payload:
    """Unpickling this runs ``touch <file>``."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.target}",))


def test_models_and_checkpoints_load_with_weights_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, ck = tmp_path / "m.pt", tmp_path / "ck"
    assert _run([*TRAIN, "--epochs", "2", "--save-model", str(model), "--checkpoint", str(ck)], capsys)[0] == 0
    for f in (model, ck / "checkpoint.pt", ck / "model.pt"):
        torch.load(f, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("command", ["predict", "resume"])
def test_a_model_file_with_a_code_payload_runs_nothing(command: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    pwned = tmp_path / "pwned"
    evil = {"format": "gnnscale-model", "version": 1, "config": _Payload(pwned)}
    if command == "predict":
        path = tmp_path / "evil.pt"
        torch.save(evil, path)
        argv = ["predict", "--dataset", SMALL, "--model", str(path), "--out", str(tmp_path / "p.npy")]
    else:
        (tmp_path / "ck").mkdir()
        torch.save({**evil, "format": "gnnscale-checkpoint"}, tmp_path / "ck" / "checkpoint.pt")
        argv = [*TRAIN, "--epochs", "3", "--checkpoint", str(tmp_path / "ck"), "--resume"]
    code, _, err = _run(argv, capsys)
    assert code == 2
    _one_error(err, "refused")
    assert not pwned.exists()


def test_a_planetoid_pickle_with_a_code_payload_runs_nothing(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    pwned = tmp_path / "pwned"
    with open(tmp_path / "ind.cora.x", "wb") as fh:
        pickle.dump(_Payload(pwned), fh, protocol=2)
    with pytest.raises(DatasetError, match="refused"):
        load_dataset("planetoid:cora", root=tmp_path)
    assert not pwned.exists()
    code, _, err = _run(["info", "--dataset", "planetoid:cora", "--root", str(tmp_path)], capsys)
    assert code == 2
    _one_error(err, "ind.cora.x", "posix.system", "refused")
    assert not pwned.exists()


@pytest.mark.skipif(not (PLANETOID / "ind.cora.x").is_file(), reason=f"the Planetoid files are not in {PLANETOID}")
def test_the_real_planetoid_files_pass_the_restricted_unpickler() -> None:
    g = load_dataset("planetoid:cora", root=PLANETOID)
    assert (g.num_nodes, g.num_features, g.num_classes) == (2708, 1433, 7)


def _report_listening(out: str) -> int:
    """A rank of ``run_ranks``: write MASTER_ADDR and the addresses this rank's and the launcher's sockets listen
    on (``/proc/net/tcp*`` entries in state LISTEN whose inode is one of the two processes' sockets), with the
    ranks' gloo group up."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    inodes: set[str] = set()
    for pid in (os.getpid(), os.getppid()):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    listening = []
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:
                listening.append(cols[1].split(":")[0])
    Path(out, os.environ["RANK"]).write_text(json.dumps({"master": os.environ["MASTER_ADDR"],
                                                        "listening": listening}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
"""127.0.0.1 and ::1 (and ::ffff:127.0.0.1) as /proc/net/tcp* spells them."""


@pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="needs Linux's /proc/net")
def test_a_ranks_job_listens_on_loopback_only(tmp_path: Path) -> None:
    from gnnscale.distributed.launch import run_ranks

    assert run_ranks(_report_listening, str(tmp_path), 2) == 0  # type: ignore[arg-type]
    seen = [json.loads((tmp_path / r).read_text()) for r in ("0", "1")]
    assert all(s["master"] == "127.0.0.1" for s in seen), seen
    assert all(s["listening"] for s in seen)  # the launcher's store, at least
    assert {a for s in seen for a in s["listening"]} <= LOOPBACK, seen
    assert os.environ.get("GLOO_SOCKET_IFNAME") is None  # the ranks' setting does not leak into the caller


# ------------------------------------------------------------------------------------------------ item 12
@pytest.mark.skipif(not _compat.WITH_MATPLOTLIB, reason="matplotlib is not installed")
def test_the_report_figure_is_fit_for_a_paper(tmp_path: Path) -> None:
    from matplotlib.ticker import MaxNLocator

    from gnnscale.report import draw_figure

    runs = [read_run(_metrics(tmp_path, "a.jsonl", engine="inmemory", model="gcn", dataset="csbm", device="cpu")),
            read_run(_metrics(tmp_path, "b.jsonl"))]
    panels = build_panels(runs)
    memory = next(p for p in panels if "memory" in p.title)
    assert memory.ylabel == "memory held (MiB)" and {s.part for s in memory.series} == {"device"}
    fig = draw_figure(panels)
    fig.canvas.draw()
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes][:4] == ["training loss", "accuracy", "epoch time (s)", "memory held (MiB)"]
    for ax in axes:
        loc = ax.xaxis.get_major_locator()
        assert isinstance(loc, MaxNLocator) and loc._integer  # epochs are whole numbers
        assert ax.get_xlabel() == "epoch"
        assert ax.get_legend() is None
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert all(float(t).is_integer() for t in ticks)
    assert len(fig.legends) == 1
    box = fig.legends[0].get_window_extent()
    for ax in axes:
        assert not box.overlaps(ax.get_window_extent())  # the legend covers no curve
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"train", "val", "test", "device"} <= set(names)


# ------------------------------------------------------------------------------------------------ item 21
def test_report_md_honours_out_and_refuses_an_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = _metrics(tmp_path)
    code, out, err = _run(["report", str(metrics), "--format", "md", "--out", str(tmp_path / "r.png")], capsys)
    assert code == 2 and not (tmp_path / "r.png").exists()
    _one_error(err, "r.png", "--format md")
    code, out, err = _run(["report", str(metrics), "--format", "md", "--out", str(tmp_path / "r.md")], capsys)
    assert code == 0, err
    assert (tmp_path / "r.md").read_text().startswith("### ") and "| epoch |" not in out


def test_report_titles_runs_by_their_full_dataset_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for nodes in (200, 240):
        path = tmp_path / f"run{nodes}.jsonl"
        argv = [*TRAIN, "--dataset", f"csbm:nodes={nodes},avg_degree=4,features=8", "--metrics", str(path)]
        assert _run(argv, capsys)[0] == 0
        paths.append(str(path))
    code, out, _ = _run(["report", *paths, "--format", "md"], capsys)
    assert code == 0
    headings = [line for line in out.splitlines() if line.startswith("### ")]
    assert len(headings) == 2 and headings[0] != headings[1]
    assert "nodes=200" in headings[0] and "nodes=240" in headings[1]
    assert "(run200)" not in headings[0]  # told apart by what they trained on, not by the file name
