"""CSR helpers of the graph layer: COO edges sorted into an in-neighbour CSR, the row of each CSR entry, and the
entries of a set of rows, all vectorised (no loop per row or edge)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["coo_to_csr", "csr_rows", "csr_slices", "rank_in_run"]


def csr_slices(indptr: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """``(out_ptr, positions)``: the local row pointers of the concatenated CSR rows ``rows`` and the edge positions
    (into ``indices``) that make them up, vectorised (no loop per row)."""
    start, end = indptr[rows], indptr[rows + 1]
    deg = end - start
    out_ptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(deg, 0, out=out_ptr[1:])
    total = int(out_ptr[-1])
    offset = torch.arange(total, device=rows.device) - torch.repeat_interleave(out_ptr[:-1], deg, output_size=total)
    return out_ptr, torch.repeat_interleave(start, deg, output_size=total) + offset


def csr_rows(indptr: Tensor, nnz: int | None = None) -> Tensor:
    """``[nnz]`` row of each CSR entry (int64). Pass ``nnz`` when known: reading it from ``indptr`` on a device
    waits for the device."""
    counts = indptr[1:] - indptr[:-1]
    return torch.repeat_interleave(torch.arange(counts.numel(), device=indptr.device), counts,
                                   output_size=int(indptr[-1]) if nnz is None else nnz)


def rank_in_run(key: Tensor) -> Tensor:
    """``[E]`` for sorted ``key``: how many equal keys precede each entry (0 for the first copy of an edge)."""
    pos = torch.arange(key.numel())
    start = torch.ones(key.numel(), dtype=torch.bool)
    start[1:] = key[1:] != key[:-1]
    return pos - torch.cummax(torch.where(start, pos, 0), 0).values


def coo_to_csr(
    src: Tensor,
    dst: Tensor,
    num_nodes: int,
    weight: Tensor | None,
    coalesce: bool,
    reduce: str = "sum",
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Sort COO edges by (destination, source) into in-neighbour CSR; optionally merge duplicates."""
    key = dst * num_nodes + src
    if weight is None:  # only the sorted keys are needed: NumPy's in-place sort is several times faster
        key.numpy().sort()
    else:
        key, perm = torch.sort(key, stable=True)
        weight = weight[perm]
        del perm  # large graphs: free what is no longer needed before the next [E] temporaries
    if coalesce and key.numel() and weight is None:
        key = torch.unique_consecutive(key)
    elif coalesce and key.numel():
        assert weight is not None
        key, inverse = torch.unique_consecutive(key, return_inverse=True)
        merged = torch.zeros(key.numel(), dtype=weight.dtype)
        if reduce == "sum":
            merged.index_add_(0, inverse, weight)
        else:
            merged = merged.fill_(-float("inf")).scatter_reduce(0, inverse, weight, reduce="amax")
        weight = merged
    dst_sorted = torch.div(key, num_nodes, rounding_mode="floor")
    indices = key - dst_sorted * num_nodes
    counts = torch.bincount(dst_sorted, minlength=num_nodes)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    return indptr, indices, weight
