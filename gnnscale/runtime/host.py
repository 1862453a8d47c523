"""Host memory as a device: free and total RAM, the process's resident peak (Linux ``/proc``; elsewhere
``os.sysconf`` and ``getrusage``), and the host allocator's policy for freed blocks (:func:`set_host_allocator`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
from typing import Any

__all__ = ["HOST_ALLOCATORS", "mem_get_info", "memory_allocated", "peak_bytes", "proc_kib", "reset_peak",
           "set_host_allocator"]

HOST_ALLOCATORS = ("auto", "retain", "system")
"""``--host-allocator`` choices: ``retain`` keeps freed large blocks for reuse, ``system`` is glibc's default,
``auto`` is ``retain`` where host memory is the training device with room to spare (the engine decides, from its
host estimate) and leaves the allocator alone elsewhere."""


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


# glibc's mallopt parameters, and its defaults for them (the dynamic mmap threshold starts at 128 KiB)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_RETAIN_BYTES, _DEFAULT_BYTES = 1 << 30, 128 * 1024
_policy: str | None = None


def _mallopt() -> Any:
    """glibc's ``mallopt``, or None (another C library)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def set_host_allocator(policy: str) -> bool:
    """Set how the host allocator treats freed large blocks, process-wide; returns whether it took effect (False
    where the C library is not glibc, or for ``system`` when nothing was changed before).

    ``retain`` (the engines' default where host memory is the device, has room and no layer computes per edge:
    ``Engine.auto_retains``): glibc's ``mallopt`` mmap and trim thresholds at 1 GiB, so freed blocks below that
    stay in the heap for the next allocation. By default glibc
    serves a block above its mmap threshold (at most 32 MiB once adjusted) with a fresh ``mmap`` and unmaps it on
    ``free``: every ``[V, F]`` temporary of a full-graph epoch on the CPU (51 MB at 200K x 64 float32) is new
    pages the kernel must fault in and zero. Measured on csbm 200K, SAGE, one thread: 266K minor faults and a third
    of the epoch's CPU time in the kernel; with ``retain``, none. The price is resident memory: freed blocks stay
    and the heap fragments (csbm 200K, one thread, peak resident: GCN 0.95 -> 1.12 GiB, SAGE 0.99 -> 1.41).
    ``system``: glibc's defaults back (128 KiB thresholds; the dynamic adjustment does not come back).
    """
    global _policy
    if policy not in HOST_ALLOCATORS[1:]:
        raise ValueError(f"unknown host allocator {policy!r}; choose retain or system")
    if policy == _policy or (policy == "system" and _policy is None):
        return policy == _policy
    mallopt = _mallopt()
    if mallopt is None:
        return False
    size = _RETAIN_BYTES if policy == "retain" else _DEFAULT_BYTES
    ok = bool(mallopt(_M_MMAP_THRESHOLD, size)) and bool(mallopt(_M_TRIM_THRESHOLD, size))
    if ok:
        _policy = policy
    return ok
