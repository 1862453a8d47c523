"""Layering: the training loop (``gnnscale.train``) and the CLI sit above the engines; nothing below imports
them, so there is no engines <-> train import cycle (``TrainConfig`` lives in ``gnnscale.config``)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "gnnscale"
ABOVE = ("gnnscale.train", "gnnscale.cli")
BELOW = ["config.py", "engines", "plan", "partition", "store", "nn", "sample", "graph", "errors.py", "fsutil.py"]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_nothing_below_the_training_loop_imports_it() -> None:
    files = [f for b in BELOW for f in ((PKG / b).rglob("*.py") if (PKG / b).is_dir() else [PKG / b])]
    assert len(files) > 20
    bad = {str(f.relative_to(PKG)): sorted(i for i in _imports(f) if i.startswith(ABOVE)) for f in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_check_sees_an_import_of_the_loop(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gnnscale.train import TrainConfig\n")
    assert "gnnscale.train.TrainConfig" in _imports(f)
