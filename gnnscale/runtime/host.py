"""Host memory as a device: free and total RAM, and the process's resident peak (Linux ``/proc``; elsewhere
``os.sysconf`` and ``getrusage``)."""

from __future__ import annotations

import os
import resource

__all__ = ["mem_get_info", "memory_allocated", "peak_bytes", "proc_kib", "reset_peak"]


def proc_kib(path: str, key: str) -> int | None:
    """The ``key:  N kB`` field of a Linux /proc file (``/proc/meminfo``, ``/proc/self/status``), or None."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def mem_get_info() -> tuple[int, int]:
    """``(available, total)`` bytes of host RAM."""
    avail, total = proc_kib("/proc/meminfo", "MemAvailable"), proc_kib("/proc/meminfo", "MemTotal")
    page = os.sysconf("SC_PAGE_SIZE")
    return (avail * 1024 if avail is not None else page * os.sysconf("SC_AVPHYS_PAGES"),
            total * 1024 if total is not None else page * os.sysconf("SC_PHYS_PAGES"))


def memory_allocated() -> int:
    """The process's resident bytes now (VmRSS; 0 where unknown)."""
    rss = proc_kib("/proc/self/status", "VmRSS")
    return rss * 1024 if rss is not None else 0


def reset_peak() -> None:
    """Start a new peak window for :func:`peak_bytes` (Linux >= 4.0; elsewhere the peak stays the lifetime's)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM
    except OSError:
        pass


def peak_bytes() -> int:
    """The process's peak resident bytes since :func:`reset_peak` (VmHWM), else its lifetime peak."""
    hwm = proc_kib("/proc/self/status", "VmHWM")
    return (hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
