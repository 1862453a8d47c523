"""Issue #14's training-loop and CLI points: diverging runs, the split that picks the best epoch, overlapping
splits, flags an engine ignores, metrics that survive interruption and stay strict JSON, the best weights, help,
version and broken pipes. CLI points run through a subprocess where the exit path matters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnscale import TrainConfig, train
from gnnscale.cli import main
from gnnscale.errors import GraphError, TrainingError
from gnnscale.graph import io
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph

SMALL = "csbm:nodes=300,avg_degree=4,features=8"
ROOT = Path(__file__).resolve().parents[1]


def _cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gnnscale.cli", *argv], capture_output=True, text=True,
                          check=False, env=env, cwd=cwd, timeout=240)


def _exploding(tmp: Path) -> Path:
    """A graph whose features overflow float32 in the first layer: the loss is not finite in epoch 1."""
    g = csbm(nodes=200, avg_degree=4, features=8, seed=0)
    g.x = torch.full_like(g.x, 3e38)
    path = tmp / "exploding"
    io.save(g, path)
    return path


def test_a_diverging_run_stops_with_one_line_and_strict_json_metrics(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    r = _cli("train", "--dataset", str(_exploding(tmp_path)), "--epochs", "5", "--quiet", "--metrics", str(metrics))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the loss is") and "epoch 1" in lines[0]
    assert "Traceback" not in r.stderr
    text = metrics.read_text()
    assert "NaN" not in text and "Infinity" not in text
    recs = [json.loads(line) for line in text.splitlines()]  # strict JSON: what JSON.parse accepts
    assert len(recs) == 1 and recs[0]["epoch"] == 1 and recs[0]["loss"] is None


def test_a_diverging_run_raises_in_the_api(tmp_path: Path) -> None:
    g = io.open_dir(_exploding(tmp_path))
    with pytest.raises(TrainingError, match="training diverged"):
        train(g, TrainConfig(epochs=3, hidden=8), "cpu")


def test_nan_features_name_the_first_bad_row() -> None:
    g = csbm(nodes=300, avg_degree=4, features=8, seed=0)
    x = g.x.clone()
    x[137, 5] = float("nan")
    x[250, 0] = float("inf")
    g.x = x
    with pytest.raises(GraphError, match=r"first at row 137, column 5 \(nan\); 2 bad row"):
        g.validate()


def test_without_validation_vertices_the_best_epoch_is_by_training_accuracy(capsys: pytest.CaptureFixture[str]) -> None:
    g = csbm(nodes=300, avg_degree=4, features=8, seed=0)
    g.val_mask = None
    res = train(g, TrainConfig(epochs=4, hidden=8), "cpu")
    s = res.summary
    assert s["best_by"] == "train" and s["best_val_acc"] is None
    accs = [r["train_acc"] for r in res.history]
    assert s["best_epoch"] == accs.index(max(accs)) + 1
    with_val = train(csbm(nodes=300, avg_degree=4, features=8, seed=0), TrainConfig(epochs=4, hidden=8), "cpu")
    assert with_val.summary["best_by"] == "val" and with_val.summary["best_val_acc"] is not None


def test_overlapping_splits_are_refused() -> None:
    g = csbm(nodes=300, avg_degree=4, features=8, seed=0)
    val = g.val_mask.clone()
    val[torch.nonzero(g.train_mask)[:3]] = True
    g.val_mask = val
    with pytest.raises(GraphError, match="3 vertices are in both train_mask and val_mask"):
        train(g, TrainConfig(epochs=1, hidden=8), "cpu")


def test_best_state_holds_the_best_epochs_weights() -> None:
    g = csbm(nodes=300, avg_degree=4, features=8, seed=0)
    res = train(g, TrainConfig(epochs=6, hidden=8, lr=0.05), "cpu")
    best = res.summary["best_epoch"]
    again = train(g, TrainConfig(epochs=best, hidden=8, lr=0.05), "cpu")  # deterministic: stop at the best epoch
    assert set(res.best_state) == set(res.model.state_dict())
    for k, v in again.model.state_dict().items():
        assert torch.equal(res.best_state[k], v), k
    if best < 6:  # the model itself keeps the last epoch's weights
        assert any(not torch.equal(res.best_state[k], v) for k, v in res.model.state_dict().items())


@pytest.mark.parametrize(("argv", "named"), [
    (["--fanouts", "5,5", "--batch-size", "64"],
     "batch_size=64 (--batch-size), fanouts=(5, 5) (--fanouts) have no effect on the inmemory engine"),
    (["--partitions", "2"], "partitions=2 (--partitions) has no effect on the inmemory engine"),
    (["--dependency", "skip"], "dependency='skip' (--dependency) has no effect on the inmemory engine"),
    (["--heads", "2"], "heads=2 (--heads) has no effect on the gcn model"),
])
def test_flags_the_engine_ignores_are_named(argv: list[str], named: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", SMALL, "--engine", "inmemory", "--epochs", "1", "--quiet", *argv]) == 0
    err = capsys.readouterr().err
    assert f"warning: {named}" in err


def test_flags_the_engine_reads_are_not_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", SMALL, "--engine", "offload", "--partitions", "2", "--epochs", "1",
                 "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_fanouts_are_checked_before_the_data_loads(capsys: pytest.CaptureFixture[str]) -> None:
    # a dataset that does not exist: the flag error must come first
    code = main(["train", "--dataset", "npz:/nonexistent.npz", "--engine", "minibatch", "--fanouts", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "--fanouts has 1 value(s) for 2 layers" in err


def test_help_shows_every_train_flags_default() -> None:
    r = _cli("train", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for flag, default in (("--model", "gcn"), ("--layers", "2"), ("--dropout", "0.5"), ("--lr", "0.01"),
                          ("--weight-decay", "5e-4"), ("--epochs", "100"), ("--hidden", "64"), ("--heads", "4")):
        seg = text[text.index(f"{flag} ", text.index("options:")) :][:300]  # its entry, not the usage line
        assert f"default {default}" in seg, flag


def test_version() -> None:
    from gnnscale import __version__

    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"gnnscale {__version__}"


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m gnnscale.cli info --dataset csbm:nodes=500 | head -c 10"
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, env=env,
                       timeout=240, check=False)
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert len(r.stdout) == 10


def test_outputs_honour_the_umask(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GNNSCALE_CACHE_DIR": str(tmp_path / "cache")}
    py = sys.executable
    script = (f"umask 002 && {py} -m gnnscale.cli train --dataset {SMALL} --epochs 1 --quiet --metrics m.jsonl && "
              f"{py} -m gnnscale.cli convert --dataset {SMALL} --out g && "
              f"{py} -m gnnscale.cli partition --dataset {SMALL} --partitions 2 --plan-dir plans")
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
                       check=False)
    assert r.returncode == 0, r.stderr
    mode = lambda p: p.stat().st_mode & 0o777  # noqa: E731
    assert mode(tmp_path / "m.jsonl") == 0o664
    assert mode(tmp_path / "g") == 0o775 and mode(tmp_path / "g" / "meta.json") == 0o664
    assert all(mode(p) == 0o664 for p in (tmp_path / "g").iterdir())
    plans = list((tmp_path / "plans").iterdir())
    assert plans and all(mode(p) == 0o664 for p in plans)


def test_convert_removes_what_an_interrupted_convert_left(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no live process now
    stale = tmp_path / ".g.abc123.partial"
    stale.mkdir()
    (stale / ".writer-pid").write_text(str(dead.pid))
    (stale / "x.npy").write_bytes(b"\0" * 1000)
    live = tmp_path / ".g.live99.partial"  # another convert still writing: kept
    live.mkdir()
    (live / ".writer-pid").write_text(str(os.getpid()))
    r = _cli("convert", "--dataset", SMALL, "--out", str(tmp_path / "g"))
    assert r.returncode == 0, r.stderr
    assert not stale.exists() and live.exists() and (tmp_path / "g" / "meta.json").exists()
    assert f"removed {stale}" in r.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".g.") and p != live]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when no CUDA device is present")
def test_auto_device_without_a_gpu_says_so_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", SMALL, "--epochs", "1", "--quiet"]) == 0
    assert capsys.readouterr().out.count("no CUDA device found: training on CPU") == 1
    assert main(["train", "--dataset", SMALL, "--epochs", "1", "--quiet", "--device", "cpu"]) == 0
    assert "no CUDA device" not in capsys.readouterr().out


def test_sigterm_inside_an_extension_module_still_ends_as_terminated(tmp_path: Path) -> None:
    """pymetis turns the exception raised by the signal handler into its own RuntimeError; the run must still
    end with 'error: terminated' and 143, no traceback (the METIS call is made to wait for the signal)."""
    script = tmp_path / "run.py"
    script.write_text(
        "import os, signal, sys\n"
        "import gnnscale.partition.plan as plan\n"
        "from gnnscale.cli import main\n"
        "def metis(*a, **k):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        signal.sigtimedwait([], 0) if hasattr(signal, 'sigtimedwait') else None\n"
        "        for _ in range(10**7): pass\n"
        "    except BaseException as exc:\n"
        "        raise RuntimeError('Caught an unknown exception!') from exc\n"
        "plan._metis = metis\n"
        "sys.exit(main(['partition', '--dataset', 'csbm:nodes=300', '--partitions', '2', '--plan-dir', "
        f"'{tmp_path / 'plans'}']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=240,
                       check=False)
    assert r.returncode == 143 and r.stderr == "error: terminated\n", (r.returncode, r.stderr)


def test_info_statistics_stream_over_edge_slabs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`info` reads the edges in slabs (a memory-mapped graph is never loaded whole); slab borders inside a row
    must not change a count."""
    from gnnscale.graph import graph as graph_mod
    from gnnscale.testing import tiny_graph

    for g in (tiny_graph(), csbm(nodes=500, avg_degree=6, features=4, seed=1)):
        dst = g.dst_index()
        want_loops = int((g.indices.long() == dst).sum())
        want_out = torch.bincount(g.indices.long(), minlength=g.num_nodes)
        full = g.stats()
        monkeypatch.setattr(graph_mod, "_STAT_EDGES", 3)
        want_dups = g.duplicate_edges()
        assert g.num_self_loops() == want_loops and torch.equal(g.out_degree(), want_out)
        assert g.duplicate_edges() == want_dups
        assert g.stats() == full
        monkeypatch.undo()
    assert tiny_graph().num_self_loops() == 2
    multi = Graph.from_edge_index(torch.tensor([[0, 0, 0, 1, 2, 2], [1, 1, 1, 2, 0, 0]]), 3)
    for slab in (1, 2, 3, 1 << 22):
        monkeypatch.setattr(graph_mod, "_STAT_EDGES", slab)
        assert multi.duplicate_edges() == 3, slab


def _full_disk(limit: int) -> None:
    """In the child: files may grow to ``limit`` bytes, a write past it fails (EFBIG, or numpy's short write) as on
    a full disk; SIGXFSZ ignored so that the write fails instead of the process being killed."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("spec", ["csbm:nodes=20000,avg_degree=4,features=16", "kronecker:scale=12,features=16"])
def test_convert_on_a_full_disk_is_one_error_line_and_leaves_nothing(tmp_path: Path, spec: str) -> None:
    """Issue #44 item 15: ``OSError: 1280000 requested and 868320 written`` was a traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "new" / "g"  # in a folder convert creates
    r = subprocess.run([sys.executable, "-m", "gnnscale.cli", "convert", "--dataset", spec, "--out", str(out)],
                       capture_output=True, text=True, check=False, env=env, timeout=240,
                       preexec_fn=lambda: _full_disk(200_000))
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith(f"error: convert --out {out}: ") and "nothing was written there" in err[0]
    assert list(tmp_path.iterdir()) == []  # the partial folder removed, and the folder made for it
