"""Records: JSON Lines files under benchmarks/results/, and the small helpers every renderer uses."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


@dataclass(frozen=True)
class Row:
    """One row of RESULTS.md's at-a-glance table: ``what`` is measured, the ``figure``, and the ``records`` it
    comes from (their commands and commits fill the row's last columns)."""

    what: str
    figure: str
    records: tuple[dict[str, Any], ...] = ()


def append_records(out: Path, records: Iterable[dict[str, Any]]) -> int:
    """Append ``records`` to the JSON Lines file ``out`` (its folder made when missing); how many."""
    lines = [json.dumps(r, sort_keys=False) + "\n" for r in records]
    if lines:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.writelines(lines)
    return len(lines)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSON Lines file, in order (``[]`` when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def session_of(record: dict[str, Any]) -> str:
    """The run a record belongs to: its ``session`` id; for records written before the harness, its command and
    commit (each of those scripts wrote one command's records together)."""
    return record.get("session") or f"{record.get('command')}@{record.get('gnnscale_rev')}"


def latest_session(records: Sequence[dict[str, Any]], where: Any = None) -> list[dict[str, Any]]:
    """The records of the last run (:func:`session_of` of the last record), keeping those ``where(r)`` accepts."""
    mine = [r for r in records if where is None or where(r)]
    if not mine:
        return []
    last = session_of(mine[-1])
    return [r for r in mine if session_of(r) == last]


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: a comma list flag."""
    return [s.strip() for s in text.split(",") if s.strip()]


def fmt(value: float | None, spec: str = ".3f", none: str = "-") -> str:
    """``value`` formatted, or ``none`` when missing."""
    return none if value is None else format(value, spec)


def gib(n: int | None) -> str:
    """Bytes as GiB with two decimals, ``-`` when missing."""
    return "-" if not n else f"{n / 2**30:.2f} GiB"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def provenance(records: Sequence[dict[str, Any]]) -> str:
    """One line naming the machine, versions, commit(s), date(s) and command(s) of ``records``."""
    def uniq(key: str) -> str:
        return ", ".join(dict.fromkeys(str(r[key]) for r in records if r.get(key) is not None)) or "-"
    days = sorted({str(r["date"])[:10] for r in records if r.get("date")})
    when = "-" if not days else days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    cmds = list(dict.fromkeys(r["command"] for r in records if r.get("command")))
    return (f"Machine: {uniq('host_cpu')}; device: {uniq('device_name')}; torch {uniq('torch')}; "
            f"commit {uniq('gnnscale_rev')}; {when}.\n\n" + "\n".join(f"Command: `{c}`" for c in cmds))
