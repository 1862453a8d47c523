"""README.md and the pages its sections moved to run as written (issue #28, item 13; issue #48): an example that
drifts from the code fails here.

- README.md is an at-a-glance page: at most :data:`MAX_LINES` lines, and every relative link in it (and in the
  pages below) names a file that exists.
- Every ```python block of the README runs, in order, in one namespace (they build on each other), from the
  repository root (the paths they name are relative to it); skipped with a reason when ../shared/datasets is missing.
- Every ``gnnscale`` command of the README and of the pages of docs/ that hold its former sections
  (:data:`PAGES`), in a shell block or inline in the text, parses with the CLI's own parser, flag by flag and value
  by value (placeholders such as ``DIR`` stand for paths; nothing is trained).
- Every flag the CLI synopsis (docs/cli.md's block with ``[--flag ...]``) lists exists on its command.
- Each of those pages is in the Sphinx toctree, and the README links to it.

The page reading (blocks, commands, placeholders) is tests/doc_examples.py's, shared with the guides' tests.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from doc_examples import FENCE, argv, blocks, commands, flags_of, is_synopsis, mentions, parse, run_python

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DATASETS = ROOT.parent / "shared" / "datasets"
TEXT = README.read_text()
MAX_LINES = 300
"""The README's length at most: what it is, the two commands, the quick starts, the engines, links to docs/."""
MOVED = ("cli", "long-runs", "engines", "models", "datasets", "disk", "results", "predict")
"""The docs/ pages that hold what the README held before it was cut to a glance (docs/NAME.md), and the guides
written since that the README links the same way (predict)."""
PAGES = {"README.md": TEXT} | {f"docs/{name}.md": (ROOT / "docs" / f"{name}.md").read_text() for name in MOVED}
"""Every page whose commands are checked: the README and the pages of :data:`MOVED`."""
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def page_commands() -> list[tuple[str, str]]:
    return [(page, c) for page, text in PAGES.items() for c in commands(text)]


def page_mentions() -> list[tuple[str, str]]:
    return [(page, m) for page, text in PAGES.items() for m in mentions(text)]


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links and images outside the fenced blocks that are paths (not web addresses,
    not anchors on the same page), without their ``#fragment``."""
    targets = LINK.findall(FENCE.sub("", text))
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_the_readme_is_at_a_glance() -> None:
    lines = len(TEXT.splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines, more than {MAX_LINES}: move a section into docs/"


@pytest.mark.parametrize("page", list(PAGES))
def test_every_relative_link_resolves(page: str) -> None:
    base = (ROOT / page).parent
    links = relative_links(PAGES[page])
    missing = [t for t in links if not (base / t).exists()]
    assert not missing, f"{page} links to files that do not exist: {missing}"


def test_relative_links_are_found() -> None:
    text = "[a](docs/x.md) ![i](docs/p.png) [w](https://e.org/y) [s](#top) [f](docs/y.md#part)\n```\n[b](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md", "docs/p.png", "docs/y.md"]


@pytest.mark.parametrize("name", MOVED)
def test_every_moved_page_is_linked_from_the_readme_and_in_the_toctree(name: str) -> None:
    assert f"docs/{name}.md" in relative_links(TEXT), f"README.md does not link docs/{name}.md"
    index = (ROOT / "docs" / "index.rst").read_text()
    assert re.search(rf"^   {re.escape(name)}$", index, re.M), f"docs/index.rst's Guides toctree misses {name}"


def test_the_pages_have_examples_to_check() -> None:
    assert len(blocks(TEXT, "python")) >= 2
    assert len(commands(TEXT)) >= 6
    assert len(page_commands()) >= 15 and len(page_mentions()) >= 20
    assert any(is_synopsis(body) for body in blocks(PAGES["docs/cli.md"]))


@pytest.mark.parametrize(("page", "command"), page_commands())
def test_every_command_parses(page: str, command: str) -> None:
    parse(command, page)


@pytest.mark.parametrize(("page", "mention"), page_mentions())
def test_every_flag_named_inline_exists(page: str, mention: str) -> None:
    args = argv(mention)
    unknown = [w.split("=")[0] for w in args[1:] if w.startswith("--") and w.split("=")[0] not in flags_of(args[0])]
    assert not unknown, f"{page} mentions `{mention}`: {args[0]} has no {unknown}"


def test_every_flag_of_the_synopsis_exists() -> None:
    synopsis = next(body for body in blocks(PAGES["docs/cli.md"]) if is_synopsis(body))
    command = None
    missing = []
    for line in synopsis.splitlines():
        m = re.search(r"gnnscale (\w+)", line)
        if m:
            command = m.group(1)
            line = line[m.start():]  # torchrun's own flags come before it
        assert command is not None
        for flag in re.findall(r"(--[a-z][a-z-]*)", line):
            if flag not in flags_of(command):
                missing.append(f"{command} {flag}")
    assert not missing, f"flags in the docs/cli.md synopsis that the CLI does not have: {missing}"


@pytest.mark.skipif(not DATASETS.is_dir(), reason=f"the README's examples read {DATASETS}, which is missing")
def test_the_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    run_python(blocks(TEXT, "python"), "README.md", {"__name__": "readme"})
