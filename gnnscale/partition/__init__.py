"""Two-level edge-cut partitioning (HongTu §4.1): partitions, then destination chunks balanced by in-edges."""

from gnnscale.partition.plan import (
    CHUNKERS,
    PARTITION_METHODS,
    PartitionPlan,
    chunk_halo,
    default_plan_dir,
    graph_fingerprint,
    load_or_chunk,
    load_or_partition,
    partition_graph,
    permute_csr,
)

__all__ = [
    "CHUNKERS",
    "PARTITION_METHODS",
    "PartitionPlan",
    "chunk_halo",
    "default_plan_dir",
    "graph_fingerprint",
    "load_or_chunk",
    "load_or_partition",
    "partition_graph",
    "permute_csr",
]
