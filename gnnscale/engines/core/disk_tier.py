"""The disk tier as the engines set it up from ``--host-memory`` (issue #29: one feature source that every engine's
reads go through, no engine with a disk path of its own).

:func:`host_plan` is the planner's split of ``--host-memory`` for a run (:func:`~gnnscale.plan.host.plan_host`:
the fixed parts, the read buffers, the host cache or the activations kept in RAM and those spilled).
:func:`open_disk_tier` decides, from the graph and that plan, whether an engine reads its features from disk: with
``--host-memory`` set and the features a converted directory's memory-mapped ``x.npy``
(:func:`~gnnscale.store.disk.mapped_npy`), one :class:`~gnnscale.store.disk.DiskSource` over that file per reader
(its read buffer the plan's) and the bytes the plan gives a host cache of hot rows in front of it; otherwise
``None`` and a note saying the features stay in host memory. The mini-batch and hybrid engines hand the source to
the global store's host tier (which puts the cache in front), the task-parallel engine reads each subgraph's rows
through it (behind the cache), the distributed engine reads each rank's own rows through it, offload reads each
chunk's rows through one source per worker (no cache: its host memory goes to the activations).
:func:`tier_metrics` is the epoch record's part: ``disk_read_bytes``, ``host_cache_hits``, ``host_cache_misses``
and ``anon_rss_bytes``, the keys every engine writes for the disk tier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gnnscale.graph.graph import Graph
from gnnscale.nn.stack import Stack
from gnnscale.notes import note
from gnnscale.plan.host import HostPlan, plan_host
from gnnscale.runtime.host import proc_kib
from gnnscale.store.disk import DiskSource, mapped_npy
from gnnscale.store.features import ReadStats

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

__all__ = ["DiskTier", "anon_rss_bytes", "host_plan", "open_disk_tier", "tier_metrics"]


@dataclass(eq=False)
class DiskTier:
    """An engine's disk tier: a source over the directory's ``x.npy`` per reader, and the plan that sized them."""

    sources: list[DiskSource]
    plan: HostPlan

    @property
    def source(self) -> DiskSource:
        """The first reader's source (the only one, for every engine but offload)."""
        return self.sources[0]

    @property
    def cache_bytes(self) -> int:
        """Bytes for a host cache of hot rows in front of :attr:`source` (0: none)."""
        return self.plan.cache_bytes

    def close(self) -> None:
        for s in self.sources:
            s.close()


def host_plan(graph: Graph, config: TrainConfig, model: Stack, *, readers: int = 1, activation_bytes: int = 0,
              cache: bool = True, working_bytes: int = 0) -> HostPlan | None:
    """The planner's split of ``--host-memory`` for ``model`` on ``graph`` (:func:`~gnnscale.plan.host.plan_host`:
    ``readers`` disk readers, ``activation_bytes`` of host activation buffers, what is left to a host row cache when
    ``cache``, ``working_bytes`` of batches or chunks in flight); ``None`` without ``--host-memory``. A budget below
    the run's fixed parts raises one ConfigError line."""
    if config.host_memory is None:
        return None
    row = max(graph.num_features, 1) * (graph.x.element_size() if graph.x is not None else 4)
    return plan_host(config.host_memory, num_nodes=graph.num_nodes, row_bytes=row, readers=readers,
                     parameters=sum(p.numel() for p in model.parameters()), activation_bytes=activation_bytes,
                     cache=cache, working_bytes=working_bytes)


def open_disk_tier(graph: Graph, plan: HostPlan | None, engine: str) -> DiskTier | None:
    """The disk tier ``engine`` reads ``graph``'s features through under ``plan`` (:func:`host_plan`), or ``None``:
    no ``--host-memory``, or features that are not a converted directory's memory-mapped ``x.npy`` (then a note
    says they stay in host memory)."""
    if plan is None or graph.x is None:
        return None
    path = mapped_npy(graph.x)
    if path is None:
        note(f"--host-memory: the features of {graph.name} are not the memory-mapped {graph.x.dtype} x.npy of a "
             f"converted directory, so {engine} keeps them in host memory (read from disk: gnnscale convert the "
             "dataset to a directory and train from it)")
        return None
    return DiskTier([DiskSource(path, buffer_bytes=plan.buffer_bytes) for _ in range(plan.readers)], plan)


def anon_rss_bytes() -> int | None:
    """The process's anonymous resident memory (``RssAnon`` of ``/proc/self/status``); ``None`` off Linux."""
    anon = proc_kib("/proc/self/status", "RssAnon")
    return None if anon is None else anon * 1024


def tier_metrics(read: ReadStats, *, disk_tier: str = "disk", cache_tier: str = "host-cache") -> dict[str, Any]:
    """The disk tier's keys of an epoch record from the reads of its chain since the epoch began: bytes read from
    disk, rows served by the host cache and rows it missed (read from disk), and the anonymous resident memory."""
    return {"disk_read_bytes": int(read.bytes[disk_tier]), "host_cache_hits": int(read.rows[cache_tier]),
            "host_cache_misses": int(read.rows[disk_tier]), "anon_rss_bytes": anon_rss_bytes()}
