"""README.md's examples run (issue #28, item 13): an example that drifts from the code fails here.

- Every ```python block runs, in order, in one namespace (they build on each other), from the repository root
  (the paths they name are relative to it); skipped with a reason when ../shared/datasets is missing.
- Every ``gnnscale`` command, in a shell block or inline in the text, parses with the CLI's own parser, flag by
  flag and value by value (placeholders such as ``DIR`` stand for paths; nothing is trained).
- Every flag the CLI synopsis (the block with ``[--flag ...]``) lists exists on its command.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from gnnscale.cli.parser import build_parser, join_negative_lists
from gnnscale.errors import GnnscaleError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DATASETS = ROOT.parent / "shared" / "datasets"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
COMMANDS = ("train", "partition", "plan", "predict", "report", "info", "convert")
_COMMAND = "|".join(COMMANDS)


def _blocks(lang: str | None = None) -> list[str]:
    text = README.read_text()
    return [body for kind, body in FENCE.findall(text) if lang is None or kind == lang]


def _shell_lines(body: str) -> list[str]:
    """The block's commands, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = line.split("  #")[0].split(" # ")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


PLACEHOLDERS = {"R": "2", "N": "2", "K": "2", "S": "2", "M": "2", "GIB": "6", "LIST": "cpu", "SPEC": "csbm",
                "DIR": "runs/x", "PATH": "model.pt", "FILE": "out.csv", "RUN.jsonl": "run.jsonl"}
"""Placeholders of the README's commands and a value each stands for."""


def _argv(command: str) -> list[str]:
    """The arguments after ``gnnscale`` (or ``-m gnnscale``), optional brackets and ``...`` dropped, placeholders
    replaced."""
    words = shlex.split(command.replace("[", " ").replace("]", " "))
    start = words.index("gnnscale") + 1
    return [PLACEHOLDERS.get(w, w) for w in words[start:] if w not in ("...", "|")]


def _is_synopsis(body: str) -> bool:
    return "[--" in body


def _commands() -> list[str]:
    """Whole commands: the shell blocks' lines that run gnnscale."""
    found = []
    for body in _blocks():
        if _is_synopsis(body) or body.lstrip().startswith(("import", "from")):
            continue
        found += [line for line in _shell_lines(body)
                  if re.search(rf"(^|\s)gnnscale\s+({_COMMAND})\b", line)]
    return found


def _mentions() -> list[str]:
    """Commands named inline in the text (often partial: ``gnnscale train ... --resume``)."""
    text = FENCE.sub("", README.read_text())
    return [m.group(1) for m in re.finditer(rf"`(gnnscale (?:{_COMMAND})\b[^`]*)`", text)]


def test_the_readme_has_examples_to_check() -> None:
    assert len(_blocks("python")) >= 2
    assert len(_commands()) >= 9 and len(_mentions()) >= 10


@pytest.mark.parametrize("command", _commands())
def test_every_readme_command_parses(command: str) -> None:
    argv = _argv(command)
    if argv[0] not in COMMANDS:
        pytest.fail(f"README command {command!r}: {argv[0]!r} is not a gnnscale command")
    try:
        build_parser().parse_args(join_negative_lists(argv))
    except (SystemExit, GnnscaleError) as exc:
        pytest.fail(f"README command {command!r} does not parse: {exc}")


@pytest.mark.parametrize("mention", _mentions())
def test_every_flag_named_inline_exists(mention: str) -> None:
    argv = _argv(mention)
    unknown = [w.split("=")[0] for w in argv[1:] if w.startswith("--") and w.split("=")[0] not in _flags_of(argv[0])]
    assert not unknown, f"README mentions `{mention}`: {argv[0]} has no {unknown}"


def _flags_of(command: str) -> set[str]:
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return {s for a in sub._actions for s in a.option_strings}


def test_every_flag_of_the_synopsis_exists() -> None:
    synopsis = next(body for body in _blocks() if _is_synopsis(body))
    command = None
    missing = []
    for line in synopsis.splitlines():
        m = re.search(r"gnnscale (\w+)", line)
        if m:
            command = m.group(1)
            line = line[m.start():]  # torchrun's own flags come before it
        assert command is not None
        for flag in re.findall(r"(--[a-z][a-z-]*)", line):
            if flag not in _flags_of(command):
                missing.append(f"{command} {flag}")
    assert not missing, f"flags in the README synopsis that the CLI does not have: {missing}"


@pytest.mark.skipif(not DATASETS.is_dir(), reason=f"the README's examples read {DATASETS}, which is missing")
def test_the_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, body in enumerate(_blocks("python")):
        try:
            exec(compile(body, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 -- any failure of an example is the finding
            pytest.fail(f"README python block {i + 1} fails: {type(exc).__name__}: {exc}")
