"""bfloat16 feature storage (issue #29 item 5): ``convert --feature-dtype bf16``, the ``feature_dtype`` dataset
option, the on-disk format, and training on bfloat16 features in the engines (upcast for the model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale import TrainConfig, train
from gnnscale.cli import main
from gnnscale.errors import DatasetError, GraphError
from gnnscale.graph import io
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm

KRON = "kronecker:scale=11,edgefactor=4,features=512,seed=1"


def test_bf16_directory_holds_half_the_feature_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "--dataset", KRON, "--out", str(tmp_path / "fp32")]) == 0
    assert main(["convert", "--dataset", KRON, "--out", str(tmp_path / "bf16"), "--feature-dtype", "bf16"]) == 0
    assert "bfloat16 features" in capsys.readouterr().out
    full, half = ((tmp_path / d / "x.npy").stat().st_size for d in ("fp32", "bf16"))
    assert full > 2048 * 512 * 4 and abs(half - full / 2) < 256  # the .npy headers differ by nothing much
    meta = json.loads((tmp_path / "bf16" / "meta.json").read_text())
    assert meta["feature_dtype"] == "bfloat16" and meta["arrays"]["x"]["dtype"] == "uint16"
    assert json.loads((tmp_path / "fp32" / "meta.json").read_text())["feature_dtype"] == "float32"
    a, b = io.open_dir(tmp_path / "fp32"), io.open_dir(tmp_path / "bf16")
    assert a.x is not None and b.x is not None and b.x.dtype == torch.bfloat16
    assert torch.equal(b.x.view(torch.int16), a.x.to(torch.bfloat16).view(torch.int16))  # bit for bit
    assert torch.equal(a.indices, b.indices) and torch.equal(a.y, b.y)


def test_round_trip_equals_to_bfloat16_and_maps_without_copying(tmp_path: Path) -> None:
    g = csbm(nodes=300, features=16, seed=2)
    assert g.x is not None
    h = g.with_feature_dtype(torch.bfloat16)
    assert h.x is not None and h.nbytes()["features"] * 2 == g.nbytes()["features"]
    io.save(h, tmp_path / "g")
    back = io.open_dir(tmp_path / "g")
    assert back.x is not None and back.x.dtype == torch.bfloat16
    assert torch.equal(back.x.float(), g.x.to(torch.bfloat16).float())
    assert back.equals(replace(h, meta=back.meta))
    arr = np.load(tmp_path / "g" / "x.npy", mmap_mode="r")
    assert arr.dtype == np.uint16 and arr.shape == (300, 16)
    # a directory's bf16 features stay bf16 through load_dataset; fp32 asks for an upcast copy
    assert load_dataset(str(tmp_path / "g")).x.dtype == torch.bfloat16  # type: ignore[union-attr]
    up = load_dataset(f"{tmp_path / 'g'}:feature_dtype=fp32").x
    assert up is not None and up.dtype == torch.float32 and torch.equal(up, back.x.float())


def test_old_directories_read_as_float32(tmp_path: Path) -> None:
    g = csbm(nodes=200, features=8, seed=0)
    io.save(g, tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    del meta["feature_dtype"]  # as written before bfloat16 existed
    (tmp_path / "g" / "meta.json").write_text(json.dumps(meta))
    assert io.open_dir(tmp_path / "g").equals(g)


def test_spec_option_for_in_memory_runs() -> None:
    g = load_dataset("csbm:nodes=200,features=8,feature_dtype=bf16")
    f = load_dataset("csbm:nodes=200,features=8")
    assert g.x is not None and f.x is not None and g.x.dtype == torch.bfloat16
    assert torch.equal(g.x, f.x.to(torch.bfloat16)) and g.meta["spec"] == f.meta["spec"]
    assert load_dataset("csbm:feature_dtype=bf16,nodes=200,features=8").x.dtype == torch.bfloat16  # type: ignore[union-attr]
    assert load_dataset("csbm:nodes=200,features=8", feature_dtype="bf16").x.dtype == torch.bfloat16  # type: ignore[union-attr]
    # the spec's option wins over the argument (as keep_ids does)
    assert load_dataset("csbm:nodes=200,feature_dtype=fp32", feature_dtype="bf16").x.dtype == torch.float32  # type: ignore[union-attr]


def test_unknown_dtypes_are_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DatasetError, match="unknown feature dtype 'fp16'"):
        load_dataset("csbm:nodes=200,feature_dtype=fp16")
    io.save(csbm(nodes=200, features=8), tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    meta["feature_dtype"] = "float16"
    (tmp_path / "g" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="feature_dtype 'float16' is not one this gnnscale reads"):
        io.open_dir(tmp_path / "g")
    for argv in (["info", "--dataset", str(tmp_path / "g")],
                 ["info", "--dataset", "csbm:nodes=200,feature_dtype=int8"],
                 ["convert", "--dataset", "csbm:nodes=200", "--out", str(tmp_path / "o"), "--feature-dtype", "fp8"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
    with pytest.raises(GraphError, match="float32"):
        replace(csbm(nodes=200, features=8), x=torch.zeros(200, 8, dtype=torch.float16))


def _losses(graph: object, cfg: TrainConfig) -> list[tuple[float, float | None]]:
    run = train(graph, cfg, "cpu")  # type: ignore[arg-type]
    return [(r["loss"], r["val_acc"]) for r in run.history]


@pytest.mark.parametrize("engine,model,extra", [
    ("inmemory", "gcn", {}),
    ("inmemory", "dgcn", {}),
    ("minibatch", "sage", {"batch_size": 64, "fanouts": (4, 3)}),
    ("hybrid", "sage", {"batch_size": 64, "fanouts": (4, 3)}),
    ("offload", "gcn", {"partitions": 2}),
    ("taskparallel", "dgcn", {}),
])
def test_bf16_features_train_as_their_float32_upcast(engine: str, model: str, extra: dict) -> None:
    """A run on bfloat16 features gives the losses of a run on the float32 features ``x.to(bf16).float()``:
    the model sees the same float32 values, upcast after the transfer."""
    g = csbm(nodes=300, features=16, seed=1)
    assert g.x is not None
    half = g.with_feature_dtype(torch.bfloat16)
    rounded = replace(g, x=g.x.to(torch.bfloat16).float())
    cfg = TrainConfig(model=model, engine=engine, epochs=2, hidden=8, seed=0, **extra)
    got = _losses(half, cfg)
    assert got == _losses(rounded, cfg)
    assert got != _losses(g, cfg)  # the rounding is real: float32 features train (slightly) differently


def test_distributed_ranks_exchange_bf16_rows_and_train_as_the_upcast(tmp_path: Path) -> None:
    """Two gloo ranks on a bf16 directory (rows exchanged in bfloat16) give the losses of the same directory read
    as float32 (``:feature_dtype=fp32``, the upcast values)."""
    d = tmp_path / "d"
    assert main(["convert", "--dataset", "csbm:nodes=300,features=16,seed=1", "--feature-dtype", "bf16",
                 "--out", str(d)]) == 0
    losses = []
    for i, spec in enumerate((str(d), f"{d}:feature_dtype=fp32")):
        metrics = tmp_path / f"m{i}.jsonl"
        r = subprocess.run([sys.executable, "-m", "gnnscale", "train", "--dataset", spec, "--engine", "distributed",
                            "--ranks", "2", "--epochs", "2", "--hidden", "8", "--batch-size", "64", "--fanouts",
                            "4,3", "--metrics", str(metrics), "--quiet"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr
        recs = [json.loads(line) for line in metrics.read_text().splitlines()]
        losses.append([rec["loss"] for rec in recs if "loss" in rec and "epoch" in rec])
    assert len(losses[0]) == 2 and losses[0] == losses[1]
