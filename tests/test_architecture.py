"""Layering: imports only go down the layers that docs/architecture.md lists (its ``layers`` block is the one
place the order is written), no module imports another inside a function, and there is no import circle.

Every ``import`` is walked with :mod:`ast`: module-level, function-local and ``if TYPE_CHECKING:`` ones alike.
Local imports are allowed only for third-party packages (optional ones such as matplotlib or pymetis, or heavy
ones a command needs late); a local import of a gnnscale module is how circles were hidden before.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gnnscale"
DOC = ROOT / "docs" / "architecture.md"


def read_layers(text: str) -> list[list[str]]:
    """The ``layers`` fenced block of the architecture page: one layer per line, lowest first, module prefixes
    separated by spaces (``#`` starts a comment)."""
    m = re.search(r"```layers\n(.*?)```", text, re.S)
    assert m, "docs/architecture.md has no ```layers block"
    rows = [line.split("#")[0].split() for line in m.group(1).splitlines()]
    return [r for r in rows if r]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PKG) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imports(path: Path, known: set[str], top: str = "gnnscale") -> list[tuple[str, int, bool]]:
    """``(module imported, line, local)`` for every import of a ``top`` module in ``path``; ``local``: inside a
    function. ``from a import b`` names module ``a.b`` when that is a module, else ``a``."""

    def resolve(name: str) -> str:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    tree = ast.parse(path.read_text())
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module == top or child.module.startswith(top + "."):
                    out.extend((resolve(f"{child.module}.{a.name}"), child.lineno, local) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level > 0:
                out.append((f"<relative import level {child.level}>", child.lineno, local))
            elif isinstance(child, ast.Import):
                out.extend((resolve(a.name), child.lineno, local) for a in child.names
                           if a.name == top or a.name.startswith(top + "."))
            visit(child, inner)

    visit(tree, False)
    return out


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """Index of the layer whose longest prefix matches ``module``; the root package (a name without a dot)
    matches only itself, so that a new subpackage must be given its layer."""
    best: tuple[int, int] | None = None
    for i, prefixes in enumerate(layers):
        for p in prefixes:
            if module == p or ("." in p and module.startswith(p + ".")):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    return None if best is None else best[0]


def violations(root: Path, layers: list[list[str]]) -> list[str]:
    """Every broken rule under ``root``, one line each (empty when the package is layered)."""
    mods = modules(root)
    known = set(mods)
    bad: list[str] = []
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        here = layer_of(mod, layers)
        if here is None:
            bad.append(f"{mod}: in no layer of docs/architecture.md")
            continue
        graph[mod] = set()
        for target, line, local in imports(path, known, root.name):
            where = f"{path.relative_to(root.parent)}:{line}"
            if target.startswith("<"):
                bad.append(f"{where}: {target}; import by absolute name")
                continue
            if local:
                bad.append(f"{where}: {target} imported inside a function")
            there = layer_of(target, layers)
            if there is not None and there > here:
                bad.append(f"{where}: {mod} (layer {here}) imports {target} (layer {there}), an upper layer")
            if target != mod:
                graph[mod].add(target)
    bad.extend(f"import circle: {' -> '.join(c)}" for c in circles(graph))
    return bad


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_package_is_layered() -> None:
    layers = read_layers(DOC.read_text())
    assert len(modules()) > 60 and len(layers) >= 8
    assert violations(PKG, layers) == []


def test_every_layer_names_modules_that_exist() -> None:
    names = set(modules())
    stale = [p for layer in read_layers(DOC.read_text()) for p in layer
             if not any(n == p or n.startswith(p + ".") for n in names)]
    assert stale == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


LAYERS = [["pkg.low"], ["pkg.mid"], ["pkg.top", "pkg"]]


@pytest.mark.parametrize("files, expected", [
    ({"low.py": "from pkg.mid import x\n", "mid.py": "", "top.py": ""}, "an upper layer"),
    ({"low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.top import T\n", "mid.py": "",
      "top.py": ""}, "an upper layer"),
    ({"low.py": "", "mid.py": "def f():\n    from pkg.low import y\n", "top.py": ""}, "inside a function"),
    ({"low.py": "", "mid.py": "import pkg.top.sub\n", "top/__init__.py": "", "top/sub.py": ""}, "an upper layer"),
    ({"low.py": "", "mid.py": "from . import low\n", "top.py": ""}, "absolute name"),
    ({"low.py": "", "mid.py": "", "top.py": "", "new.py": ""}, "in no layer"),
    ({"low.py": "", "mid.py": "from pkg import top\n", "top.py": "from pkg import mid\n"}, "an upper layer"),
])
def test_the_check_sees(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    found = violations(_package(tmp_path, files), LAYERS)
    assert any(expected in v for v in found), found


def test_the_check_sees_a_circle_within_a_layer(tmp_path: Path) -> None:
    root = _package(tmp_path, {"low.py": "", "mid.py": "", "top.py": "from pkg.top2 import a\n",
                               "top2.py": "from pkg.top import b\n"})
    found = violations(root, [["pkg.low"], ["pkg.mid"], ["pkg.top", "pkg.top2", "pkg"]])
    assert found == ["import circle: pkg.top -> pkg.top2"]


def test_the_check_passes_a_layered_package(tmp_path: Path) -> None:
    root = _package(tmp_path, {"low.py": "import os\n", "mid.py": "from pkg.low import x\n",
                               "top.py": "import pkg.mid\ndef f():\n    import json\n"})
    assert violations(root, LAYERS) == []


def test_only_the_runtime_names_the_accelerator_api() -> None:
    """Device calls go through gnnscale.runtime: ``torch.cuda`` and ``torch.accelerator`` are named in at most two
    files, both in the runtime (code, comments and docstrings alike)."""
    naming = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                    if re.search(r"torch\.(cuda|accelerator)\b", p.read_text()))
    assert len(naming) <= 2 and all(n.startswith("runtime/") for n in naming), naming


MAX_MODULE_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    """A module a newcomer reads in one sitting: none of the package's is over :data:`MAX_MODULE_LINES` lines (a
    growing one is split by what it holds, as ``plan/offload_moments.py`` left ``plan/offload_memory.py``)."""
    over = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not over, over
