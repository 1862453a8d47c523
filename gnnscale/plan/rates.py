"""This machine's rates, the inputs of every engine's epoch-time model: measured by a short calibration (about a
two seconds), cached per machine with the date, the versions and the thread count that measured them.

``gnnscale plan --recalibrate`` (and ``train --recalibrate``) measure again. The cache is
``$GNNSCALE_CACHE_DIR/rates.json`` (else ``~/.cache/gnnscale``), keyed by the device's name
(:func:`gnnscale.plan.throughput.cache_file` is beside it).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gnnscale import runtime as rt
from gnnscale.graph.block import Block
from gnnscale.nn.ops import keyed_dropout, spmm
from gnnscale.plan import throughput
from gnnscale.plan.memory import LiveBytesCounter
from gnnscale.store.disk import DiskSource
from gnnscale.store.features import FeatureSourceError
from gnnscale.version import __version__

WIDTHS = (16, 64, 256)
"""Feature widths the sparse aggregation is measured at (other widths are interpolated)."""
CACHED_BYTES, STREAMED_BYTES = 8 << 20, 32 << 20
"""Arrays up to 8 MiB run at the cached rates, from 32 MiB at the streamed ones (a last-level cache of tens of
MiB shared with other processes)."""
CAL_TABLE, CAL_DST, CAL_DEGREE = 64 << 20, 1 << 15, 10
"""The aggregation's calibration: a source table of 64 MiB (past a last-level cache), 32K destinations of 10
random in-neighbours each."""
DENSE_ROWS = 1 << 14
"""Rows of the dense calibration's product (16 MiB of 256-wide input, past a last-level cache)."""
DISK_BYTES, DISK_WIDTH = 32 << 20, 64
"""The disk calibration's file: 32 MiB of rows of 64 float32 features, a quarter of them read scattered."""


@dataclass(frozen=True)
class Rates:
    """Measured rates of one machine and device (bytes, edges and FLOPs per second)."""

    gather: float
    """Bytes/s of scattered host rows gathered into a new buffer (a sampled batch's input rows)."""
    copy: float
    """Bytes/s from host memory to the device (on a CPU: a chunk load, rows by sorted ids into a buffer reused from
    load to load, as the full-graph engines' row buffers are)."""
    aggregate: tuple[tuple[int, float], ...]
    """``(width, edges/s)`` of the library's sparse aggregation (:func:`gnnscale.nn.ops.spmm`) on the device."""
    flops: float
    """Dense float32 FLOP/s on the device of a layer's tall, narrow product (rows x 256 times 256 x 64)."""
    memory: float
    """Bytes/s (read + written) of a streaming elementwise pass on the device."""
    disk: float
    """Bytes/s read from a file not in the page cache (the disk tier's reads)."""
    memory_cached: float = 0.0
    """Bytes/s of the same pass over an array that fits the last-level cache (:data:`CACHED_BYTES`; ``0``:
    not measured, :attr:`memory` for any size)."""
    aggregate_cached: tuple[tuple[int, float], ...] = ()
    """``(width, edges/s)`` of the aggregation over a source table that fits the cache (``()``: not measured)."""
    dropout: float = 0.0
    """Elements/s of the keyed dropout of input features (:func:`~gnnscale.nn.ops.keyed_dropout`, no gradient:
    a hash per element; ``0``: not measured, priced as memory passes)."""
    counted_op: float = 0.0
    """Seconds a small torch op costs beyond itself under the CPU's byte counter
    (:class:`~gnnscale.plan.memory.LiveBytesCounter`, a Python dispatch mode; ``0``: not measured)."""
    network: float = 0.0
    """Bytes/s between two processes of this machine (``0``: not measured; a what-if names its own)."""
    latency: float = 0.0
    """Seconds per message between two processes (``0``: not measured)."""
    machine: str = ""
    measured: str = ""
    """When (ISO date and time, UTC)."""
    versions: str = ""
    """``gnnscale X, torch Y, python Z``: a cache entry of other versions is measured again."""
    threads: int = 0
    """``torch.get_num_threads()`` when measured: an entry of another thread count is measured again."""

    @property
    def on_cpu(self) -> bool:
        """Whether these are a CPU's rates (a graph's own aggregation, probed on the CPU, then applies)."""
        return self.machine.startswith("cpu:")

    def memory_rate(self, nbytes: float) -> float:
        """Bytes/s of a streaming pass over an array of ``nbytes``: :attr:`memory_cached` up to
        :data:`CACHED_BYTES`, :attr:`memory` from :data:`STREAMED_BYTES`, linear in seconds per byte between."""
        return 1 / _between(nbytes, 1 / (self.memory_cached or self.memory), 1 / self.memory)

    def aggregate_rate(self, width: int, table_bytes: float | None = None) -> float:
        """Edges/s of a sparse aggregation at ``width`` features over a source table of ``table_bytes`` (``None``:
        one larger than the cache), as :meth:`memory_rate` interpolates between the cached and the streamed
        calibration."""
        far = _width_rate(self.aggregate, width)
        if table_bytes is None or not self.aggregate_cached:
            return far
        return 1 / _between(table_bytes, 1 / _width_rate(self.aggregate_cached, width), 1 / far)


