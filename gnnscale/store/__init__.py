"""Vertex data stores: one feature-source protocol with tiers by wrapping (:mod:`gnnscale.store.features`: host, pinned
host, device, memory-mapped file, the disk tier's positional reads, partitioned over ranks, and a cache in front of
any of them), host-memory row I/O for offload engines (gathers to the device, accumulations back), and XGNN's global
GPU+host memory store for mini-batch training (a composition of feature sources for its features)."""

from gnnscale.runtime.pinned import PinnedRegion, pin_in_place, pinned_host  # moved to the runtime; names kept
from gnnscale.store.cache import DeviceCache, SortedIndex
from gnnscale.store.disk import DiskSource, host_cached
from gnnscale.store.features import FeatureIndexError, FeatureSource, FeatureSourceError, ReadStats
from gnnscale.store.gather import (
    GATHER_METHODS,
    HostRowReader,
    default_gather_method,
    gather_rows,
    scatter_add_rows,
    triton_available,
)
from gnnscale.store.global_store import GlobalMemoryStore, StoreReader, StoreStats
from gnnscale.store.partitioned import PartitionedFeatures
from gnnscale.store.sharded import ShardedDeviceSource
from gnnscale.store.sources import DeviceSource, InMemorySource, MmapSource, PinnedHostSource
from gnnscale.store.transfer import PeerLink

__all__ = [
    "GATHER_METHODS",
    "DeviceCache",
    "DeviceSource",
    "DiskSource",
    "FeatureIndexError",
    "FeatureSource",
    "FeatureSourceError",
    "GlobalMemoryStore",
    "HostRowReader",
    "InMemorySource",
    "MmapSource",
    "PartitionedFeatures",
    "PeerLink",
    "PinnedHostSource",
    "PinnedRegion",
    "ReadStats",
    "ShardedDeviceSource",
    "SortedIndex",
    "StoreReader",
    "StoreStats",
    "default_gather_method",
    "gather_rows",
    "host_cached",
    "pin_in_place",
    "pinned_host",
    "scatter_add_rows",
    "triton_available",
]
