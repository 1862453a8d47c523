"""What several commands share: the metrics file, number lists, and printing an accuracy."""

from __future__ import annotations

import json
from typing import Any

from gnnscale.errors import ConfigError
from gnnscale.fsutil import check_output, make_parents


class _MetricsWriter:
    """JSON Lines to FILE, one record per finished epoch, flushed as it is written (an interrupted or failed run
    keeps the epochs it finished; the summary record comes last, only when training ends). FILE is created at the
    first record, so bad input that stops a run before its first epoch leaves nothing behind."""

    def __init__(self, path: str):
        self.path = check_output(path, "--metrics")
        self.fh: Any = None

    def write(self, record: dict[str, Any]) -> None:
        if self.fh is None:
            self.fh = open(make_parents(self.path), "w")  # noqa: SIM115 -- kept open across epochs, closed by close()
        self.fh.write(json.dumps(_finite(record), allow_nan=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def _finite(v: Any) -> Any:
    """``v`` with NaN and infinities as ``None`` (JSON has no NaN: ``JSON.parse`` and strict parsers reject it)."""
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _fmt(v: float | None) -> str:
    return "  n/a " if v is None else f"{v:.4f}"


def _device_list(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(d.strip() for d in text.split(","))
    if not all(items):
        raise ConfigError(f"--devices {text!r}: give a comma-separated list such as cuda:0,cuda:1")
    return items


def _num_list(flag: str, text: str | None, kind: type[float] | type[int], example: str) -> Any:
    """``a,b,c`` as a tuple of ``kind``; ``None`` stays ``None``; anything else is one error naming the flag."""
    if text is None:
        return None
    what = "integers" if kind is int else "numbers"
    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give comma-separated {what} such as {example}") from None
    if kind is int and any(abs(v) >= 2**63 for v in values):
        raise ConfigError(f"{flag} {text!r}: a number is out of range (int64); give {what} such as {example}")
    return values
