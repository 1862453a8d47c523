"""Vertex data stores: host-memory row I/O for offload engines (gathers to the device, accumulations back) and
XGNN's global GPU+host memory store for mini-batch training."""

from gnnscale.store.gather import (
    GATHER_METHODS,
    default_gather_method,
    gather_rows,
    scatter_add_rows,
    triton_available,
)
from gnnscale.store.global_store import GlobalMemoryStore, StoreStats

__all__ = [
    "GATHER_METHODS",
    "GlobalMemoryStore",
    "StoreStats",
    "default_gather_method",
    "gather_rows",
    "scatter_add_rows",
    "triton_available",
]
