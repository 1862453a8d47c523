"""README.md's examples run (issue #28, item 13): an example that drifts from the code fails here.

- Every ```python block runs, in order, in one namespace (they build on each other), from the repository root
  (the paths they name are relative to it); skipped with a reason when ../shared/datasets is missing.
- Every ``gnnscale`` command, in a shell block or inline in the text, parses with the CLI's own parser, flag by
  flag and value by value (placeholders such as ``DIR`` stand for paths; nothing is trained).
- Every flag the CLI synopsis (the block with ``[--flag ...]``) lists exists on its command.

The page reading (blocks, commands, placeholders) is tests/doc_examples.py's, shared with the guides' tests.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from doc_examples import argv, blocks, commands, flags_of, is_synopsis, mentions, parse, run_python

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DATASETS = ROOT.parent / "shared" / "datasets"
TEXT = README.read_text()


def test_the_readme_has_examples_to_check() -> None:
    assert len(blocks(TEXT, "python")) >= 2
    assert len(commands(TEXT)) >= 9 and len(mentions(TEXT)) >= 10


@pytest.mark.parametrize("command", commands(TEXT))
def test_every_readme_command_parses(command: str) -> None:
    parse(command, "README")


@pytest.mark.parametrize("mention", mentions(TEXT))
def test_every_flag_named_inline_exists(mention: str) -> None:
    args = argv(mention)
    unknown = [w.split("=")[0] for w in args[1:] if w.startswith("--") and w.split("=")[0] not in flags_of(args[0])]
    assert not unknown, f"README mentions `{mention}`: {args[0]} has no {unknown}"


def test_every_flag_of_the_synopsis_exists() -> None:
    synopsis = next(body for body in blocks(TEXT) if is_synopsis(body))
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
    assert not missing, f"flags in the README synopsis that the CLI does not have: {missing}"


@pytest.mark.skipif(not DATASETS.is_dir(), reason=f"the README's examples read {DATASETS}, which is missing")
def test_the_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    run_python(blocks(TEXT, "python"), "README.md", {"__name__": "readme"})
