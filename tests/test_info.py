"""Issue #44 item 22: what ``info`` and the run's record say about the data: made-up parts, the features' stored
dtype, unlabelled vertices, and where a converted directory came from (its path, its dtype, its chain)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gnnscale.cli import main
from gnnscale.graph import io
from gnnscale.testing import tiny_graph


def _tiny_dir(tmp: Path, name: str, dtype: torch.dtype = torch.float32, unlabelled: bool = False) -> Path:
    g = tiny_graph()
    assert g.x is not None and g.y is not None
    g.x = g.x.to(dtype)
    if unlabelled:  # vertices 4 and 5 (the test mask's) unlabelled: no test split
        g.y = torch.tensor([0, 1, 0, 1, -1, -1])
        g.test_mask = None
    g.meta = {"spec": "tiny:source"}
    return io.save(g, tmp / name)


def _info(capsys: pytest.CaptureFixture[str], spec: str) -> dict[str, str]:
    assert main(["info", "--dataset", spec]) == 0
    return {ln[:12].strip(): ln[12:] for ln in capsys.readouterr().out.splitlines()}


def test_info_says_the_stored_dtype_and_the_unlabelled_vertices(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    lines = _info(capsys, str(_tiny_dir(tmp_path, "g", torch.bfloat16, unlabelled=True)))
    assert lines["features"] == "3, stored as bfloat16"
    assert lines["classes"] == "2; 2 of 6 vertices unlabelled (label -1)"
    assert main(["info", "--dataset", str(tmp_path / "g"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["feature_dtype"], st["unlabelled_nodes"], st["made_up"]) == ("bfloat16", 2, [])


def test_info_says_what_a_reader_made_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edges = tmp_path / "e.txt"
    edges.write_text("0 1\n1 2\n2 0\n")
    lines = _info(capsys, f"edgelist:{edges}")
    assert "made up" in lines["features"] and "made up" in lines["classes"]
    assert "made up" not in " ".join(_info(capsys, str(_tiny_dir(tmp_path, "g"))).values())


def test_a_run_records_the_directory_and_its_dtype(tmp_path: Path) -> None:
    specs = {}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        d = _tiny_dir(tmp_path, name, dtype)
        metrics = tmp_path / f"{name}.jsonl"
        assert main(["train", "--dataset", str(d), "--epochs", "1", "--device", "cpu", "--quiet", "--hidden", "4",
                     "--metrics", str(metrics)]) == 0
        specs[name] = json.loads(metrics.read_text().splitlines()[-1])["dataset_spec"]
    assert specs == {"fp32": f"{tmp_path / 'fp32'}:feature_dtype=fp32",
                     "bf16": f"{tmp_path / 'bf16'}:feature_dtype=bf16"}


def test_converting_back_to_fp32_records_the_conversion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _tiny_dir(tmp_path, "bf16", torch.bfloat16)
    out = tmp_path / "fp32"
    assert main(["convert", "--dataset", str(src), "--feature-dtype", "fp32", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())["meta"]
    assert meta["spec"] == f"{src}:feature_dtype=fp32" and meta["converted_from"] == ["tiny:source"]
    capsys.readouterr()
    line = _info(capsys, str(out))["spec"]
    assert line == f"{out}:feature_dtype=fp32 <- {src}:feature_dtype=fp32 <- tiny:source"
