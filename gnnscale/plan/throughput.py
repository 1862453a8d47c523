"""The throughputs of HongTu's Eq. 4, measured once per machine and cached.

``T_hd`` is a gather of scattered host rows onto the device (what a chunk load does), ``T_dd`` a copy between two
devices (the first two given; one device copies within itself, as partitions sharing a device do) and ``T_ru``
a gather inside device memory (assembling a chunk from its transition buffer). Results are saved in
``$GNNSCALE_CACHE_DIR/throughput.json`` (else ``~/.cache/gnnscale``), keyed by the devices' names.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gnnscale import runtime as rt
from gnnscale.fsutil import atomic_file
from gnnscale.partition.dedup import Throughput

ROWS, WIDTH, REPEATS = 1 << 16, 64, 3


def cache_file() -> Path:
    if os.environ.get("GNNSCALE_CACHE_DIR"):
        return Path(os.environ["GNNSCALE_CACHE_DIR"]) / "throughput.json"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gnnscale" / "throughput.json"


def _name(device: torch.device) -> str:
    if rt.is_accelerator(device):
        return f"{rt.device_name(device)}#{device.index or 0}"
    return f"cpu:{platform.processor() or platform.machine()}x{os.cpu_count()}"


def timed_runs(fn: Callable[[], object], device: torch.device, runs: int) -> list[float]:
    """Seconds of ``runs`` calls of ``fn`` after one warm-up, each waited for on an accelerator."""
    times = []
    for _ in range(runs + 1):
        if rt.is_accelerator(device):
            rt.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if rt.is_accelerator(device):
            rt.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times[1:]


def _rate(fn: Callable[[], object], nbytes: int, device: torch.device) -> float:
    """Bytes per second of ``fn`` (best of a few runs, after one warm-up)."""
    return nbytes / max(min(timed_runs(fn, device, REPEATS)), 1e-9)


def measure(devices: list[torch.device]) -> Throughput:
    """Measure ``T_hd``, ``T_dd``, ``T_ru`` on ``devices`` (a fraction of a second)."""
    d0 = devices[0]
    d1 = devices[1] if len(devices) > 1 else d0
    nbytes = ROWS * WIDTH * 4
    gen = torch.Generator().manual_seed(0)
    host = torch.randn(2 * ROWS, WIDTH, generator=gen)
    idx = torch.randperm(2 * ROWS, generator=gen)[:ROWS]
    if rt.needs_pinning(d0):
        host = host.pin_memory()
        staging = torch.empty(ROWS, WIDTH, pin_memory=True)

        def h2d() -> object:
            torch.index_select(host, 0, idx, out=staging)
            return staging.to(d0, non_blocking=True)
    else:
        def h2d() -> object:
            return host.index_select(0, idx)
    on_dev = host.to(d0)
    idx_dev = idx.to(d0)
    src = on_dev[:ROWS].contiguous()
    return Throughput(hd=_rate(h2d, nbytes, d0), dd=_rate(lambda: src.to(d1, copy=True), nbytes, d0),
                      ru=_rate(lambda: on_dev.index_select(0, idx_dev), nbytes, d0))


def throughput(devices: list[torch.device]) -> Throughput:
    """The cached measurement for ``devices``, measuring (and saving) it the first time."""
    def fresh() -> dict[str, float]:
        tp = measure(devices)
        return {"hd": tp.hd, "dd": tp.dd, "ru": tp.ru}

    e = cached(",".join(_name(d) for d in devices[:2]), ("hd", "dd", "ru"), fresh)
    return Throughput(e["hd"], e["dd"], e["ru"])


def measure_compute(device: torch.device) -> tuple[float, float]:
    """FLOPS (a dense float32 matmul) and memory bandwidth (a large copy, bytes read + written per second) of
    ``device``: the rates of NeutronTask's Eqs. 5-6."""
    n = 1024
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)
    flops = _rate(lambda: a @ b, 2 * n**3, device)
    big = torch.empty(1 << 24, device=device)  # 64 MiB
    bandwidth = _rate(lambda: big.clone(), 2 * big.numel() * 4, device)
    return flops, bandwidth


def compute_rates(device: torch.device) -> tuple[float, float]:
    """:func:`measure_compute`'s ``(flops, bandwidth)`` for ``device``, measured once per machine and cached beside
    the transfer throughputs (key ``compute:<device name>``)."""
    entry = cached(f"compute:{_name(device)}", ("flops", "bandwidth"),
                   lambda: dict(zip(("flops", "bandwidth"), measure_compute(device), strict=True)))
    return entry["flops"], entry["bandwidth"]


def read_cache(path: Path) -> dict[str, Any]:
    """A cache file's entries (``{}`` when it is missing, unreadable or not a JSON object)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    return saved if isinstance(saved, dict) else {}


def cached(key: str, fields: tuple[str, ...], measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``fields`` of the entry ``key`` of the throughput cache; measured by ``measure`` (and saved) when the
    entry is missing or any field is not a positive number."""
    path = cache_file()
    saved = read_cache(path)
    entry = saved.get(key)
    if isinstance(entry, dict) and all(isinstance(entry.get(k), int | float) and entry[k] > 0 for k in fields):
        return {k: float(entry[k]) for k in fields}
    fresh = {k: float(v) for k, v in measure().items()}
    saved[key] = fresh
    save_cache(path, saved)
    return fresh


def save_cache(path: Path, saved: dict[str, Any]) -> None:
    """Write a cache file's entries at once (an unwritable cache only costs a measurement next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as fh:
            fh.write(json.dumps(saved, indent=1).encode())
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
