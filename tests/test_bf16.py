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
from gnnscale.engines import OffloadEngine
from gnnscale.errors import DatasetError, GraphError
from gnnscale.graph import io
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.store.global_store import GlobalMemoryStore

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
    assert torch.equal(g.x, f.x.to(torch.bfloat16))
    assert g.meta["spec"] == f.meta["spec"] + ":feature_dtype=bf16"  # the record tells the runs apart (#44 item 22)
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


def test_store_keeps_bf16_rows_and_counts_half_the_bytes() -> None:
    """The mini-batch store holds bfloat16 features as they are (host memory: the graph's own tensor, no float32
    copy; the devices' hot rows), moves them at 2 bytes an element, and fits twice the hot rows in a budget."""
    g = csbm(nodes=400, features=16, seed=1)
    half = g.with_feature_dtype(torch.bfloat16)
    assert half.x is not None
    up = replace(g, x=half.x.float())
    cpus = [torch.device("cpu"), torch.device("cpu:1")]
    ids = torch.randint(0, 400, (500,), generator=torch.Generator().manual_seed(0))
    stats, stores = [], []
    for graph in (half, up):
        store = GlobalMemoryStore(graph, cpus, gpu_graph_ratio=0.2, gpu_feature_ratio=0.3)
        got = store.features(ids, reader=0)
        assert got.dtype == graph.x.dtype and torch.equal(got.float(), up.x[ids])  # type: ignore[union-attr,index]
        stats.append(store.stats)
        stores.append(store)
    b, f = stats
    assert b.h2d_feature_bytes > 0 and b.h2d_feature_bytes * 2 == f.h2d_feature_bytes
    assert b.d2d_bytes > 0 and b.d2d_bytes * 2 == f.d2d_bytes
    assert b.rows_from == f.rows_from  # the same rows from the same tiers: only their size differs
    host = stores[0].host_x
    assert host.dtype == torch.bfloat16 and host.element_size() == 2 and host.data_ptr() == half.x.data_ptr()
    feats = [sum(t.numel() * t.element_size() for xs in s.dev_x for t in xs.values()) for s in stores]
    assert feats[0] > 0 and feats[0] * 2 == feats[1]
    # the placement fit prices rows at their real size: a budget of 100 float32 rows holds 200 bfloat16 ones
    budget = 400 * 8 + 8 + 100 * 16 * 4  # the rank directory, the closing row pointer, the rows
    hot = [GlobalMemoryStore(graph, cpus[:1], gpu_graph_ratio=0.0, gpu_feature_ratio=None,
                             memory_budget=budget).hot_features for graph in (half, up)]
    assert hot == [200, 100]


def test_offload_reads_a_bf16_directory_from_disk_as_the_in_memory_run(tmp_path: Path) -> None:
    """--host-memory on a bf16 directory: offload reads x.npy's bfloat16 rows (2 bytes an element) and upcasts
    them after the read; the losses are the in-memory bf16 run's."""
    g = csbm(nodes=600, features=16, avg_degree=6, seed=5)
    io.save(g.with_feature_dtype(torch.bfloat16), tmp_path / "b")
    io.save(g, tmp_path / "f")

    def run(d: str, host_memory: str | None) -> tuple[OffloadEngine, list[dict[str, float]]]:
        graph = io.open_dir(tmp_path / d)
        cfg = TrainConfig(model="gcn", layers=2, hidden=8, engine="offload", chunks=3, epochs=2,
                          host_memory=host_memory)
        assert graph.num_classes is not None
        net = build_model(cfg.model, graph.num_features, cfg.hidden, graph.num_classes, layers=cfg.layers,
                          dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
        eng = OffloadEngine(graph, net, cfg, torch.device("cpu"))
        return eng, [eng.train_epoch(e) for e in (1, 2)]

    _, plain = run("b", None)
    eng, disk = run("b", "750KB")
    assert eng.disk and all(d.dtype == torch.bfloat16 for d in eng.disk)
    assert [r["loss"] for r in disk] == [r["loss"] for r in plain]
    _, full = run("f", "750KB")
    for r, f in zip(disk, full, strict=True):
        assert r["disk_read_bytes"] > 0 and r["disk_read_bytes"] * 2 == f["disk_read_bytes"]
