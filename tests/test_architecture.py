"""Layering: imports only go down the layers that docs/architecture.md lists (its ``layers`` block is the one
place the order is written), the packages of one layer separated by ``|`` (the engine families) never import each
other, no module imports another inside a function, and there is no import circle.

Every ``import`` is walked with :mod:`ast`: module-level, function-local and ``if TYPE_CHECKING:`` ones alike.
Local imports are allowed only for third-party packages (optional ones such as matplotlib or pymetis, or heavy
ones a command needs late); a local import of a gnnscale module is how circles were hidden before.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gnnscale"
DOC = ROOT / "docs" / "architecture.md"


def _layer_lines(text: str) -> list[str]:
    m = re.search(r"```layers\n(.*?)```", text, re.S)
    assert m, "docs/architecture.md has no ```layers block"
    return [line.split("#")[0] for line in m.group(1).splitlines() if line.split("#")[0].strip()]


def read_layers(text: str) -> list[list[str]]:
    """The ``layers`` fenced block of the architecture page: one layer per line, lowest first, module prefixes
    separated by spaces, or by `` | `` where they are apart (:func:`read_apart`; ``#`` starts a comment)."""
    return [line.replace("|", " ").split() for line in _layer_lines(text)]


def read_apart(text: str) -> list[set[str]]:
    """The layers of the ``layers`` block whose prefixes are separated by ``|``: packages side by side that never
    import each other (the engine families), each layer as the set of its prefixes."""
    return [set(line.replace("|", " ").split()) for line in _layer_lines(text) if "|" in line]


def _prefix_of(module: str, prefixes: set[str]) -> str | None:
    """The longest prefix of ``prefixes`` that ``module`` is or is inside."""
    found = [p for p in prefixes if module == p or module.startswith(p + ".")]
    return max(found, key=len, default=None)


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


def violations(root: Path, layers: list[list[str]], apart: Sequence[set[str]] = ()) -> list[str]:
    """Every broken rule under ``root``, one line each (empty when the package is layered). ``apart``: groups of
    prefixes (:func:`read_apart`) of which no one imports another."""
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
            for group in apart:
                mine, theirs = _prefix_of(mod, group), _prefix_of(target, group)
                if mine and theirs and mine != theirs:
                    bad.append(f"{where}: {mod} imports {target}: {mine} and {theirs} are apart (a sibling)")
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
    assert violations(PKG, layers, read_apart(DOC.read_text())) == []


FAMILIES = {"gnnscale.engines.offload", "gnnscale.engines.taskparallel", "gnnscale.engines.sampled"}


def test_the_engine_families_are_apart_above_core() -> None:
    """Inside gnnscale/engines/: ``core`` below the families; the families (one layer, apart) below the registry
    and the in-memory engine, so that a family imports core and the layers under the engines, never another
    family, the registry or inmemory; core imports no family."""
    text = DOC.read_text()
    layers = read_layers(text)
    core = layer_of("gnnscale.engines.core", layers)
    family = {layer_of(f, layers) for f in FAMILIES}
    top = layer_of("gnnscale.engines", layers)
    assert core is not None and top is not None and len(family) == 1
    assert core < family.pop() < top == layer_of("gnnscale.engines.inmemory", layers)
    assert FAMILIES in read_apart(text)


TOP_LEVEL_ENGINE_MODULES = {"__init__.py", "inmemory.py"}
"""What sits directly in gnnscale/engines/: the registry and the in-memory engine (the reference, no family)."""


def test_no_module_sits_directly_in_the_engines_but_the_registrys() -> None:
    engines = PKG / "engines"
    assert {p.name for p in engines.glob("*.py")} == TOP_LEVEL_ENGINE_MODULES
    assert {p.name for p in engines.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "core", "offload", "taskparallel", "sampled"}
    assert all((engines / d / "__init__.py").is_file() for d in ("core", "offload", "taskparallel", "sampled"))


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


FAMILY_LAYERS = [["pkg.core"], ["pkg.fam_a", "pkg.fam_b"], ["pkg.reg", "pkg"]]


@pytest.mark.parametrize("files, expected", [
    ({"core.py": "", "fam_a/__init__.py": "", "fam_a/x.py": "from pkg.fam_b.y import z\n", "fam_b/__init__.py": "",
      "fam_b/y.py": ""}, "are apart"),
    ({"core.py": "", "fam_a.py": "import pkg.fam_b\n", "fam_b.py": ""}, "are apart"),
    ({"core.py": "from pkg.fam_a import x\n", "fam_a.py": "", "fam_b.py": ""}, "an upper layer"),
    ({"core.py": "", "fam_a.py": "from pkg import reg\n", "fam_b.py": "", "reg.py": ""}, "an upper layer"),
])
def test_the_check_sees_a_family_import(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    found = violations(_package(tmp_path, files), FAMILY_LAYERS, [{"pkg.fam_a", "pkg.fam_b"}])
    assert any(expected in v for v in found), found


def test_the_check_passes_families_that_import_core(tmp_path: Path) -> None:
    root = _package(tmp_path, {"core.py": "", "fam_a/__init__.py": "from pkg.fam_a.x import X\n",
                               "fam_a/x.py": "from pkg.core import c\nfrom pkg.fam_a.y import z\n", "fam_a/y.py": "",
                               "fam_b.py": "import pkg.core\n", "reg.py": "from pkg.fam_a import X\n"})
    assert violations(root, FAMILY_LAYERS, [{"pkg.fam_a", "pkg.fam_b"}]) == []


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
