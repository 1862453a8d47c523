"""The API reference (docs/, built by ``make docs``) covers the whole package: every subpackage of gnnscale and
every public top-level module appears in an ``automodule`` directive, and every directive names a module that
exists. Reads the reStructuredText sources only, so it needs no Sphinx; the build itself (``sphinx-build -W``, a
warning fails it) is ``make docs``, which CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gnnscale"
DOCS = ROOT / "docs"
AUTOMODULE = re.compile(r"^\s*\.\.\s+automodule::\s+(\S+)\s*$", re.MULTILINE)


def documented_modules() -> set[str]:
    return {m for page in DOCS.rglob("*.rst") for m in AUTOMODULE.findall(page.read_text())}


def public_modules() -> set[str]:
    """``gnnscale``, its subpackages (``gnnscale.graph``, ...) and its top-level modules not starting with ``_``."""
    subpackages = {f"gnnscale.{d.name}" for d in PKG.iterdir() if (d / "__init__.py").is_file()}
    modules = {f"gnnscale.{f.stem}" for f in PKG.glob("*.py") if not f.stem.startswith("_")}
    return {"gnnscale"} | subpackages | modules


def module_exists(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return (path / "__init__.py").is_file() or path.with_suffix(".py").is_file()


def test_every_public_module_is_in_the_reference():
    missing = sorted(public_modules() - documented_modules())
    assert not missing, f"add an `.. automodule::` for each to a page of docs/api/: {missing}"


def test_every_automodule_names_a_module():
    stale = sorted(m for m in documented_modules() if not module_exists(m))
    assert not stale, f"docs/ documents modules that do not exist: {stale}"


def test_every_reference_page_is_in_the_toctree():
    index = (DOCS / "api" / "index.rst").read_text()
    listed = set(re.findall(r"^   (\w+)$", index, re.MULTILINE))
    pages = {p.stem for p in (DOCS / "api").glob("*.rst")} - {"index"}
    assert pages <= listed, f"docs/api/index.rst's toctree misses {sorted(pages - listed)}"
