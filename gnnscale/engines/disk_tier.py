"""The disk tier as the engines set it up from ``--host-memory`` (issue #29: one feature source that every engine's
reads go through, no engine with a disk path of its own).

:func:`open_disk_tier` decides, from the graph and the config, whether an engine reads its features from disk: with
``--host-memory`` set and the features a converted directory's memory-mapped ``x.npy``
(:func:`~gnnscale.store.disk.mapped_npy`), a :class:`~gnnscale.store.disk.DiskSource` over that file (its read
buffer an eighth of the budget, at most :data:`~gnnscale.store.disk.BUFFER_BYTES`) and the bytes a host cache of hot
rows in front of it may take (:data:`HOST_CACHE_SHARE` of the budget, less the buffer); otherwise ``None`` and a note
saying the features stay in host memory. The mini-batch and hybrid engines hand the source to the global store's host
tier (which puts the cache in front), the task-parallel engine reads each subgraph's rows through it (behind the
cache), the distributed engine reads each rank's own rows through it. :func:`tier_metrics` is the epoch record's
part: ``disk_read_bytes``, ``host_cache_hits``, ``host_cache_misses`` and ``anon_rss_bytes``, the keys every engine
writes for the disk tier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gnnscale.graph.graph import Graph
from gnnscale.notes import note
from gnnscale.runtime.host import proc_kib
from gnnscale.store.disk import BUFFER_BYTES, DiskSource, mapped_npy
from gnnscale.store.features import ReadStats

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

__all__ = ["BUFFER_SHARE", "HOST_CACHE_SHARE", "DiskTier", "anon_rss_bytes", "open_disk_tier", "tier_metrics"]

HOST_CACHE_SHARE = 0.5
"""Share of ``--host-memory`` the disk tier's host cache and read buffer may fill (the rest: a batch's or a chunk's
rows and activations)."""
BUFFER_SHARE = 8
"""The read buffer takes ``1 / BUFFER_SHARE`` of ``--host-memory`` (at most
:data:`~gnnscale.store.disk.BUFFER_BYTES`)."""


@dataclass(eq=False)
class DiskTier:
    """An engine's disk tier: the source over the directory's ``x.npy`` and the bytes its host cache may take."""

    source: DiskSource
    cache_bytes: int
    """Bytes for a host cache of hot rows in front of :attr:`source` (0: none)."""

    def close(self) -> None:
        self.source.close()


def open_disk_tier(graph: Graph, config: TrainConfig, engine: str) -> DiskTier | None:
    """The disk tier ``engine`` reads ``graph``'s features through under ``config.host_memory``, or ``None``: no
    ``--host-memory``, or features that are not a converted directory's memory-mapped ``x.npy`` (then a note says
    they stay in host memory)."""
    budget = config.host_memory
    if budget is None or graph.x is None:
        return None
    path = mapped_npy(graph.x)
    if path is None:
        note(f"--host-memory: the features of {graph.name} are not the memory-mapped {graph.x.dtype} x.npy of a "
             f"converted directory, so {engine} keeps them in host memory (read from disk: gnnscale convert the "
             "dataset to a float32 directory and train from it)")
        return None
    source = DiskSource(path, buffer_bytes=min(BUFFER_BYTES, budget // BUFFER_SHARE))
    return DiskTier(source, max(0, int(HOST_CACHE_SHARE * budget) - source.buffer_bytes))


def anon_rss_bytes() -> int | None:
    """The process's anonymous resident memory (``RssAnon`` of ``/proc/self/status``); ``None`` off Linux."""
    anon = proc_kib("/proc/self/status", "RssAnon")
    return None if anon is None else anon * 1024


def tier_metrics(read: ReadStats, *, disk_tier: str = "disk", cache_tier: str = "host-cache") -> dict[str, Any]:
    """The disk tier's keys of an epoch record from the reads of its chain since the epoch began: bytes read from
    disk, rows served by the host cache and rows it missed (read from disk), and the anonymous resident memory."""
    return {"disk_read_bytes": int(read.bytes[disk_tier]), "host_cache_hits": int(read.rows[cache_tier]),
            "host_cache_misses": int(read.rows[disk_tier]), "anon_rss_bytes": anon_rss_bytes()}
