"""Request counters of XGNN's global memory store (:class:`StoreStats`), per reader or summed over readers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

__all__ = ["StoreStats"]


@dataclass
class StoreStats:
    """Request counters of one reader (or summed over readers) since the last reset.

    ``*_from`` map a source -- a device index, or :data:`~gnnscale.store.placement.HOST` (-1) for host memory --
    to what was read from it: feature rows, neighbour lists (degree lookups) and neighbour entries.
    """

    graph_requests: int = 0
    """Vertices whose neighbour lists were looked up."""
    graph_hits: int = 0
    """Of those, lists held on a device (the reader's own or a linked one)."""
    fetched_neighbor_entries: int = 0
    """Neighbour entries read, every source together (the sampler reads only the entries it keeps)."""
    feature_requests: int = 0
    feature_hits: int = 0
    h2d_feature_bytes: int = 0
    """Feature bytes read from host memory."""
    h2d_topology_bytes: int = 0
    """Topology bytes read from host memory: two row pointers per list, then the entries (and weights)."""
    d2d_bytes: int = 0
    """Bytes read from another device: feature rows, row pointers, entries."""
    remote_requests: int = 0
    """Reads sent to another device (one per holder per request)."""
    host_cache_hits: int = 0
    """Feature rows served by the disk tier's host cache (tier ``"host-cache"``)."""
    disk_rows: int = 0
    """Feature rows read from disk (tier ``"disk"``: the host cache's misses, each distinct row once per read)."""
    disk_read_bytes: int = 0
    """Bytes of those rows."""
    staging_allocs: int = 0
    """Pinned staging buffers allocated (the CPU-gather path on CUDA; reused, so this stays small)."""
    rows_from: Counter[int] = field(default_factory=Counter)
    lists_from: Counter[int] = field(default_factory=Counter)
    entries_from: Counter[int] = field(default_factory=Counter)

    @property
    def h2d_bytes(self) -> int:
        return self.h2d_feature_bytes + self.h2d_topology_bytes

    def hit_rates(self) -> dict[str, float]:
        return {"graph_hit_rate": self.graph_hits / max(self.graph_requests, 1),
                "feature_hit_rate": self.feature_hits / max(self.feature_requests, 1)}

    def __add__(self, other: StoreStats) -> StoreStats:
        return StoreStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def disk_metrics(self) -> dict[str, float]:
        """The disk tier's counters (a record carries them when the store reads its features from disk)."""
        return {"disk_read_bytes": self.disk_read_bytes, "host_cache_hits": self.host_cache_hits,
                "host_cache_misses": self.disk_rows}

    def metrics(self) -> dict[str, float]:
        """The counters a training record carries."""
        return {"fetched_neighbor_entries": self.fetched_neighbor_entries, "h2d_bytes": self.h2d_bytes,
                "h2d_row_bytes": self.h2d_feature_bytes, "h2d_topology_bytes": self.h2d_topology_bytes,
                "d2d_bytes": self.d2d_bytes, **self.hit_rates()}
