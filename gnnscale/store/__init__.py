"""Host-memory vertex store I/O for offload engines: row gathers to the compute device and accumulations back."""

from gnnscale.store.gather import (
    GATHER_METHODS,
    default_gather_method,
    gather_rows,
    scatter_add_rows,
    triton_available,
)

__all__ = [
    "GATHER_METHODS",
    "default_gather_method",
    "gather_rows",
    "scatter_add_rows",
    "triton_available",
]
