"""The gnnscale command: bad input gives exit 2 and one error line; metrics are JSON Lines; info; convert."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gnnscale.cli import main
from gnnscale.graph import io
from gnnscale.testing import need_file, tiny_graph

SMALL = "csbm:nodes=300,features=8"


def _bad_inputs(tmp: Path) -> dict[str, list[str]]:
    """Each entry: a kind of bad input -> argv. Every one must exit 2 with one 'error:' line."""
    garbage = tmp / "garbage.npz"
    garbage.write_bytes(b"\x00\x01 not an npz at all")
    corrupt_gz = tmp / "corrupt.txt.gz"
    corrupt_gz.write_bytes(b"\x1f\x8b\x08\x00 truncated gzip")
    odd = tmp / "odd.txt"
    odd.write_text("0 1\n2\n")
    neg = tmp / "neg.txt"
    neg.write_text("0 1\n-3 2\n")
    bad_graph = tmp / "badgraph"
    io.save(tiny_graph(), bad_graph)
    import numpy as np

    labels = np.load(bad_graph / "y.npy")
    labels[0] = 9  # outside [0, num_classes)
    np.save(bad_graph / "y.npy", labels)
    overlap = tmp / "overlap"
    g = tiny_graph()
    g.val_mask = g.train_mask.clone()  # every training vertex also validates
    io.save(g, overlap)
    no_meta = tmp / "nometa"
    no_meta.mkdir()
    exists = tmp / "exists"
    exists.mkdir()
    m = str(tmp / "metrics.jsonl")
    return {
        "unknown flag": ["train", "--bogus"],
        "non-integer epochs": ["train", "--epochs", "ten", "--metrics", m],
        "zero epochs": ["train", "--dataset", SMALL, "--epochs", "0", "--metrics", m],
        "dropout out of range": ["train", "--dataset", SMALL, "--dropout", "1.5", "--metrics", m],
        "negative lr": ["train", "--dataset", SMALL, "--lr", "-0.1", "--metrics", m],
        "unknown host allocator": ["train", "--dataset", SMALL, "--host-allocator", "jemalloc", "--metrics", m],
        "unknown model": ["train", "--model", "transformer", "--metrics", m],
        "unknown dataset": ["train", "--dataset", "imagenet", "--metrics", m],
        "bad dataset option": ["train", "--dataset", "csbm:nodes=many", "--metrics", m],
        "unknown dataset option": ["train", "--dataset", "csbm:colour=red", "--metrics", m],
        "missing file": ["train", "--dataset", f"npz:{tmp}/missing.npz", "--metrics", m],
        "corrupt npz": ["train", "--dataset", f"npz:{garbage}", "--metrics", m],
        "corrupt gzip": ["info", "--dataset", f"edgelist:{corrupt_gz}"],
        "odd edge list": ["info", "--dataset", f"edgelist:{odd}"],
        "negative vertex id": ["info", "--dataset", f"edgelist:{neg}"],
        "invalid graph (label out of range)": ["train", "--dataset", str(bad_graph), "--metrics", m],
        "directory without meta.json": ["info", "--dataset", str(no_meta)],
        "planetoid without files": ["train", "--dataset", "planetoid:cora", "--root", str(tmp), "--metrics", m],
        "memory budget too small": ["train", "--dataset", SMALL, "--memory-budget", "1KB", "--metrics", m],
        "unreadable memory budget": ["train", "--dataset", SMALL, "--memory-budget", "lots", "--metrics", m],
        "GAT hidden not divisible by heads": ["train", "--model", "gat", "--hidden", "10", "--heads", "4"],
        "unknown device": ["train", "--dataset", SMALL, "--device", "tpu", "--metrics", m],
        "metrics under a file": ["train", "--dataset", SMALL, "--metrics", str(garbage / "m.jsonl")],
        "convert onto existing directory": ["convert", "--dataset", SMALL, "--out", str(exists)],
        "missing required flag": ["convert", "--dataset", SMALL],
        "offload budget below its minimum": ["train", "--dataset", SMALL, "--engine", "offload", "--gpu-memory",
                                            "1KB", "--metrics", m],
        "zero chunks": ["train", "--dataset", SMALL, "--engine", "offload", "--chunks", "0", "--metrics", m],
        "negative gpu memory": ["train", "--dataset", SMALL, "--gpu-memory", "-1", "--metrics", m],
        "unknown partition method": ["train", "--dataset", SMALL, "--partition-method", "spectral", "--metrics", m],
        "uva gather without CUDA": ["train", "--dataset", SMALL, "--engine", "offload", "--gather", "uva",
                                    "--device", "cpu", "--metrics", m],
        "zero partitions": ["partition", "--dataset", SMALL, "--partitions", "0"],
        "more chunks than vertices": ["partition", "--dataset", SMALL, "--chunks", "1000000"],
        "unknown dedup mode": ["train", "--dataset", SMALL, "--engine", "offload", "--dedup", "some", "--metrics", m],
        "unknown chunker": ["train", "--dataset", SMALL, "--chunker", "spectral", "--metrics", m],
        "unknown reorganize mode": ["train", "--dataset", SMALL, "--reorganize", "maybe", "--metrics", m],
        "empty device in --devices": ["train", "--dataset", SMALL, "--devices", "cpu,,cpu", "--metrics", m],
        "more devices than partitions": ["train", "--dataset", SMALL, "--engine", "offload", "--devices", "cpu,cpu",
                                         "--metrics", m],
        "mixed device kinds": ["train", "--dataset", SMALL, "--devices", "cpu,cuda:0", "--metrics", m],
        "non-integer fanouts": ["train", "--dataset", SMALL, "--engine", "minibatch", "--fanouts", "a,b",
                                "--metrics", m],
        "fanouts not matching layers": ["train", "--dataset", SMALL, "--engine", "minibatch", "--fanouts", "10",
                                        "--metrics", m],
        "a share outside (0, 1)": ["train", "--dataset", SMALL, "--engine", "minibatch", "--devices", "cpu,cpu",
                                   "--shares", "1.5,-0.5", "--metrics", m],
        "shares not numbers": ["train", "--dataset", SMALL, "--engine", "minibatch", "--shares", "half",
                               "--metrics", m],
        "overlapping train and validation splits": ["train", "--dataset", str(overlap), "--metrics", m],
        "eval fanouts not matching layers": ["train", "--dataset", SMALL, "--engine", "minibatch", "--eval-fanouts",
                                             "5,5,5", "--metrics", m],
        "zero batch size": ["train", "--dataset", SMALL, "--engine", "minibatch", "--batch-size", "0", "--metrics", m],
        "feature ratio above 1": ["train", "--dataset", SMALL, "--engine", "minibatch", "--gpu-feature-ratio", "2",
                                  "--metrics", m],
        "--device against --devices": ["train", "--dataset", SMALL, "--device", "cuda:0", "--devices", "cpu",
                                       "--metrics", m],
    }


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _bad_inputs(tmp_path)
    assert len(cases) >= 10
    for what, argv in cases.items():
        code = main(argv)
        out = capsys.readouterr()
        lines = out.err.strip().splitlines()
        assert code == 2, f"{what}: exit {code}, stderr {out.err!r}"
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {out.err!r}"
        assert "Traceback" not in out.err
        assert not (tmp_path / "metrics.jsonl").exists(), what
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], f"{what}: temporary left behind"


def test_console_script_exit_status_without_traceback(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gnnscale.cli", "train", "--dataset", "csbm:nodes=-5"],
        capture_output=True, text=True, check=False,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


def test_metrics_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", SMALL, "--epochs", "3", "--hidden", "8", "--metrics", str(m)]) == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out and sum(ln.startswith("epoch ") for ln in out.splitlines()) == 3
    recs = [json.loads(line) for line in m.read_text().splitlines()]
    assert [r["epoch"] for r in recs[:-1]] == [1, 2, 3]
    for r in recs[:-1]:
        for k in ("epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_time_s", "peak_device_bytes"):
            assert k in r, k
    s = recs[-1]
    assert s["summary"] is True
    for k in ("best_val_acc", "test_acc_at_best_val", "final_test_acc", "total_time_s"):
        assert k in s
    assert set(s["timings"]) >= {"load_s", "setup_s", "ready_s", "epoch_s"} and s["timings"]["ready_s"] > 0
    assert s["final_test_acc"] == recs[-2]["test_acc"]
    # same seed -> identical metrics except the measurements
    m2 = tmp_path / "m2.jsonl"
    assert main(["train", "--dataset", SMALL, "--epochs", "3", "--hidden", "8", "--quiet", "--metrics", str(m2)]) == 0
    drop = ("epoch_time_s", "peak_device_bytes", "total_time_s", "timings")
    strip = [{k: v for k, v in json.loads(x).items() if k not in drop} for x in m2.read_text().splitlines()]
    assert strip == [{k: v for k, v in r.items() if k not in drop} for r in recs]
    quiet_out = capsys.readouterr().out.splitlines()
    assert quiet_out and not any(ln.startswith("epoch ") for ln in quiet_out)  # --quiet: no per-epoch lines


def test_info_and_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "e.txt.gz"
    with gzip.open(f, "wt") as fh:
        fh.write("# nodes 5\n0 1\n1 2\n2 2\n")
    assert main(["info", "--dataset", f"edgelist:{f}"]) == 0
    out = capsys.readouterr().out
    for word in ("nodes       5", "edges       3", "1 self-loops", "in-degree", "out-degree", "memory"):
        assert word in out, word
    assert main(["convert", "--dataset", f"edgelist:{f}", "--out", str(tmp_path / "g")]) == 0
    assert main(["info", "--dataset", str(tmp_path / "g"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (st["nodes"], st["edges"], st["self_loops"]) == (5, 3, 1)


def test_info_says_what_the_reader_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`info` names where the weights came from and whether the edges were symmetrised on load; a converted
    directory opened with another --seed says its split is fixed."""
    f = tmp_path / "w.txt"
    f.write_text("0 1 0.5\n1 2 2\n2 2 1\n")
    assert main(["info", "--dataset", f"edgelist:{f}"]) == 0
    out = capsys.readouterr()
    assert "edges       3 (" in out.out and ", unweighted)" in out.out and "column 3 ignored" in out.err
    assert main(["info", "--dataset", f"edgelist:{f}:weight_column=3,symmetrize=1"]) == 0
    out = capsys.readouterr()
    assert "edges       5 (" in out.out and "weighted (column 3 of w.txt); symmetrised on load from 3 listed edges" \
        in out.out
    assert out.err == "note: symmetrised w.txt: 3 -> 5 edges\n"
    assert main(["convert", "--dataset", f"edgelist:{f}:weight_column=3", "--seed", "3",
                 "--out", str(tmp_path / "g")]) == 0
    capsys.readouterr()
    assert main(["info", "--dataset", str(tmp_path / "g"), "--json", "--seed", "3"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and json.loads(out.out)["weights_from"] == "column 3 of w.txt"
    assert main(["info", "--dataset", str(tmp_path / "g")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("note: ") and "drawn with seed 3" in err and err.count("\n") == 1, err


def test_info_web_cnr(capsys: pytest.CaptureFixture[str]) -> None:
    f = need_file("snap/web-cnr-2000.txt.gz")
    assert main(["info", "--dataset", f"edgelist:{f}", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["nodes"], st["edges"]) == (325557, 3216152)
    assert st["in_degree"]["max"] > st["in_degree"]["mean"] > 1
    assert st["bytes"]["topology"] == 8 * (325557 + 1) + 8 * 3216152


def test_sigterm_ends_training_with_one_line_and_keeps_the_finished_epochs(tmp_path: Path) -> None:
    import signal

    metrics = tmp_path / "m.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "gnnscale.cli", "train", "--dataset", "csbm:nodes=2000", "--epochs", "100000",
         "--metrics", str(metrics)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:  # wait until training runs (no sleep: the first epoch line says so)
        if line.startswith("epoch "):
            break
    proc.send_signal(signal.SIGTERM)
    proc.stdout.read()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert err == "error: terminated\n", err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    # each finished epoch was appended as it finished (the first before its line was printed); no summary
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert recs and [r["epoch"] for r in recs] == list(range(1, len(recs) + 1))
    assert not any(r.get("summary") for r in recs)
