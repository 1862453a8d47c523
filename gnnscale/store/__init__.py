"""Vertex data stores: host-memory row I/O for offload engines (gathers to the device, accumulations back) and
XGNN's global GPU+host memory store for mini-batch training."""

from gnnscale.store.gather import (
    GATHER_METHODS,
    default_gather_method,
    gather_rows,
    scatter_add_rows,
    triton_available,
)
from gnnscale.store.global_store import GlobalMemoryStore, StoreReader, StoreStats
from gnnscale.store.pinning import PinnedRegion, pin_in_place, pinned_host

__all__ = [
    "GATHER_METHODS",
    "GlobalMemoryStore",
    "PinnedRegion",
    "StoreReader",
    "StoreStats",
    "default_gather_method",
    "gather_rows",
    "pin_in_place",
    "pinned_host",
    "scatter_add_rows",
    "triton_available",
]
