"""Cases and their interleaved schedule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    """One thing to measure, run once per round in a process of its own.

    ``name`` is unique within a benchmark run and is recorded as ``case``. ``params`` (JSON) is what the child's
    ``run(params)`` gets. Cases with the same ``group`` are one comparison (the systems of one workload, the two
    revisions of one engine): they run back to back, in an order that rotates by one per round, so load from other
    processes falls on all of them alike. ``module`` is the module whose ``run`` the child calls (default: the
    benchmark's own); ``python`` the interpreter (default: the harness's; a peer's own venv); ``env`` extra
    environment variables; ``rev`` a git revision whose clean worktree the child gets as ``params["_src"]`` (the
    child itself always imports the benchmark from the harness's source tree); ``timeout`` seconds.
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    module: str | None = None
    python: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    rev: str | None = None
    timeout: float = 3600.0


def schedule(rounds: int, cases: Sequence[Case]) -> list[tuple[int, Case]]:
    """``(round, case)`` in run order: per round, the groups in first-seen order, each group's cases rotated left
    by the round number (a case without a group is a group of its own)."""
    groups: dict[str, list[Case]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(c.group if c.group is not None else f"\0{i}", []).append(c)
    out = []
    for r in range(rounds):
        for members in groups.values():
            k = r % len(members)
            out += [(r, c) for c in members[k:] + members[:k]]
    return out
