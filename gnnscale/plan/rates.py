"""This machine's rates, the inputs of every engine's epoch-time model: measured by a short calibration (about a
second), cached per machine with the date and the versions that measured them.

``gnnscale plan --recalibrate`` (and ``train --recalibrate``) measure again. The cache is
``$GNNSCALE_CACHE_DIR/rates.json`` (else ``~/.cache/gnnscale``), keyed by the device's name
(:func:`gnnscale.plan.throughput.cache_file` is beside it).
"""

from __future__ import annotations

import json
import platform
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gnnscale import runtime as rt
from gnnscale.fsutil import atomic_file
from gnnscale.graph.block import Block
from gnnscale.nn.ops import spmm
from gnnscale.plan import throughput
from gnnscale.version import __version__

WIDTHS = (16, 64, 256)
"""Feature widths the sparse aggregation is measured at (other widths are interpolated)."""
CAL_NODES, CAL_DEGREE = 1 << 14, 10


@dataclass(frozen=True)
class Rates:
    """Measured rates of one machine and device (bytes, edges and FLOPs per second)."""

    gather: float
    """Bytes/s of scattered host rows gathered into a buffer (a feature or chunk load's read side)."""
    copy: float
    """Bytes/s from host memory to the device (on a CPU: a copy within host memory)."""
    aggregate: tuple[tuple[int, float], ...]
    """``(width, edges/s)`` of the library's sparse aggregation (:func:`gnnscale.nn.ops.spmm`) on the device."""
    flops: float
    """Dense float32 matrix-multiply FLOP/s on the device."""
    memory: float
    """Bytes/s (read + written) of a streaming elementwise pass on the device."""
    disk: float
    """Bytes/s read from a file not in the page cache (the disk tier's reads)."""
    network: float = 0.0
    """Bytes/s between two processes of this machine (``0``: not measured; a what-if names its own)."""
    latency: float = 0.0
    """Seconds per message between two processes (``0``: not measured)."""
    machine: str = ""
    measured: str = ""
    """When (ISO date and time, UTC)."""
    versions: str = ""
    """``gnnscale X, torch Y, python Z``: a cache entry of other versions is measured again."""

    def aggregate_rate(self, width: int) -> float:
        """Edges/s of a sparse aggregation at ``width`` features (linear between the measured widths in
        seconds per edge and feature, constant per feature beyond them)."""
        ws = [w for w, _ in self.aggregate]
        i = min(max(bisect_left(ws, width), 1), len(ws) - 1)
        (w0, r0), (w1, r1) = self.aggregate[i - 1], self.aggregate[i]
        if width <= w0:
            return r0 * w0 / max(width, 1)
        if width >= w1:
            return r1 * w1 / width
        c0, c1 = 1 / (r0 * w0), 1 / (r1 * w1)  # seconds per edge-feature
        c = c0 + (c1 - c0) * (width - w0) / (w1 - w0)
        return 1 / (c * width)


def versions() -> str:
    return f"gnnscale {__version__}, torch {torch.__version__}, python {platform.python_version()}"


def cache_file() -> Path:
    return throughput.cache_file().parent / "rates.json"


def rates(device: torch.device, *, recalibrate: bool = False) -> Rates:
    """The cached rates of ``device`` (a sim device: the host's), measured (about a second) when missing, of
    other versions, or with ``recalibrate``."""
    dev = rt.torch_device(device)
    key = throughput._name(dev)
    path = cache_file()
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    entry = saved.get(key)
    if not recalibrate and isinstance(entry, dict) and entry.get("versions") == versions():
        try:
            entry["aggregate"] = tuple(tuple(p) for p in entry["aggregate"])
            return Rates(**entry)
        except (TypeError, KeyError, ValueError):
            pass  # an entry of another shape: measure again
    fresh = measure(dev)
    saved[key] = asdict(fresh)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as fh:
            fh.write(json.dumps(saved, indent=1).encode())
    except OSError:
        pass  # an unwritable cache only costs a measurement next time
    return fresh


def measure(device: torch.device) -> Rates:
    """Measure :class:`Rates` on ``device``."""
    tp = throughput.measure([device])
    flops, memory = throughput.measure_compute(device)
    return Rates(gather=tp.hd if not rt.is_accelerator(device) else tp.ru, copy=tp.hd,
                 aggregate=tuple((w, _aggregate_rate(device, w)) for w in WIDTHS), flops=flops, memory=memory,
                 disk=_disk_rate(), machine=throughput._name(device),
                 measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 versions=versions())


def _aggregate_rate(device: torch.device, width: int) -> float:
    """Edges/s of :func:`~gnnscale.nn.ops.spmm` at ``width`` on a random graph of :data:`CAL_NODES` vertices."""
    gen = torch.Generator().manual_seed(width)
    n, e = CAL_NODES, CAL_NODES * CAL_DEGREE
    indptr = torch.arange(0, e + 1, CAL_DEGREE, dtype=torch.int64)
    indices = torch.randint(0, n, (e,), generator=gen)
    block = Block(indptr=indptr, indices=indices, num_src=n).to(device)
    x = torch.randn(n, width, generator=gen).to(device)
    return throughput._rate(lambda: spmm(block, x), e, device)


def _disk_rate() -> float:
    """Bytes/s reading a file not in the page cache (``0``: not measured yet)."""
    return 0.0
