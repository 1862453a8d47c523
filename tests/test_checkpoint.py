"""Checkpoint and resume (issue #15): a run killed with SIGKILL and resumed trains the epochs an uninterrupted run
would have (inmemory, offload with 2 partitions and full dedup, minibatch), an interrupted checkpoint write leaves
the previous checkpoint loadable, and resumes that would change the model are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnscale import TrainConfig, train
from gnnscale.checkpoint import FILE, load_checkpoint, save_checkpoint
from gnnscale.cli import main
from gnnscale.errors import ConfigError
from gnnscale.graph.generators import csbm

ROOT = Path(__file__).resolve().parents[1]
DATA = "csbm:nodes=1500,avg_degree=6,features=16"
EPOCHS, KILL_AFTER = 6, 3
ENGINES = {
    "inmemory": ["--engine", "inmemory"],
    "offload": ["--engine", "offload", "--partitions", "2", "--dedup", "full"],
    "minibatch": ["--engine", "minibatch", "--batch-size", "256"],
}


def _argv(engine: str, *extra: str) -> list[str]:
    return [sys.executable, "-u", "-m", "gnnscale.cli", "train", "--dataset", DATA, "--hidden", "16", "--device",
            "cpu", "--epochs", str(EPOCHS), *ENGINES[engine], *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if not r.get("summary")]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_losses(engine: str, tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    r = subprocess.run(_argv(engine, "--quiet", "--metrics", str(whole)), env=_env(), capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    proc = subprocess.Popen(_argv(engine, "--checkpoint", str(ck), "--metrics", str(metrics)), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # an epoch's line comes after its checkpoint is on disk
        if line.startswith(f"epoch {KILL_AFTER:>4}/"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    state = load_checkpoint(ck)
    assert state is not None and KILL_AFTER <= state["epoch"] < EPOCHS
    r = subprocess.run(_argv(engine, "--checkpoint", str(ck), "--resume", "--metrics", str(metrics)), env=_env(),
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert f"resuming from {ck} after epoch {state['epoch']}" in r.stdout
    want, got = _losses(whole), _losses(metrics)
    assert len(got) == EPOCHS  # the metrics file continues the old run's records
    if engine == "minibatch":
        assert got == want
    else:
        assert got == pytest.approx(want, rel=1e-6)
    summary = json.loads(metrics.read_text().splitlines()[-1])
    assert summary["summary"] and summary["resumed_from_epoch"] == state["epoch"]


def test_resume_in_the_api_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    g = csbm(nodes=600, avg_degree=6, features=12, seed=0)
    for model, engine in (("gcn", "inmemory"), ("dgcn", "taskparallel")):
        extra = {"devices": ("cpu", "cpu")} if engine == "taskparallel" else {}
        cfg = TrainConfig(model=model, hidden=16, epochs=5, engine=engine, **extra)  # type: ignore[arg-type]
        whole = train(g, cfg, "cpu")
        ck = tmp_path / engine
        first = TrainConfig(model=model, hidden=16, epochs=2, engine=engine, **extra)  # type: ignore[arg-type]
        train(g, first, "cpu", checkpoint=ck)
        seen: list[int] = []
        rest = train(g, cfg, "cpu", checkpoint=ck, resume=True, on_epoch=lambda r, seen=seen: seen.append(r["epoch"]))
        assert seen == [3, 4, 5]
        assert [r["loss"] for r in rest.history] == pytest.approx([r["loss"] for r in whole.history], rel=1e-6)
        for k, v in whole.model.state_dict().items():
            assert torch.allclose(rest.model.state_dict()[k], v, rtol=1e-5, atol=1e-7), k
        assert rest.summary["best_epoch"] == whole.summary["best_epoch"]


def test_an_interrupted_checkpoint_write_leaves_the_previous_one(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, {"epoch": 1, "payload": torch.arange(10)})

    def dies_midway(obj: object, fh: object) -> None:
        fh.write(b"half a checkpoint")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, {"epoch": 2})
    monkeypatch.undo()
    state = load_checkpoint(tmp_path)
    assert state is not None and state["epoch"] == 1 and torch.equal(state["payload"], torch.arange(10))
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE]
    # a writer killed outright leaves its temporary: loading ignores it, the next save removes it
    (tmp_path / f".{FILE}.gnnscale-{_dead_pid()}-x1y2.tmp").write_bytes(b"\0" * 100)
    assert load_checkpoint(tmp_path)["epoch"] == 1  # type: ignore[index]
    save_checkpoint(tmp_path, {"epoch": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE] and load_checkpoint(tmp_path)["epoch"] == 3  # type: ignore[index]


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(("extra", "message"), [
    (["--hidden", "32"], "--hidden 16 -> 32"),
    (["--lr", "0.1", "--model", "sage"], "--model gcn -> sage; --lr 0.01 -> 0.1"),
    (["--dataset", "csbm:nodes=700,avg_degree=6,features=16"], "not csbm"),
])
def test_a_resume_that_changes_the_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    extra: list[str], message: str) -> None:
    ck = tmp_path / "ck"
    base = ["train", "--dataset", DATA, "--hidden", "16", "--epochs", "2", "--quiet", "--checkpoint", str(ck)]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base[:-2], "--epochs", "4", "--checkpoint", str(ck), "--resume", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume:") and err.count("\n") == 1 and message in err, err


def test_checkpoint_flags_are_checked_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    save_checkpoint(ck, {"epoch": 1})
    cases = {
        "--resume needs --checkpoint": ["--resume"],
        "already holds a checkpoint": ["--checkpoint", str(ck)],
        "--checkpoint-every must be >= 1": ["--checkpoint", str(tmp_path / "new"), "--checkpoint-every", "0"],
    }
    for message, extra in cases.items():
        # a dataset that does not exist: the flag error must come first
        assert main(["train", "--dataset", "npz:/nonexistent.npz", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    from dataclasses import asdict

    from gnnscale.checkpoint import check_resumable

    cfg = TrainConfig(epochs=1)
    with pytest.raises(ConfigError, match="already has 1 epochs; raise --epochs"):
        check_resumable({"config": asdict(cfg), "dataset": "x", "num_nodes": 1, "epoch": 1}, cfg, "x", 1)


# ------------------------------------------------------------------------------------- issue #44: trust, round 4
SMALL = "csbm:nodes=300,avg_degree=4,features=64"


def _small_run(ck: Path, *extra: str) -> list[str]:
    return ["train", "--dataset", SMALL, "--hidden", "128", "--epochs", "1", "--quiet", "--device", "cpu",
            "--checkpoint", str(ck), *extra]


def _zero_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(64)
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_or_model_is_refused_in_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    assert main(_small_run(ck)) == 0
    capsys.readouterr()
    for name in (FILE, "model.pt"):
        _zero_middle(ck / name)
        torch.load(ck / name, weights_only=True)  # torch itself does not notice: the block is inside a tensor
    assert main([*_small_run(ck), "--epochs", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --resume: {ck / FILE} is damaged") and err.count("\n") == 1, err
    out = tmp_path / "p.npy"
    assert main(["predict", "--dataset", SMALL, "--model", str(ck / "model.pt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --model {ck / 'model.pt'} is damaged") and err.count("\n") == 1, err
    assert not out.exists()
    from gnnscale.checkpoint import content_digest

    assert main(_small_run(tmp_path / "whole")) == 0
    for name in (FILE, "model.pt"):
        raw = torch.load(tmp_path / "whole" / name, weights_only=True)
        stored = raw.pop("checksum")  # written with the file, over everything else in it
        assert stored == content_digest(raw)


def test_a_file_written_before_checksums_still_loads(tmp_path: Path) -> None:
    from gnnscale.checkpoint import plain

    save_checkpoint(tmp_path, {"epoch": 4, "w": torch.ones(3)})
    old = torch.load(tmp_path / FILE, weights_only=True)
    del old["checksum"]
    torch.save(plain(old), tmp_path / FILE)  # as gnnscale wrote it before
    state = load_checkpoint(tmp_path)
    assert state is not None and state["epoch"] == 4 and "checksum" not in state
    old["checksum"] = "blake2b-256:" + "0" * 64  # a checksum that does not match is refused, though
    torch.save(plain(old), tmp_path / FILE)
    with pytest.raises(ConfigError, match="is damaged"):
        load_checkpoint(tmp_path)


def test_a_resume_on_another_graph_is_refused_naming_the_part(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    ck = tmp_path / "ck"
    base = ["train", "--dataset", "csbm:nodes=400,avg_degree=4,features=8", "--hidden", "8", "--quiet",
            "--device", "cpu", "--checkpoint", str(ck)]
    assert main([*base, "--epochs", "1"]) == 0
    capsys.readouterr()
    # same name, same vertex count, another graph: refused before any epoch
    other = ["--dataset", "csbm:nodes=400,avg_degree=4,features=8,seed=7,homophily=0.9"]
    assert main([*base, "--epochs", "2", "--resume", *other]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume:") and err.count("\n") == 1, err
    assert "its topology, features, labels and split differ" in err, err
    assert load_checkpoint(ck)["epoch"] == 1  # type: ignore[index]

    g = csbm(nodes=200, avg_degree=4, features=8, seed=3)
    cfg = TrainConfig(hidden=8, epochs=1)
    ck2 = tmp_path / "api"
    train(g, cfg, "cpu", checkpoint=ck2)
    assert load_checkpoint(ck2)["fingerprint"]["split"]  # type: ignore[index]
    more = replace(cfg, epochs=2)
    swapped = replace(g, train_mask=g.test_mask, test_mask=g.train_mask)  # trained vertices would be tested on
    x = g.x.clone()  # type: ignore[union-attr]
    x[0, 0] += 1
    y = g.y.clone()  # type: ignore[union-attr]
    y[-1] = (y[-1] + 1) % g.num_classes  # type: ignore[operator]
    for changed, part in ((swapped, "split"), (replace(g, x=x), "features"), (replace(g, y=y), "labels")):
        with pytest.raises(ConfigError, match=f"its {part} differs"):
            train(changed, more, "cpu", checkpoint=ck2, resume=True)
    assert train(g, more, "cpu", checkpoint=ck2, resume=True).summary["resumed_from_epoch"] == 1


def test_the_fingerprint_samples_large_arrays_and_ignores_storage(tmp_path: Path) -> None:
    from dataclasses import replace

    from gnnscale.graph import io
    from gnnscale.graph.fingerprint import SLICE, SLICES, differing_parts, fingerprint

    g = csbm(nodes=5000, avg_degree=4, features=64, seed=1)
    assert g.x is not None and g.x.numel() > SLICES * SLICE  # sampled, not hashed whole
    mapped = io.open_dir(io.save(g, tmp_path / "g"))  # memory-mapped arrays of a converted directory
    assert fingerprint(mapped) == fingerprint(g)
    assert fingerprint(g.with_indices_dtype(torch.int32)) == fingerprint(g)  # the same graph, narrower ids
    x = g.x.clone()
    x[0, 0] += 1  # inside the first slice
    assert differing_parts(fingerprint(g), fingerprint(replace(g, x=x))) == ["features"]
    x = g.x.clone()
    x[-1, -1] += 1  # inside the last slice
    assert differing_parts(fingerprint(g), fingerprint(replace(g, x=x))) == ["features"]
    assert differing_parts(fingerprint(g), fingerprint(replace(g, x=g.x[:, :63].contiguous()))) == ["features"]
