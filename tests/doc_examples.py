"""Reading a Markdown page's examples, for the tests that run them (tests/test_readme.py: README.md;
tests/test_own_model_guide.py: docs/own-model.md).

- :func:`blocks`: the fenced blocks, by language; :func:`run_python`: the ```python ones executed in order in one
  namespace, a failing block reported by its number.
- :func:`commands` (whole ``gnnscale`` commands of the shell blocks) and :func:`mentions` (commands named inline
  in backticks), turned into argument lists by :func:`argv` (placeholders such as ``DIR`` replaced by a value);
  :func:`parse` runs the CLI's own parser on one; :func:`flags_of` lists a command's flags.
"""

from __future__ import annotations

import re
import shlex

import pytest

from gnnscale.cli.parser import build_parser, join_negative_lists
from gnnscale.errors import GnnscaleError

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
COMMANDS = ("train", "partition", "plan", "predict", "report", "info", "convert")
_COMMAND = "|".join(COMMANDS)
SHELLS = ("", "sh", "bash", "shell", "console")
"""Languages of the fenced blocks that hold commands (a block without one is shown as plain text)."""

PLACEHOLDERS = {"R": "2", "N": "2", "K": "2", "S": "2", "M": "2", "GIB": "6", "LIST": "cpu", "SPEC": "csbm",
                "DIR": "runs/x", "PATH": "model.pt", "FILE": "out.csv", "RUN.jsonl": "run.jsonl"}
"""Placeholders of the pages' commands and a value each stands for."""


def blocks(text: str, lang: str | None = None) -> list[str]:
    """The bodies of ``text``'s fenced blocks, of language ``lang`` (every block when ``None``)."""
    return [body for kind, body in FENCE.findall(text) if lang is None or kind == lang]


def shell_lines(body: str) -> list[str]:
    """The block's commands, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = line.split("  #")[0].split(" # ")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def argv(command: str) -> list[str]:
    """The arguments after ``gnnscale`` (or ``-m gnnscale``), optional brackets and ``...`` dropped, placeholders
    replaced."""
    words = shlex.split(command.replace("[", " ").replace("]", " "))
    start = words.index("gnnscale") + 1
    return [PLACEHOLDERS.get(w, w) for w in words[start:] if w not in ("...", "|")]


def is_synopsis(body: str) -> bool:
    """Whether a block is a synopsis (``[--flag ...]``), not commands to run."""
    return "[--" in body


def commands(text: str) -> list[str]:
    """Whole commands: the lines of ``text``'s shell blocks (no language, or a shell's; not a synopsis) that run
    gnnscale."""
    found = []
    for body in (b for kind, b in FENCE.findall(text) if kind in SHELLS):
        if is_synopsis(body) or body.lstrip().startswith(("import", "from")):
            continue
        found += [line for line in shell_lines(body) if re.search(rf"(^|\s)gnnscale\s+({_COMMAND})\b", line)]
    return found


def mentions(text: str) -> list[str]:
    """Commands named inline in the text, outside the fenced blocks (often partial: ``gnnscale train ...
    --resume``)."""
    return [m.group(1) for m in re.finditer(rf"`(gnnscale (?:{_COMMAND})\b[^`]*)`", FENCE.sub("", text))]


def flags_of(command: str) -> set[str]:
    """Every option string of the CLI command ``command`` (``train``, ...)."""
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return {s for a in sub._actions for s in a.option_strings}


def parse(command: str, origin: str) -> None:
    """Parse ``command`` with the CLI's parser; a test failure naming ``origin`` (the page) if it does not."""
    args = argv(command)
    if args[0] not in COMMANDS:
        pytest.fail(f"{origin} command {command!r}: {args[0]!r} is not a gnnscale command")
    try:
        build_parser().parse_args(join_negative_lists(args))
    except (SystemExit, GnnscaleError) as exc:
        pytest.fail(f"{origin} command {command!r} does not parse: {exc}")


def run_python(bodies: list[str], origin: str, namespace: dict[str, object]) -> None:
    """Execute ``bodies`` in order in ``namespace``; the first that raises fails the test, named by its number."""
    for i, body in enumerate(bodies):
        try:
            exec(compile(body, f"{origin} python block {i + 1}", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 -- any failure of an example is the finding
            pytest.fail(f"{origin} python block {i + 1} fails: {type(exc).__name__}: {exc}")
