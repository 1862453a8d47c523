"""This machine's rate and latency between two processes (torch.distributed gloo all-to-alls over loopback, as the
engine's exchanges run: a ping-pong of sends is several times faster than gloo's all-to-all): what a prediction
of ranks on this machine uses when no ``--network`` names another (``Rates.network``, ``Rates.latency``).

Measured only when a prediction needs it (a second or two, plus starting two processes), then kept beside the
machine's other rates in the cache (:func:`gnnscale.plan.rates.cache_file`).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gnnscale.fsutil import atomic_file
from gnnscale.plan.rates import Rates, cache_file

PING_ROUNDS = 200
"""All-to-alls of one element per rank (the latency: the median)."""
BULK_BYTES, BULK_ROUNDS = 1 << 24, 6
"""Bytes and rounds of the bulk all-to-all (the rate: the bytes each rank sends over the time, the best)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(rank: int, port: int, out: mp.SimpleQueue) -> None:  # type: ignore[type-arg]
    """One of the two processes: ping-pong small then large tensors with the other; rank 0 reports."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        def rounds(t: torch.Tensor, n: int) -> list[float]:
            """All-to-alls of ``t`` (half to each rank): what the engine's exchanges run."""
            into = torch.empty_like(t)
            times = []
            for _ in range(n):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_to_all_single(into, t)
                times.append(time.perf_counter() - t0)
            return times

        small = sorted(rounds(torch.zeros(2), PING_ROUNDS))
        bulk = min(rounds(torch.zeros(BULK_BYTES // 4), BULK_ROUNDS))
        if rank == 0:
            latency = small[len(small) // 2]
            out.put((BULK_BYTES / 2 / max(bulk - latency, 1e-9), latency))
    finally:
        dist.destroy_process_group()


def measure_network() -> tuple[float, float]:
    """``(bytes/s, seconds per message)`` between two gloo processes on this machine's loopback."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=(r, port, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    if out.empty():
        raise RuntimeError("measuring the rate between processes failed (gloo over loopback)")
    rate, latency = out.get()
    return float(rate), float(latency)


def with_network(rates: Rates, measure: Callable[[], tuple[float, float]] = measure_network) -> Rates:
    """``rates`` with this machine's process-to-process rate and latency: measured (``measure``) once and cached
    beside the machine's entry (as is, when they are known)."""
    if rates.network > 0:
        return rates
    rate, latency = measure()
    path = cache_file()
    try:
        saved = json.loads(path.read_text())
        entry = saved.get(rates.machine) if isinstance(saved, dict) else None
        if isinstance(entry, dict) and entry.get("versions") == rates.versions:
            entry.update(network=rate, latency=latency)
            with atomic_file(path) as fh:
                fh.write(json.dumps(saved, indent=1).encode())
    except (OSError, ValueError):
        pass  # not cached: measured again next time
    return replace(rates, network=rate, latency=latency)
