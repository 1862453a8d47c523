"""Which modules of benchmarks/ are benchmarks: those that define ``cases``, ``run`` and ``render`` (found by
reading their source, so listing them imports nothing)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[1]
REQUIRED = ("cases", "run", "render")


def _defines(path: Path) -> tuple[set[str], str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    doc = (ast.get_docstring(tree) or "").strip().splitlines()
    return names, doc[0] if doc else ""


def benchmarks() -> dict[str, str]:
    """``{name: first line of its docstring}`` for every benchmark module, by name."""
    out = {}
    for path in sorted(BENCH_DIR.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        names, doc = _defines(path)
        if all(n in names for n in REQUIRED):
            out[path.stem] = doc
    return out


def load(name: str) -> ModuleType:
    """The benchmark module ``name``; SystemExit(2-style message) when there is none."""
    known = benchmarks()
    if name not in known:
        raise SystemExit(f"error: no benchmark {name!r}; `python -m benchmarks --list` lists them")
    return importlib.import_module(f"benchmarks.{name}")
