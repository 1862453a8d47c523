"""README.md's Python snippets run as written, so they cannot rot.

Rule: every ```python fenced block of README.md is executed, in the order it appears, in ONE shared namespace
(``__name__ == "__main__"``, as a user's script would have), because the blocks build on each other (the layer
example uses the ``g`` built in the API example). The working directory is the repository root, so relative
paths such as ``root="../shared/datasets/planetoid"`` resolve as they do for a user who runs the snippets from a
clone with ``../shared`` beside it (as CI does). When a ``root=`` folder a snippet names is missing, the test is
skipped, naming the folder. Tracebacks point at README.md's own line numbers.

Substitution: the code runs as written except that its two trainings on Cora are cut to 2 epochs (``SHORTEN``:
the GCN's ``epochs=200`` and the GAT's default 100). Verbatim, the README takes 16-24 s on 2 idle CPU cores and
over a minute when they are shared; 2 epochs exercise the same API calls in ~3 s. Each substitution must match
exactly once in the Python blocks, or the test fails, so it cannot silently stop applying (edit ``SHORTEN``
together with the README's training lines).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# (README text, what the test runs instead); single-line, so README line numbers are kept
SHORTEN = [
    ('gs.TrainConfig(model="gcn", hidden=16, epochs=200,', 'gs.TrainConfig(model="gcn", hidden=16, epochs=2,'),
    ('gs.TrainConfig(model="gat", hidden=64,', 'gs.TrainConfig(model="gat", hidden=64, epochs=2,'),
]

_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number of the code, code)`` of each ```python fenced block, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_python_blocks_are_found() -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 2, "README.md should have its Python API and layer examples as ```python blocks"
    assert all(code.strip() for _, code in blocks)


def test_readme_python_blocks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "no ```python block found in README.md"
    monkeypatch.chdir(ROOT)
    for _, code in blocks:
        for root in re.findall(r"""root\s*=\s*["']([^"']+)["']""", code):
            if not (ROOT / root).exists():
                pytest.skip(f"README's dataset folder {root!r} not present beside the repository ({(ROOT / root)})")
    for old, new in SHORTEN:
        found = sum(code.count(old) for _, code in blocks)
        assert found == 1, f"README's Python blocks contain {old!r} {found} times, expected once: update SHORTEN"
        blocks = [(line, code.replace(old, new)) for line, code in blocks]
    namespace: dict[str, object] = {"__name__": "__main__"}
    for line, code in blocks:
        # pad with newlines so the compiled code's line numbers are README.md's
        exec(compile("\n" * (line - 1) + code, str(README), "exec"), namespace)