def _between(nbytes: float, near: float, far: float) -> float:
    """``near`` up to :data:`CACHED_BYTES`, ``far`` from :data:`STREAMED_BYTES`, linear between."""
    f = min(max((nbytes - CACHED_BYTES) / (STREAMED_BYTES - CACHED_BYTES), 0.0), 1.0)
    return near + (far - near) * f


def _width_rate(table: tuple[tuple[int, float], ...], width: int) -> float:
    """Edges/s at ``width`` from ``(width, edges/s)`` pairs (linear between the measured widths in seconds per
    edge and feature, constant per feature beyond them)."""
    ws = [w for w, _ in table]
    i = min(max(bisect_left(ws, width), 1), len(ws) - 1)
    (w0, r0), (w1, r1) = table[i - 1], table[i]
    if width <= w0:
        return r0 * w0 / max(width, 1)
    if width >= w1:
        return r1 * w1 / width
    c0, c1 = 1 / (r0 * w0), 1 / (r1 * w1)  # seconds per edge-feature
    c = c0 + (c1 - c0) * (width - w0) / (w1 - w0)
    return 1 / (c * width)


_FIELDS = {f.name for f in fields(Rates)}


def versions() -> str:
    return f"gnnscale {__version__}, torch {torch.__version__}, python {platform.python_version()}"


def cache_file() -> Path:
    return throughput.cache_file().parent / "rates.json"


def cache_key(machine: str, threads: int) -> str:
    """The cache entry of a machine's rates at a torch thread count (a what-if's ranks measure at one thread, a
    ``plan`` at the machine's: each keeps its own entry, with what is measured beside it: the network, the
    synchronisation cost)."""
    return f"{machine}@{threads}t"


def rates(device: torch.device, *, recalibrate: bool = False) -> Rates:
    """The cached rates of ``device`` (a sim device: the host's), measured (about two seconds) when missing, of
    other versions or another torch thread count, or with ``recalibrate``."""
    dev = rt.torch_device(device)
    key = cache_key(throughput._name(dev), torch.get_num_threads())
    path = cache_file()
    saved = throughput.read_cache(path)
    entry = saved.get(key)
    if not recalibrate and isinstance(entry, dict) and entry.get("versions") == versions() \
            and entry.get("threads") == torch.get_num_threads():
        try:
            known = {k: v for k, v in entry.items() if k in _FIELDS}  # beside them: the network's, sync_cost
            for k in ("aggregate", "aggregate_cached"):
                known[k] = tuple(tuple(p) for p in known.get(k, ()))
            return Rates(**known)
        except (TypeError, KeyError, ValueError):
            pass  # an entry of another shape: measure again
    fresh = measure_apart(dev)
    saved[key] = asdict(fresh)
    throughput.save_cache(path, saved)
    return fresh


