"""Byte sizes as users write them and as they are shown.

Sizes follow the standards (and GNU's ``--block-size``): SI units are powers of 10 (``kB``, ``MB``, ``GB``, ``TB``:
1000, 1000^2, ...), IEC units powers of 2 (``KiB``, ``MiB``, ``GiB``, ``TiB``: 1024, 1024^2, ...), and a bare
letter (``K``, ``M``, ``G``, ``T``) is the IEC unit, as in ``ls -h`` and ``numfmt --from=iec``. Case does not
matter. A plain number of a size is bytes; a plain number of a *budget* (``--gpu-memory 6``) is GiB. Sizes are
shown in IEC units (:func:`format_bytes`).
"""

from __future__ import annotations

import math
import re

from gnnscale.errors import ConfigError

__all__ = ["format_bytes", "format_bytes_up", "parse_budget", "parse_bytes", "parse_network", "UNITS_HELP"]

_SI = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_IEC = {"K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30,
        "T": 1 << 40, "TIB": 1 << 40}
_UNITS = {"": 1, "B": 1, **_SI, **_IEC}
UNITS_HELP = "kB/MB/GB = powers of 1000, KiB/MiB/GiB (or K/M/G) = powers of 1024"
"""How sizes read, for help texts."""


def parse_bytes(text: str) -> int:
    """``"512MB"`` (512 * 10^6), ``"8G"`` / ``"8GiB"`` (8 * 2^30), ``"1.5GiB"``, ``"1000"`` (bytes) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"cannot read memory size {text!r}; use e.g. 512MB, 8GB or 1.5GiB ({UNITS_HELP})")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1:
        raise ConfigError(f"memory size must be at least one byte, got {text!r}")
    return int(value)


def parse_budget(text: str) -> int:
    """A memory budget: a plain number is GiB (``--gpu-memory 6``), else a size with a unit (``512MB``, ``6GiB``;
    :func:`parse_bytes`)."""
    try:
        gib = float(text)
    except ValueError:
        return parse_bytes(text)
    if not gib > 0:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return int(gib * (1 << 30))


def format_bytes(n: float) -> str:
    """``n`` bytes in IEC units (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_bytes_up(n: int) -> str:
    """``n`` bytes as :func:`format_bytes` shows them, rounded *up* to the shown digit: a least size to give (``give
    at least ...``), so that giving the figure shown is enough (:func:`parse_budget` of it is ``>= n``)."""
    for unit, size in (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40)):
        if n < 1024 * size or unit == "TiB":
            if unit == "B":
                return f"{n} B"
            tenths = math.ceil(n * 10 / size)
            while parse_bytes(f"{tenths / 10:.1f}{unit}") < n:  # float rounding: one more tenth
                tenths += 1
            if tenths < 10240 or unit == "TiB":  # else 1024.0 MiB: shown as 1.0 GiB
                return f"{tenths / 10:.1f} {unit}"
    raise AssertionError("unreachable")


_RATES = {"BIT": 1 / 8, "KBIT": 1e3 / 8, "MBIT": 1e6 / 8, "GBIT": 1e9 / 8, "TBIT": 1e12 / 8,
          "B/S": 1, "KB/S": 1e3, "MB/S": 1e6, "GB/S": 1e9, "TB/S": 1e12}
_TIMES = {"NS": 1e-9, "US": 1e-6, "MS": 1e-3, "S": 1.0}
NETWORK_HELP = "a rate in bits (25Gbit, 100Mbit) or bytes per second (3GB/s, 100MB/s), then ,latency=50us (us, ms, s)"


def parse_network(text: str, flag: str = "--network") -> tuple[float, float | None]:
    """``"25Gbit"``, ``"100Mbit,latency=200us"``, ``"3GB/s,latency=1ms"`` -> ``(bytes/s, latency seconds or
    None)``. Bit rates are SI (``1Gbit`` = 10^9 bits/s), as links are sold."""
    head, *rest = [part.strip() for part in text.split(",")]
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([A-Za-z/]+)", head)
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _RATES or not float(m.group(1)) > 0:
        raise ConfigError(f"{flag} {text!r}: {NETWORK_HELP}")
    rate = float(m.group(1)) * _RATES[unit]
    latency = None
    for part in rest:
        lm = re.fullmatch(r"latency\s*=\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]+)", part)
        if not lm or lm.group(2).upper() not in _TIMES or latency is not None:
            raise ConfigError(f"{flag} {text!r}: {NETWORK_HELP}")
        latency = float(lm.group(1)) * _TIMES[lm.group(2).upper()]
    return rate, latency
