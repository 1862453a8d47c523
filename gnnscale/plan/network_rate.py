"""This machine's rate and latency between two processes (torch.distributed gloo all-to-alls over loopback, as the
engine's exchanges run: a ping-pong of sends is several times faster than gloo's all-to-all): what a prediction
of ranks on this machine uses when no ``--network`` names another (``Rates.network``, ``Rates.latency``).

Measured only when a prediction needs it (a second or two, plus starting two processes), then kept beside the
machine's other rates in the cache (:func:`gnnscale.plan.rates.cache_file`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gnnscale.plan.rates import Rates, cache_file, cache_key
from gnnscale.plan.throughput import read_cache, save_cache

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
    rate, latency = _run_ranks(_child, 2, (), "the rate between processes")
    return float(rate), float(latency)


def _run_ranks(target: Callable[..., None], world: int, args: tuple[Any, ...], what: str) -> Any:
    """``target(rank, *args, port, out)`` in ``world`` spawned processes; what rank 0 put in ``out``."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, *args, port, out), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    if out.empty():
        raise RuntimeError(f"measuring {what} failed (gloo over loopback)")
    return out.get()


def with_network(rates: Rates, measure: Callable[[], tuple[float, float]] = measure_network) -> Rates:
    """``rates`` with this machine's process-to-process rate and latency: measured (``measure``) once and cached
    beside the machine's entry (as is, when they are known)."""
    if rates.network > 0:
        return rates
    rate, latency = measure()
    path = cache_file()
    saved = read_cache(path)
    entry = saved.get(cache_key(rates.machine, rates.threads))
    if isinstance(entry, dict) and entry.get("versions") == rates.versions:
        entry.update(network=rate, latency=latency)
        save_cache(path, saved)  # unwritable: measured again next time
    return replace(rates, network=rate, latency=latency)


SYNC_ROUNDS, SYNC_WORK = 60, 50
"""Rounds of the synchronisation measurement, and the ``128 x 128`` matrix products of each round's work."""


def _sync_child(rank: int, world: int, port: int, out: mp.SimpleQueue) -> None:  # type: ignore[type-arg]
    """One of ``world`` processes: rounds of a burst of work then a small all-to-all (an engine's step and
    exchange); rank 0 reports the mean round."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        a, t = torch.randn(128, 128), torch.zeros(2 * world)
        into = torch.empty_like(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(SYNC_ROUNDS):
            for _ in range(SYNC_WORK):
                a @ a
            dist.all_to_all_single(into, t)
        if rank == 0:
            out.put((time.perf_counter() - t0) / SYNC_ROUNDS)
    finally:
        dist.destroy_process_group()


def measure_sync(ranks: int) -> float:
    """Seconds each collective of ``ranks`` processes of this machine costs beyond their work (run alone, times
    their share of the cores): the wait for the last rank to arrive (their work's jitter, which their sharing of
    the cores makes larger), to be scheduled again when the data comes, and the small all-to-all itself."""
    a = torch.randn(128, 128)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(SYNC_WORK):
                a @ a
            alone.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    mean_round = _run_ranks(_sync_child, ranks, (ranks,), "the synchronisation cost")
    share = max(1.0, ranks / (os.cpu_count() or 1))
    return max(float(mean_round) - share * min(alone), 0.0)


def sync_cost(rates: Rates, ranks: int, measure: Callable[[int], float] = measure_sync) -> float:
    """:func:`measure_sync` of ``ranks`` processes on this machine, measured once and cached beside the machine's
    rates (``sync_cost`` by rank count)."""
    if ranks < 2:
        return 0.0
    path = cache_file()
    saved = read_cache(path)
    entry = saved.get(cache_key(rates.machine, rates.threads))
    known = entry.get("sync_cost", {}) if isinstance(entry, dict) else {}
    if isinstance(known, dict) and str(ranks) in known:
        return float(known[str(ranks)])
    cost = measure(ranks)
    if isinstance(entry, dict) and entry.get("versions") == rates.versions:
        entry["sync_cost"] = {**(known if isinstance(known, dict) else {}), str(ranks): cost}
        save_cache(path, saved)  # unwritable: measured again next time
    return cost