def measure_apart(device: torch.device) -> Rates:
    """:func:`measure` in a child process at this process's thread count, so its buffers (a 64 MiB table, a 32 MiB
    file's rows) never count in this process's memory peak (``--host-memory`` bounds it); in this process when
    the child fails."""
    code = ("import json, sys, torch; torch.set_num_threads(int(sys.argv[1])); from dataclasses import asdict; "
            "from gnnscale.plan.rates import measure; print(json.dumps(asdict(measure(torch.device(sys.argv[2])))))")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        out = subprocess.run([sys.executable, "-c", code, str(torch.get_num_threads()), str(device)], env=env,
                             capture_output=True, text=True, timeout=300, check=True)
        entry = json.loads(out.stdout.strip().splitlines()[-1])
        for k in ("aggregate", "aggregate_cached"):
            entry[k] = tuple(tuple(p) for p in entry.get(k, ()))
        return Rates(**entry)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, TypeError, KeyError):
        return measure(device)


def measure(device: torch.device) -> Rates:
    """Measure :class:`Rates` on ``device``."""
    tp = throughput.measure([device])
    memory = throughput.measure_compute(device)[1]
    flops = _dense_rate(device)
    try:
        aggregate = tuple((w, _aggregate_rate(device, w)) for w in WIDTHS)
        cached = tuple((w, _aggregate_rate(device, w, CACHED_BYTES // 2)) for w in WIDTHS)
    finally:
        _TABLES.clear()
    small = torch.empty(CACHED_BYTES // 8, device=device)  # 4 MiB read and 4 MiB written
    memory_cached = _typical(lambda: small.clone(), 2 * small.numel() * 4, device)
    accel = rt.is_accelerator(device)
    return Rates(gather=tp.ru if accel else tp.hd, copy=tp.hd if accel else _load_rate(device), aggregate=aggregate,
                 flops=flops, memory=memory, disk=disk_rate(), memory_cached=memory_cached,
                 aggregate_cached=cached, dropout=_dropout_rate(device),
                 counted_op=_counted_op(),
                 machine=throughput._name(device),
                 measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 versions=versions(), threads=torch.get_num_threads())


class _Calls(TorchDispatchMode):
    """Counts the ops dispatched while active."""

    calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _counted_op(repeats: int = 50) -> float:
    """Seconds per op added by :class:`~gnnscale.plan.memory.LiveBytesCounter`: a small layer's forward and
    backward (a product, an activation, a sum, autograd's saved tensors and gradients) ``repeats`` times, best of
    three with the counter and without, over the ops dispatched."""
    x = torch.randn(64, 32)
    w = torch.randn(32, 16, requires_grad=True)

    def step() -> None:
        (x @ w).relu().sum().backward()
        w.grad = None

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(repeats):
            step()
        return time.perf_counter() - t0

    calls = _Calls()
    with calls:
        step()
    plain = min(run() for _ in range(3))
    with LiveBytesCounter():
        counted = min(run() for _ in range(3))
    return max(counted - plain, 0.0) / max(calls.calls * repeats, 1)


def _typical(fn: Callable[[], object], amount: float, device: torch.device, runs: int = 5) -> float:
    """``amount`` per second of ``fn``: the median of ``runs`` after a warm-up, not the best (an epoch's ops
    allocate their outputs afresh, and often fault their pages in: the best run would be the rare one without)."""
    return amount / max(statistics.median(throughput.timed_runs(fn, device, runs)), 1e-9)


def _dropout_rate(device: torch.device) -> float:
    """Elements/s of :func:`~gnnscale.nn.ops.keyed_dropout` over ``[CAL_DST, 64]`` features (no gradient)."""
    x = torch.randn(CAL_DST, 64, generator=torch.Generator().manual_seed(4)).to(device)
    ids = torch.arange(CAL_DST, device=device)
    return _typical(lambda: keyed_dropout(x, 0.5, 12345, ids), x.numel(), device)


def _load_rate(device: torch.device) -> float:
    """Bytes/s of a CPU chunk load: half the rows of a 64 MiB table of 64 float32 features, by sorted ids (a
    chunk's deduplicated sources), into a buffer reused from load to load (the engines' row buffers)."""
    gen = torch.Generator().manual_seed(5)
    table = torch.randn(CAL_TABLE // 256, 64, generator=gen)
    ids = torch.sort(torch.randperm(table.shape[0], generator=gen)[: table.shape[0] // 2]).values
    out = torch.empty(ids.numel(), 64)
    return _typical(lambda: torch.index_select(table, 0, ids, out=out), out.numel() * 4, device)


def _dense_rate(device: torch.device) -> float:
    """FLOP/s of a layer's dense product as the engines run it: ``[DENSE_ROWS, 256] @ [256, 64]`` with a bias (a
    tall, narrow product streaming its rows, not a square one that runs from cache)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(DENSE_ROWS, 256, generator=gen).to(device)
    w = torch.randn(64, 256, generator=gen).to(device)
    b = torch.randn(64, generator=gen).to(device)
    return _typical(lambda: torch.nn.functional.linear(x, w, b), 2 * DENSE_ROWS * 256 * 64, device)


def _aggregate_rate(device: torch.device, width: int, table: int = CAL_TABLE) -> float:
    """Edges/s of :func:`~gnnscale.nn.ops.spmm` (the path the engines take: at one thread the library's own CSR
    kernel) at ``width``: :data:`CAL_DST` destinations of :data:`CAL_DEGREE` random in-neighbours each, drawn from
    a source table of ``table`` bytes (:data:`CAL_TABLE`: larger than a last-level cache, as a real graph's rows
    are; the cached calibration: half of :data:`CACHED_BYTES`)."""
    gen = torch.Generator().manual_seed(width)
    n = max(table // (4 * width), 1)
    e = CAL_DST * CAL_DEGREE
    indptr = torch.arange(0, e + 1, CAL_DEGREE, dtype=torch.int64)
    indices = torch.randint(0, n, (e,), generator=gen)
    block = Block(indptr=indptr, indices=indices, num_src=n).to(device)
    x = _table(n * width).view(n, width).to(device)
    out = torch.empty(CAL_DST, width, device=device)
    block.adj()  # built before timing, as an engine builds it once
    return _typical(lambda: spmm(block, x, out), e, device)


_TABLES: list[torch.Tensor] = []


def _table(elements: int) -> torch.Tensor:
    """``elements`` float32 values (one table of :data:`CAL_TABLE` bytes shared by the widths measured)."""
    if not _TABLES or _TABLES[0].numel() < elements:
        _TABLES[:] = [torch.rand(max(elements, CAL_TABLE // 4), generator=torch.Generator().manual_seed(0))]
    return _TABLES[0][:elements]


def disk_rate(folder: Path | None = None) -> float:
    """Bytes/s reading scattered rows of a file not in the page cache, as the disk tier reads them
    (:class:`~gnnscale.store.disk.DiskSource`: sorted, coalesced positional reads): a :data:`DISK_BYTES` ``.npy``
    file written in ``folder`` (the cache folder), synced and dropped from the page cache where the system
    allows (``posix_fadvise``); ``0`` when no file can be written there."""
    folder = folder if folder is not None else cache_file().parent
    rows, width = DISK_BYTES // (4 * DISK_WIDTH), DISK_WIDTH
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".npy", delete=False) as fh:
            np.save(fh, np.ones((rows, width), dtype=np.float32))
            fh.flush()
            os.fsync(fh.fileno())
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        path = Path(fh.name)
    except OSError:
        return 0.0
    try:
        ids = torch.randperm(rows, generator=torch.Generator().manual_seed(1))[: rows // 4]
        source = DiskSource(path)
        t0 = time.perf_counter()
        source.gather(ids)
        seconds = time.perf_counter() - t0
        source.close()
        return len(ids) * width * 4 / max(seconds, 1e-9)
    except (OSError, FeatureSourceError):
        return 0.0
    finally:
        path.unlink(missing_ok=True)
