"""Byte sizes as users write them (``512MB``, ``8G``, a plain number of GiB for budgets) and as they are shown."""

from __future__ import annotations

import re

from gnnscale.errors import ConfigError

__all__ = ["format_bytes", "parse_budget", "parse_bytes"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"512MB"``, ``"8G"``, ``"1.5GiB"``, ``"1000"`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"cannot read memory size {text!r}; use e.g. 512MB, 8GB, 1.5GiB")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value <= 0:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return int(value)


def parse_budget(text: str) -> int:
    """A device-memory budget: a plain number is GiB (``--gpu-memory 6``), or a size with a unit (``512MB``)."""
    try:
        gib = float(text)
    except ValueError:
        return parse_bytes(text)
    if not gib > 0:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return int(gib * (1 << 30))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
